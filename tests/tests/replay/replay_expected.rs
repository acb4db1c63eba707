//! Replays the sample traces under every row of `expected.tsv` (vLLM 0.33.0's own results) and
//! matches every column exactly.

#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use std::fs::File;
use std::io::BufReader;

use kvtier_cli::trace::TraceReader;
use kvtier_tests::expected::{data, replay_row, rows};

#[test]
fn every_expected_row_matches_exactly() {
    let rows = rows(&data("expected.tsv")).unwrap();
    assert_eq!(rows.len(), 9);
    for row in &rows {
        let file = File::open(data(&row.trace)).unwrap();
        let reader = TraceReader::new(BufReader::new(file)).unwrap();
        let got = replay_row(row, reader, 16).unwrap();
        assert_eq!(
            got, row.cols,
            "{} {} {} {}",
            row.trace, row.policy, row.capacity, row.threshold
        );
    }
}
