//! The C ABI called from Rust: vLLM's scenario C1 (slots, victims, events), stats as wire
//! bytes that decode to the manager's own values (and survive a too-short buffer), `NO_ROOM`,
//! and two handles used from two threads at once.
#![deny(clippy::undocumented_unsafe_blocks)]

use core::ffi::CStr;

use kvtier_core::stats::{Gauge, catalogue, wire};
use kvtier_ffi::*;

fn ok(rc: i32) {
    assert_eq!(rc, kvtier_status::KVTIER_OK as i32, "{}", last_error());
}

fn last_error() -> String {
    // SAFETY: kvtier_last_error returns this thread's NUL-terminated detail buffer.
    let s = unsafe { CStr::from_ptr(kvtier_last_error()) };
    s.to_string_lossy().into_owned()
}

fn k(h: u64) -> kvtier_key {
    kvtier_key { hash: h, group: 0 }
}

/// A safe wrapper over one handle for the tests.
struct M(*mut kvtier_manager);

/// `(stored keys, slots, evicted keys)`, or the status.
type Stored = Result<(Vec<u64>, Vec<u32>, Vec<u64>), i32>;

impl M {
    fn new(num_chunks: u32, events: bool) -> Self {
        Self::with(num_chunks, events, KVTIER_POLICY_LRU)
    }

    fn with(num_chunks: u32, events: bool, policy: u32) -> Self {
        let mut cfg = core::mem::MaybeUninit::<kvtier_config>::uninit();
        // SAFETY: `cfg` is writable; kvtier_config_init writes it without reading it.
        ok(unsafe { kvtier_config_init(cfg.as_mut_ptr(), num_chunks) });
        // SAFETY: kvtier_config_init returned KVTIER_OK, so it wrote the whole struct.
        let mut cfg = unsafe { cfg.assume_init() };
        cfg.enable_events = u32::from(events);
        cfg.policy = policy;
        let mut m = core::ptr::null_mut();
        // SAFETY: valid config and output pointer.
        ok(unsafe { kvtier_manager_new(&cfg, &mut m) });
        M(m)
    }

    fn begin(&self) -> u64 {
        let mut r = 0;
        // SAFETY: a live handle and a writable id.
        ok(unsafe { kvtier_request_begin(self.0, &mut r) });
        r
    }

    fn finish(&self, r: u64) {
        // SAFETY: a live handle.
        ok(unsafe { kvtier_request_finish(self.0, r) });
    }

    /// prepare_store in a throwaway request, like vLLM's tests.
    fn ps(&self, ids: &[u64]) -> Stored {
        let keys: Vec<_> = ids.iter().map(|&i| k(i)).collect();
        let n = keys.len();
        let (mut sk, mut ss, mut ev) = (vec![k(0); n], vec![0u32; n], vec![k(0); n]);
        let (mut sl, mut el) = (0usize, 0usize);
        let r = self.begin();
        // SAFETY: every array has room for `n` entries; the lengths are writable.
        let rc = unsafe {
            kvtier_prepare_store(
                self.0,
                r,
                keys.as_ptr(),
                n,
                core::ptr::null(),
                sk.as_mut_ptr(),
                ss.as_mut_ptr(),
                n,
                &mut sl,
                ev.as_mut_ptr(),
                n,
                &mut el,
            )
        };
        // SAFETY: a live handle.
        ok(unsafe { kvtier_request_drop(self.0, r) });
        if rc != 0 {
            return Err(rc);
        }
        Ok((
            sk[..sl].iter().map(|k| k.hash).collect(),
            ss[..sl].to_vec(),
            ev[..el].iter().map(|k| k.hash).collect(),
        ))
    }

    fn cs(&self, ids: &[u64], outcome: u32) {
        let keys: Vec<_> = ids.iter().map(|&i| k(i)).collect();
        // SAFETY: `keys` holds `len` keys.
        ok(unsafe { kvtier_complete_store(self.0, keys.as_ptr(), keys.len(), outcome) });
    }

    fn pl(&self, ids: &[u64]) -> Vec<u32> {
        let keys: Vec<_> = ids.iter().map(|&i| k(i)).collect();
        let mut slots = vec![0u32; keys.len()];
        let mut len = 0;
        let r = self.begin();
        // SAFETY: `keys` and `slots` hold `len` entries each.
        ok(unsafe {
            kvtier_prepare_load(
                self.0,
                r,
                keys.as_ptr(),
                keys.len(),
                core::ptr::null(),
                slots.as_mut_ptr(),
                slots.len(),
                &mut len,
            )
        });
        // SAFETY: a live handle.
        ok(unsafe { kvtier_request_drop(self.0, r) });
        slots.truncate(len);
        slots
    }

    fn cl(&self, ids: &[u64]) {
        let keys: Vec<_> = ids.iter().map(|&i| k(i)).collect();
        // SAFETY: `keys` holds `len` keys.
        ok(unsafe { kvtier_complete_load(self.0, keys.as_ptr(), keys.len()) });
    }

    fn touch(&self, ids: &[u64]) {
        let keys: Vec<_> = ids.iter().map(|&i| k(i)).collect();
        // SAFETY: `keys` holds `len` keys.
        ok(unsafe { kvtier_touch(self.0, keys.as_ptr(), keys.len()) });
    }

    fn look(&self, id: u64) -> u32 {
        let mut r = 99;
        // SAFETY: a live handle, a readable key and a writable result.
        ok(unsafe { kvtier_lookup(self.0, &k(id), &mut r) });
        r
    }

    fn events(&self) -> Vec<(u32, Vec<u64>)> {
        let mut evs = [kvtier_event::default(); 16];
        let mut keys = [k(0); 64];
        let (mut ne, mut nk) = (0, 0);
        // SAFETY: both buffers have the capacities passed; the lengths are writable.
        ok(unsafe {
            kvtier_drain_events(
                self.0,
                evs.as_mut_ptr(),
                evs.len(),
                &mut ne,
                keys.as_mut_ptr(),
                keys.len(),
                &mut nk,
            )
        });
        evs[..ne]
            .iter()
            .map(|e| {
                let ks = &keys[e.first_key..e.first_key + e.num_keys];
                (e.kind, ks.iter().map(|k| k.hash).collect())
            })
            .collect()
    }

    fn stats(&self, cap: usize) -> Result<Vec<u8>, (i32, usize)> {
        let mut buf = vec![0u8; cap];
        let mut len = 0;
        // SAFETY: `buf` has `cap` bytes; `len` is writable.
        let rc = unsafe { kvtier_take_stats(self.0, buf.as_mut_ptr(), cap, &mut len) };
        if rc != 0 {
            return Err((rc, len));
        }
        buf.truncate(len);
        Ok(buf)
    }

    fn info(&self) -> kvtier_manager_info {
        let mut i = kvtier_manager_info::default();
        // SAFETY: a live handle and a writable info.
        ok(unsafe { kvtier_inspect(self.0, &mut i) });
        i
    }
}

impl Drop for M {
    fn drop(&mut self) {
        // SAFETY: the handle is live and used by no other thread now.
        ok(unsafe { kvtier_manager_free(self.0) });
    }
}

fn stored(ids: &[u64], slots: &[u32], evicted: &[u64]) -> Stored {
    Ok((ids.to_vec(), slots.to_vec(), evicted.to_vec()))
}

#[test]
fn c1_through_the_c_abi() {
    let m = M::new(4, true);
    let (miss, pending, hit) = (
        KVTIER_LOOKUP_MISS,
        KVTIER_LOOKUP_HIT_PENDING,
        KVTIER_LOOKUP_HIT,
    );
    let (st, rm, meta) = (
        KVTIER_EVENT_STORED,
        KVTIER_EVENT_REMOVED,
        KVTIER_EVENT_REMOVED_METADATA_ONLY,
    );
    assert_eq!(m.ps(&[1, 2]), stored(&[1, 2], &[0, 1], &[]));
    assert_eq!((m.look(1), m.look(2)), (pending, pending));
    m.cs(&[1, 2], KVTIER_STORE_SUCCEEDED);
    assert_eq!(m.events(), vec![(st, vec![1, 2])]);
    assert_eq!((m.look(1), m.look(3)), (hit, miss));
    assert_eq!(m.ps(&[2, 3, 4, 5]), stored(&[3, 4, 5], &[2, 3, 0], &[1]));
    assert_eq!(m.ps(&[1, 6]), Err(kvtier_status::KVTIER_NO_ROOM as i32));
    m.cs(&[2, 3, 4, 5], KVTIER_STORE_SUCCEEDED);
    assert_eq!(m.pl(&[2, 3]), vec![1, 2]);
    assert_eq!(m.ps(&[6, 7, 8]), Err(kvtier_status::KVTIER_NO_ROOM as i32));
    m.cl(&[2, 3]);
    assert_eq!(m.ps(&[6, 7, 8]), stored(&[6, 7, 8], &[3, 2, 1], &[2, 3, 4]));
    m.cs(&[6, 7, 8], KVTIER_STORE_SUCCEEDED);
    m.touch(&[5, 6, 7]);
    assert_eq!(m.ps(&[9]), stored(&[9], &[1], &[8]));
    m.cs(&[7, 9], KVTIER_STORE_FAILED);
    assert_eq!((m.look(7), m.look(9)), (hit, miss));
    assert_eq!(
        m.events(),
        vec![
            (rm, vec![1]),
            (st, vec![3, 4, 5]),
            (rm, vec![2, 3, 4]),
            (st, vec![6, 7, 8]),
            (rm, vec![8]),
            (meta, vec![9]),
        ]
    );
    assert_eq!(m.events(), vec![]);
    let info = m.info();
    assert_eq!(
        (
            info.num_chunks,
            info.allocated,
            info.evictable,
            info.write_pending
        ),
        (4, 3, 3, 0),
        "5, 6 and 7 resident and idle; 9's store failed"
    );
}

#[test]
fn stats_are_wire_bytes_and_a_short_buffer_loses_nothing() {
    let m = M::new(4, false);
    m.ps(&[1, 2]).unwrap();
    let first = m.stats(4096).unwrap();
    let p = wire::decode(&first).unwrap();
    assert_eq!(
        p.gauge(catalogue::CPU_CACHE_USAGE_PERC, &[]),
        Some(Gauge::fraction(1, 2))
    );
    let h = p.histogram(catalogue::CPU_ALLOCATION_SIZE, &[]).unwrap();
    assert_eq!((h.count(), h.sum()), (1, 2));

    // A store, a take into a short buffer (kept), another store, then a take: both samples.
    m.ps(&[3]).unwrap();
    let (rc, needed) = m.stats(3).unwrap_err();
    assert_eq!(rc, kvtier_status::KVTIER_BUFFER_TOO_SMALL as i32);
    m.cs(&[1, 2, 3], KVTIER_STORE_SUCCEEDED);
    m.ps(&[4]).unwrap();
    let second = m.stats(4096).unwrap();
    let p = wire::decode(&second).unwrap();
    let h = p.histogram(catalogue::CPU_ALLOCATION_SIZE, &[]).unwrap();
    assert_eq!(
        (h.count(), h.sum()),
        (2, 2),
        "the kept sample and the new one"
    );
    // The gauges are the latest: 1 pending store of 4 chunks.
    assert_eq!(
        p.gauge(catalogue::CPU_CACHE_USAGE_PERC, &[]),
        Some(Gauge::fraction(1, 4))
    );
    assert!(needed > 3);
    assert_eq!(wire::encode_to_vec(&p), second, "canonical bytes");
    let first_p = wire::decode(&first).unwrap();
    assert!(
        first_p.info().is_some(),
        "the first take carries config_info"
    );
    assert!(p.info().is_none(), "only the first");
    // Drained: no histogram now.
    let third = wire::decode(&m.stats(4096).unwrap()).unwrap();
    assert!(
        third
            .histogram(catalogue::CPU_ALLOCATION_SIZE, &[])
            .is_none()
    );
    // The needed length is exact: a buffer of exactly that size takes the kept stats.
    m.ps(&[6]).unwrap();
    let (_, needed) = m.stats(1).unwrap_err();
    assert_eq!(m.stats(needed).unwrap().len(), needed);
    assert_eq!(kvtier_stats_max_len(), wire::MAX_ENCODED_LEN);
}

#[test]
fn stale_request_ids_and_errors_name_what_was_wrong() {
    let m = M::new(4, false);
    let r = m.begin();
    m.finish(r);
    let mut len = 0;
    let mut slots = [0u32; 1];
    // SAFETY: a live handle, one readable key, room for one slot.
    let rc = unsafe {
        kvtier_prepare_load(
            m.0,
            r,
            &k(1),
            1,
            core::ptr::null(),
            slots.as_mut_ptr(),
            1,
            &mut len,
        )
    };
    assert_eq!(rc, kvtier_status::KVTIER_UNKNOWN_REQUEST as i32);
    assert!(
        last_error().contains("is not a live request"),
        "{}",
        last_error()
    );
    m.ps(&[5]).unwrap();
    m.cs(&[5], KVTIER_STORE_SUCCEEDED);
    let r = m.begin();
    let keys = [k(5), k(6)];
    // SAFETY: two readable keys, room for two slots.
    let rc = unsafe {
        kvtier_prepare_load(
            m.0,
            r,
            keys.as_ptr(),
            2,
            core::ptr::null(),
            [0u32; 2].as_mut_ptr(),
            2,
            &mut len,
        )
    };
    assert_eq!(rc, kvtier_status::KVTIER_NOT_PRESENT as i32);
    assert_eq!(
        last_error(),
        "prepare_load: key at index 1 is not in the tier"
    );
    assert_eq!(
        m.info().evictable,
        1,
        "key 5 was not pinned by the refused load"
    );
    m.finish(r);
    // SAFETY: the message of any code is a static C string.
    let msg = unsafe { CStr::from_ptr(kvtier_status_message(rc)) };
    assert_eq!(msg.to_str().unwrap(), "a key is not in the tier");
    // SAFETY: the version is a static C string.
    let version = unsafe { CStr::from_ptr(kvtier_version()) };
    assert_eq!(version.to_str().unwrap(), env!("CARGO_PKG_VERSION"));
}

#[test]
fn distinct_handles_work_from_two_threads_at_once() {
    fn run(policy: u32) -> (u64, u32) {
        let m = M::with(64, false, policy);
        let mut evicted = 0u64;
        for i in 0..2_000u64 {
            let ids = [i % 97, i % 89 + 100, i];
            if let Ok((keys, _, ev)) = m.ps(&ids) {
                evicted += ev.len() as u64;
                m.cs(&keys, KVTIER_STORE_SUCCEEDED);
            }
        }
        (evicted, m.info().allocated)
    }
    let a = std::thread::spawn(move || run(KVTIER_POLICY_LRU));
    let b = std::thread::spawn(move || run(KVTIER_POLICY_ARC));
    let (a, b) = (a.join().unwrap(), b.join().unwrap());
    // The same work on one thread gives the same answers.
    assert_eq!(a, run(KVTIER_POLICY_LRU));
    assert_eq!(b, run(KVTIER_POLICY_ARC));
    assert_eq!((a.1, b.1), (64, 64));
}

#[test]
fn a_store_without_room_is_counted_in_the_next_stats() {
    let m = M::new(1, false);
    m.ps(&[1]).unwrap();
    // The only chunk is pending: no room for another.
    assert_eq!(m.ps(&[2]), Err(kvtier_status::KVTIER_NO_ROOM as i32));
    assert!(last_error().contains("prepare_store"), "{}", last_error());
    let p = wire::decode(&m.stats(4096).unwrap()).unwrap();
    assert_eq!(p.counter(catalogue::ALLOCATION_FAILURE, &[]), Some(1));
    let h = p.histogram(catalogue::CPU_ALLOCATION_SIZE, &[]).unwrap();
    assert_eq!(
        (h.count(), h.sum()),
        (2, 2),
        "the refused offer is sampled too"
    );
}
