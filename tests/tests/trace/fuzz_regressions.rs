//! Regressions found by the fuzz targets in `fuzz/`: each test is the minimal
//! reproducer of one finding, with the target that found it and the fix (or why it is ignored).

use kvtier_cli::trace::{TraceReader, TraceWriter};
use kvtier_core::capacity::{
    GroupedLayout, LayerKind, LayerSpec, PoolLayout, Workload, max_fitting_len,
};

/// Found by `capacity_monotonic` in its first seconds: `max_fitting_len`'s binary search
/// computes `mid + 1` when every length fits, which overflows at `max_model_len = u64::MAX`
/// (a panic in debug builds; in release `left` wraps to 0 and the search never ends: this test
/// ran over 90 s in `--release` before it was killed). A sliding-window layer needs the same
/// bytes at any length, so every length fits. `check_admission` and `gpu_capacity` reach the
/// same search, so `kvtier capacity` with a huge `max_model_len` is affected too.
/// Fixed: the search stops when `mid` is `u64::MAX`.
#[test]
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

/// Found by `trace_parse` (in a 5-second smoke run): the reader accepted a header value with a
/// carriage return inside it (`# note=a\rb`) that `TraceWriter` refuses to write, so a trace
/// that read cleanly could not be written back. Fixed on the reader's side: kvtrace lines end
/// in `\n` alone, so a header line holding `\r` is malformed (as `\r\n` record lines were).
#[test]
fn a_header_with_a_carriage_return_is_rejected_with_its_line() {
    let text = "# format=kvtrace v1\n# note=a\rb\nL 0 1 00000000000000aa\nS 0\nC 0\n";
    let err = TraceReader::new(text.as_bytes()).unwrap_err();
    assert_eq!(err.line(), 2, "{err}");
    assert!(err.to_string().contains("line 2"), "{err}");
    // Every header the reader accepts can be written back.
    let ok = "# format=kvtrace v1\n# note=a b\nL 0 1 00000000000000aa\nS 0\nC 0\n";
    let mut reader = TraceReader::new(ok.as_bytes()).unwrap();
    while reader.next_record().unwrap().is_some() {}
    assert!(TraceWriter::new(Vec::new(), reader.header()).is_ok());
}
