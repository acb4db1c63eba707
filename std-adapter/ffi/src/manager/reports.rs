//! The manager's C functions that report what it did: its events, its stats payloads and its
//! counters.

#![allow(
    clippy::too_many_arguments,
    reason = "C functions take arrays with their lengths"
)]

use core::ffi::c_int;

use kvtier_core::stats::wire;

use super::too_small;
use crate::handle::{kvtier_manager, with_state};
use crate::ptr::{OutBuf, OutRef};
use crate::status::{Status, fail};
use crate::types::{event_kind_code, kvtier_event, kvtier_key, kvtier_manager_info};

/// Drains the queued events, oldest first: `*events_len` events to `events`, their keys to
/// `keys` (`*keys_len` in all; event `i` owns `keys[events[i].first_key ..][.. num_keys]`). With
/// events disabled nothing is written and both lengths are 0.
///
/// When either buffer is too short: `KVTIER_BUFFER_TOO_SMALL` with the needed lengths in
/// `*events_len` and `*keys_len`; the drained events are kept and delivered first by the next
/// call (events queued meanwhile follow in the call after). They never take more than the
/// configured `max_event_keys`.
///
/// Ownership: both buffers are the caller's, written during the call only. Thread safety: not
/// thread-safe per handle (`KVTIER_BUSY`); distinct handles are independent.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvtier_drain_events(
    manager: *mut kvtier_manager,
    events: *mut kvtier_event,
    events_cap: usize,
    events_len: *mut usize,
    keys: *mut kvtier_key,
    keys_cap: usize,
    keys_len: *mut usize,
) -> c_int {
    with_state(manager, |st| {
        // SAFETY: the caller passes room for `events_cap` events (checked).
        let mut out_events = unsafe { OutBuf::new(events, events_cap, "events") }?;
        // SAFETY: the caller passes a pointer valid for one write (checked).
        let mut out_events_len = unsafe { OutRef::new(events_len, "events_len") }?;
        // SAFETY: the caller passes room for `keys_cap` keys (checked).
        let mut out_keys = unsafe { OutBuf::new(keys, keys_cap, "keys") }?;
        // SAFETY: the caller passes a pointer valid for one write (checked).
        let mut out_keys_len = unsafe { OutRef::new(keys_len, "keys_len") }?;
        if st.events.is_empty() {
            let (events, event_keys) = (&mut st.events, &mut st.event_keys);
            event_keys.clear();
            st.manager.drain_events(|e| {
                events.push(kvtier_event {
                    kind: event_kind_code(e.kind),
                    first_key: event_keys.len(),
                    num_keys: e.keys.len(),
                });
                event_keys.extend_from_slice(e.keys);
            });
        }
        let (n_events, n_keys) = (st.events.len(), st.event_keys.len());
        if !out_events.fits(n_events) || !out_keys.fits(n_keys) {
            out_events_len.set(n_events);
            out_keys_len.set(n_keys);
            return Err(fail(
                Status::KVTIER_BUFFER_TOO_SMALL,
                format_args!(
                    "{n_events} events with {n_keys} keys are pending; the buffers hold \
                     {events_cap} events and {keys_cap} keys (the events are kept)"
                ),
            ));
        }
        out_events.write(&st.events);
        out_keys.write(&st.event_keys);
        out_events_len.set(n_events);
        out_keys_len.set(n_keys);
        st.events.clear();
        st.event_keys.clear();
        Ok(())
    })
}

/// Writes the number of events, and of their keys, dropped because the event queue was full.
///
/// Ownership: both outputs are the caller's, only written. Thread safety: not thread-safe per
/// handle (`KVTIER_BUSY`); distinct handles are independent.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvtier_events_dropped(
    manager: *const kvtier_manager,
    events: *mut u64,
    keys: *mut u64,
) -> c_int {
    with_state(manager, |st| {
        // SAFETY: the caller passes pointers valid for one write each (checked).
        let (mut e, mut k) =
            unsafe { (OutRef::new(events, "events")?, OutRef::new(keys, "keys")?) };
        let (de, dk) = st.manager.events_dropped();
        e.set(de);
        k.set(dk);
        Ok(())
    })
}

/// Takes the stats collected since the last successful call (vLLM's `get_stats`, once per
/// scheduler step) as the canonical `kvtier_core::stats::wire` encoding of what vLLM's
/// scheduler reports for a step: `*len` bytes written to `buf`. The usage gauges are the
/// current ones; the allocation-size histogram, `stores_skipped` and the allocation failures
/// (`KVTIER_NO_ROOM` results) cover everything since the last successful call; the first take
/// also carries the tier's `config_info`.
///
/// When `cap` is too short: `KVTIER_BUFFER_TOO_SMALL` with the needed length in `*len`; the
/// taken stats are kept and returned, with anything collected meanwhile, by the next call.
/// `kvtier_stats_max_len()` bytes are always enough.
///
/// Ownership: `buf` is the caller's, written during the call only. Thread safety: not
/// thread-safe per handle (`KVTIER_BUSY`); distinct handles are independent.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvtier_take_stats(
    manager: *mut kvtier_manager,
    buf: *mut u8,
    cap: usize,
    len: *mut usize,
) -> c_int {
    with_state(manager, |st| {
        // SAFETY: the caller passes room for `cap` bytes (checked).
        let mut out = unsafe { OutBuf::new(buf, cap, "buf") }?;
        // SAFETY: the caller passes a pointer valid for one write (checked).
        let mut out_len = unsafe { OutRef::new(len, "len") }?;
        let fresh = st.manager.take_stats().to_step_payload();
        let pending = match &mut st.stats {
            Some(p) => {
                // Two drains of one manager share every family's kind and bounds.
                p.aggregate(&fresh)
                    .map_err(|e| fail(Status::KVTIER_INTERNAL, format_args!("take_stats: {e}")))?;
                p
            }
            None => st.stats.insert(fresh),
        };
        let needed = wire::encoded_len(pending);
        if !out.fits(needed) {
            out_len.set(needed);
            return Err(too_small("buf", needed, cap));
        }
        st.wire.clear();
        st.wire.resize(needed, 0);
        let n = wire::encode(pending, &mut st.wire)
            .map_err(|e| fail(Status::KVTIER_INTERNAL, format_args!("take_stats: {e}")))?;
        out.write(&st.wire[..n]);
        out_len.set(n);
        st.stats = None;
        Ok(())
    })
}

/// The most bytes `kvtier_take_stats` can need (`kvtier_core::stats::wire::MAX_ENCODED_LEN`).
///
/// Thread safety: a constant; callable from any thread.
#[unsafe(no_mangle)]
pub extern "C" fn kvtier_stats_max_len() -> usize {
    wire::MAX_ENCODED_LEN
}
/// Writes the manager's counters to `*info`.
///
/// Ownership: `info` is the caller's, only written. Thread safety: not thread-safe per handle
/// (`KVTIER_BUSY`); distinct handles are independent.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvtier_inspect(
    manager: *const kvtier_manager,
    info: *mut kvtier_manager_info,
) -> c_int {
    with_state(manager, |st| {
        // SAFETY: the caller passes a pointer valid for one write (checked).
        let mut out = unsafe { OutRef::new(info, "info") }?;
        let i = st.manager.inspect();
        out.set(kvtier_manager_info {
            num_chunks: i.capacity(),
            allocated: i.allocated(),
            free_chunks: i.free_chunks(),
            evictable: i.evictable(),
            write_pending: i.write_pending(),
            live_requests: u32::try_from(st.manager.live_requests()).unwrap_or(u32::MAX),
            heap_bytes: u64::try_from(i.heap_bytes()).unwrap_or(u64::MAX),
        });
        Ok(())
    })
}
