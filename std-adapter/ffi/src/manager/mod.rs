//! The manager's C functions: the one place that calls `kvtier_core::manager`.
//!
//! The common rules (also in the header):
//! - Every function returns a status `int` (`KVTIER_OK` = 0). A call that returns another
//!   status changed nothing, except `KVTIER_NO_ROOM` (see `kvtier_prepare_store`).
//! - Array arguments come with their lengths; an array may be NULL only when its length is 0.
//!   Output arrays are the caller's, of the capacity given; when one is too short the call
//!   returns `KVTIER_BUFFER_TOO_SMALL`, writes the needed length to its length argument and
//!   changes nothing else.
//! - The library never keeps a pointer passed in beyond the call.
//! - Thread safety: a handle is not for concurrent use. A call made while another call on the
//!   same handle runs on another thread returns `KVTIER_BUSY` and does nothing (no data race).
//!   Distinct handles are independent and may be used from different threads at once.
#![allow(
    clippy::missing_safety_doc,
    reason = "every function shares the safety contract stated in the module docs and the header"
)]
#![allow(
    clippy::too_many_arguments,
    reason = "C functions take arrays with their lengths"
)]

use core::ffi::c_int;

use kvtier_core::manager::{
    CompleteLoadError, LoadError, RequestError, RequestId, StoreError, StoreOutcome,
};

mod reports;
pub(crate) mod state;

pub use reports::{
    kvtier_drain_events, kvtier_events_dropped, kvtier_inspect, kvtier_stats_max_len,
    kvtier_take_stats,
};

use self::state::State;
use crate::handle::{self, kvtier_manager, with_state};
use crate::ptr::{OutBuf, OutRef, input, input_ref, optional_input};
use crate::status::{Status, fail};
use crate::types::{
    KVTIER_STORE_FAILED, KVTIER_STORE_SUCCEEDED, kvtier_config, kvtier_key, lookup_code,
};

fn request_status(e: RequestError) -> Status {
    let status = match e {
        RequestError::Unknown(_) => Status::KVTIER_UNKNOWN_REQUEST,
        RequestError::TooManyRequests { .. } => Status::KVTIER_TOO_MANY_REQUESTS,
        _ => Status::KVTIER_INVALID_ARGUMENT,
    };
    fail(status, e)
}

fn load_status(e: LoadError) -> Status {
    let status = match e {
        LoadError::Request(r) => return request_status(r),
        LoadError::NotPresent { .. } => Status::KVTIER_NOT_PRESENT,
        LoadError::NotReady { .. } => Status::KVTIER_NOT_READY,
        LoadError::TooManyPins { .. } => Status::KVTIER_TOO_MANY_PINS,
        LoadError::Positions(_) => Status::KVTIER_BAD_POSITION,
        _ => Status::KVTIER_INVALID_ARGUMENT,
    };
    fail(status, e)
}

fn complete_load_status(e: CompleteLoadError) -> Status {
    let status = match e {
        CompleteLoadError::NotPresent { .. } => Status::KVTIER_NOT_PRESENT,
        CompleteLoadError::NotPinned { .. } => Status::KVTIER_NOT_PINNED,
        _ => Status::KVTIER_INVALID_ARGUMENT,
    };
    fail(status, e)
}

fn store_status(e: StoreError) -> Status {
    let status = match e {
        StoreError::Request(r) => return request_status(r),
        StoreError::DuplicateKey { .. } => Status::KVTIER_DUPLICATE_KEY,
        StoreError::Positions(_) => Status::KVTIER_BAD_POSITION,
        StoreError::NoRoom { .. } => Status::KVTIER_NO_ROOM,
        StoreError::OutOfMemory => Status::KVTIER_OUT_OF_MEMORY,
        _ => Status::KVTIER_INVALID_ARGUMENT,
    };
    fail(status, e)
}

pub(super) fn too_small(what: &str, needed: usize, cap: usize) -> Status {
    fail(
        Status::KVTIER_BUFFER_TOO_SMALL,
        format_args!("{what} needs room for {needed} but its capacity is {cap}"),
    )
}

/// Fills `*cfg` with vLLM's defaults for a tier of `num_chunks` slots: LRU, no store
/// threshold, a reuse tracker of 64,000 keys, events off (65,536 event keys when on), 4,096
/// requests in flight, hash seed 0.
///
/// Ownership: `cfg` is the caller's; it is only written. Thread safety: touches no shared
/// state; callable from any thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvtier_config_init(cfg: *mut kvtier_config, num_chunks: u32) -> c_int {
    handle::call(|| {
        // SAFETY: the caller passes a pointer valid for one write (checked for NULL and
        // alignment by `OutRef::new`).
        let mut out = unsafe { OutRef::new(cfg, "cfg") }?;
        out.set(kvtier_config::defaults(num_chunks));
        Ok(())
    })
}

/// Builds a manager from `*cfg` (all of its memory is allocated here) and writes its handle to
/// `*out`. On failure `*out` is not written.
///
/// Ownership: `cfg` is read during the call only. The new handle belongs to the caller, who
/// must release it with `kvtier_manager_free` exactly once. Thread safety: callable from any
/// thread; the new handle is independent of every other.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvtier_manager_new(
    cfg: *const kvtier_config,
    out: *mut *mut kvtier_manager,
) -> c_int {
    handle::call(|| {
        // SAFETY: the caller passes a readable config (checked for NULL and alignment).
        let cfg = unsafe { input_ref(cfg, "cfg") }?;
        // SAFETY: the caller passes a pointer valid for one write (checked).
        let mut out = unsafe { OutRef::new(out, "out") }?;
        let state = State::new(cfg)?;
        out.set(handle::register(state));
        Ok(())
    })
}

/// Destroys a manager and frees its memory. The handle is invalid afterwards: passing it to
/// any function returns `KVTIER_INVALID_HANDLE` (the library keeps the set of live handles and
/// never dereferences a pointer outside it), unless a later `kvtier_manager_new` happened to
/// return the same address, in which case it names that new manager. `NULL` returns
/// `KVTIER_NULL_POINTER`.
///
/// Ownership: takes the handle back from the caller. Thread safety: returns `KVTIER_BUSY`
/// (and destroys nothing) while another thread is inside a call on the same handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvtier_manager_free(manager: *mut kvtier_manager) -> c_int {
    handle::call(|| handle::destroy(manager))
}

/// Starts a request's state and writes its id to `*request` (vLLM's `on_new_request`). The id
/// goes stale when the request finishes or is dropped; a stale id is `KVTIER_UNKNOWN_REQUEST`,
/// never another request.
///
/// Errors: `KVTIER_TOO_MANY_REQUESTS` when `max_requests` are live. Ownership: `request` is the
/// caller's, only written. Thread safety: not thread-safe per handle (`KVTIER_BUSY`); distinct
/// handles are independent.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvtier_request_begin(
    manager: *mut kvtier_manager,
    request: *mut u64,
) -> c_int {
    with_state(manager, |st| {
        // SAFETY: the caller passes a pointer valid for one write (checked).
        let mut out = unsafe { OutRef::new(request, "request") }?;
        let id = st.manager.on_new_request().map_err(request_status)?;
        out.set(id.to_u64());
        Ok(())
    })
}

/// Ends a request: its keys commit their recency to the policy (vLLM's
/// `on_request_finished`). The id goes stale.
///
/// Errors: `KVTIER_UNKNOWN_REQUEST`. Thread safety: not thread-safe per handle
/// (`KVTIER_BUSY`); distinct handles are independent.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvtier_request_finish(
    manager: *mut kvtier_manager,
    request: u64,
) -> c_int {
    with_state(manager, |st| {
        st.manager
            .on_request_finished(RequestId::from_u64(request))
            .map_err(request_status)
    })
}

/// Forgets a request without committing its recency (an aborted request). The id goes stale.
///
/// Errors: `KVTIER_UNKNOWN_REQUEST`. Thread safety: not thread-safe per handle
/// (`KVTIER_BUSY`); distinct handles are independent.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvtier_request_drop(manager: *mut kvtier_manager, request: u64) -> c_int {
    with_state(manager, |st| {
        st.manager
            .drop_request(RequestId::from_u64(request))
            .map_err(request_status)
    })
}

/// Writes to `*result` whether `*key` is in the tier: `KVTIER_LOOKUP_MISS`,
/// `KVTIER_LOOKUP_HIT_PENDING` (its store has not completed) or `KVTIER_LOOKUP_HIT`. Changes
/// nothing in the manager (no recency, no reuse count).
///
/// Ownership: `key` is read, `result` written, during the call only. Thread safety: not
/// thread-safe per handle (`KVTIER_BUSY`); distinct handles are independent.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvtier_lookup(
    manager: *const kvtier_manager,
    key: *const kvtier_key,
    result: *mut u32,
) -> c_int {
    with_state(manager, |st| {
        // SAFETY: the caller passes a readable key (checked for NULL and alignment).
        let key = unsafe { input_ref(key, "key") }?;
        // SAFETY: the caller passes a pointer valid for one write (checked).
        let mut out = unsafe { OutRef::new(result, "result") }?;
        out.set(lookup_code(st.manager.lookup(key)));
        Ok(())
    })
}

/// Pins `keys[0..n_keys]` for reading and writes their slots, in key order, to
/// `slots[0..n_keys]`; `*slots_len` receives `n_keys`. `end_tokens` (NULL, or `n_keys`
/// end-token positions of the keys in the request) orders the request's keys for LRU.
///
/// Errors: `KVTIER_BUFFER_TOO_SMALL` when `slots_cap < n_keys` (`*slots_len` = `n_keys`);
/// `KVTIER_UNKNOWN_REQUEST`; `KVTIER_NOT_PRESENT` or `KVTIER_NOT_READY` for a key that is
/// absent or still being stored (vLLM asserts); `KVTIER_TOO_MANY_PINS`; `KVTIER_BAD_POSITION`.
/// `kvtier_last_error` names the key's index. Ownership: every array is the caller's, used
/// during the call only. Thread safety: not thread-safe per handle (`KVTIER_BUSY`); distinct
/// handles are independent.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvtier_prepare_load(
    manager: *mut kvtier_manager,
    request: u64,
    keys: *const kvtier_key,
    n_keys: usize,
    end_tokens: *const u64,
    slots: *mut u32,
    slots_cap: usize,
    slots_len: *mut usize,
) -> c_int {
    with_state(manager, |st| {
        // SAFETY: the caller passes `n_keys` readable keys (NULL, alignment, size checked).
        let keys = unsafe { input(keys, n_keys, "keys", "n_keys") }?;
        // SAFETY: NULL or `n_keys` readable positions (checked).
        let ends = unsafe { optional_input(end_tokens, n_keys, "end_tokens", "n_keys") }?;
        // SAFETY: the caller passes room for `slots_cap` slots (checked).
        let mut out = unsafe { OutBuf::new(slots, slots_cap, "slots") }?;
        // SAFETY: the caller passes a pointer valid for one write (checked).
        let mut len = unsafe { OutRef::new(slots_len, "slots_len") }?;
        if !out.fits(keys.len()) {
            len.set(keys.len());
            return Err(too_small("slots", keys.len(), slots_cap));
        }
        let got = st
            .manager
            .prepare_load(RequestId::from_u64(request), keys, ends)
            .map_err(load_status)?;
        out.write(got);
        len.set(got.len());
        Ok(())
    })
}

/// Looks `keys[0..n_keys]` up in order while they are readable (HITs) and pins that prefix for
/// loading, in one call, so that no eviction can fall between a HIT and its pin: `*hits` leading
/// keys are pinned, their slots written to `slots[0..*hits]`, and `*stopped_at_pending` is 1
/// when the scan stopped at a key whose store is pending (else 0). With no hit nothing is
/// pinned. `end_tokens`: NULL, or `n_keys` end-token positions (the pinned prefix uses its
/// part). Complete the loads with `kvtier_complete_load(keys, *hits)`.
///
/// Errors: `KVTIER_BUFFER_TOO_SMALL` when `slots_cap < n_keys` (the most that can hit;
/// `*hits` = `n_keys`); `KVTIER_UNKNOWN_REQUEST`; `KVTIER_TOO_MANY_PINS`;
/// `KVTIER_BAD_POSITION`. Ownership: every array is the caller's, used during the call only.
/// Thread safety: not thread-safe per handle (`KVTIER_BUSY`); distinct handles are
/// independent.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvtier_pin_hit_prefix(
    manager: *mut kvtier_manager,
    request: u64,
    keys: *const kvtier_key,
    n_keys: usize,
    end_tokens: *const u64,
    slots: *mut u32,
    slots_cap: usize,
    hits: *mut usize,
    stopped_at_pending: *mut u32,
) -> c_int {
    with_state(manager, |st| {
        // SAFETY: the caller passes `n_keys` readable keys (checked).
        let keys = unsafe { input(keys, n_keys, "keys", "n_keys") }?;
        // SAFETY: NULL or `n_keys` readable positions (checked).
        let ends = unsafe { optional_input(end_tokens, n_keys, "end_tokens", "n_keys") }?;
        // SAFETY: the caller passes room for `slots_cap` slots (checked).
        let mut out = unsafe { OutBuf::new(slots, slots_cap, "slots") }?;
        // SAFETY: the caller passes a pointer valid for one write (checked).
        let mut out_hits = unsafe { OutRef::new(hits, "hits") }?;
        // SAFETY: the caller passes a pointer valid for one write (checked).
        let mut out_pending = unsafe { OutRef::new(stopped_at_pending, "stopped_at_pending") }?;
        if !out.fits(keys.len()) {
            out_hits.set(keys.len());
            return Err(too_small("slots", keys.len(), slots_cap));
        }
        let found = st
            .manager
            .pin_hit_prefix(RequestId::from_u64(request), keys, ends)
            .map_err(load_status)?;
        out.write(found.slots);
        out_hits.set(found.hits);
        out_pending.set(u32::from(found.stopped_at_pending));
        Ok(())
    })
}

/// Undoes one pin per key of `keys[0..n_keys]`; a chunk whose last load completes becomes
/// evictable.
///
/// Errors: `KVTIER_NOT_PRESENT` or `KVTIER_NOT_PINNED` (counting repeats within the call).
/// Ownership: `keys` is read during the call only. Thread safety: not thread-safe per handle
/// (`KVTIER_BUSY`); distinct handles are independent.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvtier_complete_load(
    manager: *mut kvtier_manager,
    keys: *const kvtier_key,
    n_keys: usize,
) -> c_int {
    with_state(manager, |st| {
        // SAFETY: the caller passes `n_keys` readable keys (checked).
        let keys = unsafe { input(keys, n_keys, "keys", "n_keys") }?;
        st.manager.complete_load(keys).map_err(complete_load_status)
    })
}

/// Marks `keys[0..n_keys]` recently used (the first ends up the most recent). Absent keys are
/// ignored by LRU and feed ARC's ghost adaptation.
///
/// Ownership: `keys` is read during the call only. Thread safety: not thread-safe per handle
/// (`KVTIER_BUSY`); distinct handles are independent.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvtier_touch(
    manager: *mut kvtier_manager,
    keys: *const kvtier_key,
    n_keys: usize,
) -> c_int {
    with_state(manager, |st| {
        // SAFETY: the caller passes `n_keys` readable keys (checked).
        let keys = unsafe { input(keys, n_keys, "keys", "n_keys") }?;
        st.manager.touch(keys);
        Ok(())
    })
}

/// Decides which of the offered `keys[0..n_keys]` to store, evicting idle chunks if needed
/// (vLLM's `prepare_store`). Writes the keys to store (absent keys that passed the reuse
/// filter, in offer order) to `store_keys`, their slots to `store_slots` (`*store_len` of
/// each), and the evicted keys in victim order to `evicted` (`*evicted_len`). The new chunks
/// are pending until `kvtier_complete_store`. Every offered key is protected from eviction by
/// this call. `end_tokens`: NULL, or `n_keys` end-token positions.
///
/// Both output lists hold at most `n_keys` entries, so `store_cap` (the capacity of
/// `store_keys` and of `store_slots`) and `evicted_cap` must each be at least `n_keys`;
/// otherwise `KVTIER_BUFFER_TOO_SMALL` with `n_keys` written to `*store_len` and
/// `*evicted_len`.
///
/// `KVTIER_NO_ROOM`: the needed evictions cannot be satisfied; nothing is stored or evicted,
/// but, as in vLLM, the offer was counted by the reuse filter and sampled in the
/// allocation-size histogram. Other errors (nothing changes): `KVTIER_UNKNOWN_REQUEST`,
/// `KVTIER_DUPLICATE_KEY` (vLLM would leak a slot), `KVTIER_BAD_POSITION`. Ownership: every
/// array is the caller's, used during the call only. Thread safety: not thread-safe per handle
/// (`KVTIER_BUSY`); distinct handles are independent.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvtier_prepare_store(
    manager: *mut kvtier_manager,
    request: u64,
    keys: *const kvtier_key,
    n_keys: usize,
    end_tokens: *const u64,
    store_keys: *mut kvtier_key,
    store_slots: *mut u32,
    store_cap: usize,
    store_len: *mut usize,
    evicted: *mut kvtier_key,
    evicted_cap: usize,
    evicted_len: *mut usize,
) -> c_int {
    with_state(manager, |st| {
        // SAFETY: the caller passes `n_keys` readable keys (checked).
        let keys = unsafe { input(keys, n_keys, "keys", "n_keys") }?;
        // SAFETY: NULL or `n_keys` readable positions (checked).
        let ends = unsafe { optional_input(end_tokens, n_keys, "end_tokens", "n_keys") }?;
        // SAFETY: the caller passes room for `store_cap` keys (checked).
        let mut out_keys = unsafe { OutBuf::new(store_keys, store_cap, "store_keys") }?;
        // SAFETY: the caller passes room for `store_cap` slots (checked).
        let mut out_slots = unsafe { OutBuf::new(store_slots, store_cap, "store_slots") }?;
        // SAFETY: the caller passes a pointer valid for one write (checked).
        let mut out_len = unsafe { OutRef::new(store_len, "store_len") }?;
        // SAFETY: the caller passes room for `evicted_cap` keys (checked).
        let mut out_evicted = unsafe { OutBuf::new(evicted, evicted_cap, "evicted") }?;
        // SAFETY: the caller passes a pointer valid for one write (checked).
        let mut out_evicted_len = unsafe { OutRef::new(evicted_len, "evicted_len") }?;
        let n = keys.len();
        if !out_keys.fits(n) || !out_evicted.fits(n) {
            out_len.set(n);
            out_evicted_len.set(n);
            return Err(too_small(
                "store_keys, store_slots and evicted",
                n,
                store_cap.min(evicted_cap),
            ));
        }
        let plan = &mut st.plan;
        st.manager
            .prepare_store(RequestId::from_u64(request), keys, ends, plan)
            .map_err(store_status)?;
        out_keys.write(plan.keys());
        out_slots.write(plan.slots());
        out_len.set(plan.keys().len());
        out_evicted.write(plan.evicted());
        out_evicted_len.set(plan.evicted().len());
        Ok(())
    })
}

/// Completes stores of `keys[0..n_keys]`. `outcome` `KVTIER_STORE_SUCCEEDED`: each pending key
/// becomes readable and evictable (one stored event); `KVTIER_STORE_FAILED`: each pending key
/// is removed and its slot freed (one metadata-only removal event). Absent or already-ready
/// keys are ignored, so completing twice is harmless.
///
/// Errors: `KVTIER_INVALID_ARGUMENT` for another `outcome`. Ownership: `keys` is read during
/// the call only. Thread safety: not thread-safe per handle (`KVTIER_BUSY`); distinct handles
/// are independent.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvtier_complete_store(
    manager: *mut kvtier_manager,
    keys: *const kvtier_key,
    n_keys: usize,
    outcome: u32,
) -> c_int {
    with_state(manager, |st| {
        // SAFETY: the caller passes `n_keys` readable keys (checked).
        let keys = unsafe { input(keys, n_keys, "keys", "n_keys") }?;
        let outcome = match outcome {
            KVTIER_STORE_SUCCEEDED => StoreOutcome::Stored,
            KVTIER_STORE_FAILED => StoreOutcome::Failed,
            o => {
                return Err(fail(
                    Status::KVTIER_INVALID_ARGUMENT,
                    format_args!(
                        "outcome is {o}: expected KVTIER_STORE_SUCCEEDED (0) or KVTIER_STORE_FAILED (1)"
                    ),
                ));
            }
        };
        st.manager.complete_store(keys, outcome);
        Ok(())
    })
}

/// Evicts everything: the policy is cleared, slot ids restart at 0, request states from before
/// the reset are ignored from now on (their ids stay live until finished or dropped). The
/// reuse tracker, untaken stats and queued events are kept, as in vLLM.
///
/// Thread safety: not thread-safe per handle (`KVTIER_BUSY`); distinct handles are
/// independent.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvtier_reset_cache(manager: *mut kvtier_manager) -> c_int {
    with_state(manager, |st| {
        st.manager.reset_cache();
        Ok(())
    })
}
