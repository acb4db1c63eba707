//! Regressions found by the fuzz targets in `fuzz/` (issue 6): each test is the minimal
//! reproducer of one finding, with the target that found it and the fix (or why it is ignored).

use kvtier_core::capacity::{
    GroupedLayout, LayerKind, LayerSpec, PoolLayout, Workload, max_fitting_len,
};

/// Found by `capacity_monotonic` in its first seconds: `max_fitting_len`'s binary search
/// computes `mid + 1` when every length fits, which overflows at `max_model_len = u64::MAX`
/// (a panic in debug builds; in release `left` wraps to 0 and the search never ends: this test
/// ran over 90 s in `--release` before it was killed). A sliding-window layer needs the same
/// bytes at any length, so every length fits. `check_admission` and `gpu_capacity` reach the
/// same search, so `kvtier capacity` with a huge `max_model_len` is affected too.
#[test]
#[ignore = "bug in core/src/capacity/blocks.rs (max_fitting_len: `left = mid + 1` overflows at u64::MAX); the fix belongs to the capacity owner"]
fn max_fitting_len_when_every_length_fits_up_to_u64_max() {
    let window = LayerKind::SlidingWindow {
        window: 16,
        extra_retained_tokens: 0,
    };
    let layout = GroupedLayout::from_layers(&[LayerSpec::attention(window, 16, 1, 64, 2)]).unwrap();
    let w = Workload::new(u64::MAX, 16);
    assert_eq!(
        max_fitting_len(&layout, PoolLayout::LayerOutermost, &w, 1 << 30),
        Ok(u64::MAX)
    );
}
