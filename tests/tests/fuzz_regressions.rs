//! Regressions found by the fuzz targets in `fuzz/` (issue 6): each test is the minimal
//! reproducer of one finding, with the target that found it and the fix (or why it is ignored).

use kvtier::trace::{TraceReader, TraceWriter};
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

/// Found by `trace_parse` (in a 5-second smoke run): the reader accepts a header value with a
/// carriage return inside it (`# note=a\rb`), and reads it back as `a\rb`, but `TraceWriter`
/// refuses to write that header (`BadHeaderEntry`), so a trace that reads cleanly cannot be
/// written back. Either the reader should reject the line or the writer should accept a `\r`
/// that is not at the end of the value (only a trailing one would not read back).
#[test]
#[ignore = "reader/writer disagreement in std-adapter/src/trace (header values with an inner \\r); the fix belongs to the trace owner"]
fn a_header_the_reader_accepts_can_be_written_back() {
    let text = "# format=kvtrace v1\n# note=a\rb\nL 0 1 00000000000000aa\nS 0\nC 0\n";
    let mut reader = TraceReader::new(text.as_bytes()).unwrap();
    while reader.next_record().unwrap().is_some() {}
    let header = reader.header().clone();
    assert_eq!(header.get_extra("note"), Some("a\rb"));
    let writer = TraceWriter::new(Vec::new(), &header);
    assert!(writer.is_ok(), "{:?}", writer.err());
}
