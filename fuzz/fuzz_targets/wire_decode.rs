//! `wire_decode`: arbitrary bytes to `stats::wire::decode`. It never panics; its allocation is
//! bounded (the peak bytes live during one decode stay under a fixed bound, whatever counts
//! the input declares); a successful decode re-encodes to exactly the same bytes
//! (`encoded_len` included) and every strict prefix of those bytes is reported as truncated;
//! `decode_view` accepts and rejects exactly what `decode` does, lends the same series, and
//! allocates nothing.
#![no_main]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use kvtier_core::stats::wire;
use libfuzzer_sys::fuzz_target;

/// Peak heap bytes one decode may hold live. The hard limits bound a decoded payload (256
/// series of at most one 255-byte name, 8 labels of 255 bytes and a boxed histogram each, plus
/// 16 × 16 info labels); inputs are at most a few KiB, and the decoder reserves capacity only
/// as far as the remaining input allows, so a few hundred KiB is generous.
const DECODE_PEAK_BOUND: usize = 512 * 1024;

/// Counts live heap bytes and their peak (libFuzzer runs one input at a time on one thread).
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(by: usize) {
    let now = LIVE.fetch_add(by, Ordering::Relaxed) + by;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so the
// `GlobalAlloc` contract is `System`'s; the counters only observe sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        grew(layout.size());
        // SAFETY: forwarded as is; the caller upholds `alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: `ptr` came from `System` with this layout (every allocation goes through us).
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        grew(layout.size());
        // SAFETY: forwarded as is.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        grew(new_size);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: forwarded as is; `ptr` came from `System` with `layout`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fuzz_target!(|data: &[u8]| {
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let decoded = wire::decode(data);
    let peak = PEAK.load(Ordering::Relaxed) - base;
    assert!(
        peak <= DECODE_PEAK_BOUND,
        "decoding {} bytes held {peak} heap bytes",
        data.len()
    );
    // The borrowed view validates exactly as decode does, and allocates nothing (info series
    // included: they are checked, not built).
    let before = LIVE.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let view = wire::decode_view(data);
    let view_peak = PEAK.load(Ordering::Relaxed) - before;
    assert_eq!(view_peak, 0, "decode_view allocated");
    match (&decoded, &view) {
        (Ok(p), Ok(v)) => {
            assert_eq!(v.len(), p.series().len(), "view length");
            assert_eq!(v.has_info(), p.info().is_some(), "view info");
            let mut lent_count = 0;
            for (owned, lent) in p.series().iter().zip(v.series()) {
                assert_eq!(owned.name(), lent.name);
                assert!(owned.labels().iter().eq(lent.labels.iter().copied()));
                assert_eq!(owned.value(), &lent.value.to_value());
                lent_count += 1;
            }
            assert_eq!(lent_count, p.series().len(), "view series");
        }
        (Err(a), Err(b)) => assert_eq!(a, b, "decode and decode_view disagree"),
        _ => panic!(
            "decode {:?} but decode_view {:?}",
            decoded.is_ok(),
            view.is_ok()
        ),
    }
    let Ok(payload) = decoded else {
        return;
    };
    assert_eq!(wire::encoded_len(&payload), data.len(), "encoded_len");
    let again = wire::encode_to_vec(&payload);
    assert_eq!(
        again.as_slice(),
        data,
        "decode accepted a non-canonical encoding"
    );
    let mut buf = vec![0u8; data.len()];
    assert_eq!(wire::encode(&payload, &mut buf), Ok(data.len()));
    assert_eq!(buf.as_slice(), data);
    if let Some(short) = data.len().checked_sub(1) {
        assert!(
            wire::encode(&payload, &mut buf[..short]).is_err(),
            "encode into a short buffer"
        );
    }
    for end in 0..data.len() {
        let e = wire::decode(&data[..end]).expect_err("a strict prefix decoded");
        assert!(
            e.is_truncated(),
            "prefix of {end} bytes: {e:?}, not truncated"
        );
    }
});
