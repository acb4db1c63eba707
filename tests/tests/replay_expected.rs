//! Replays the sample traces under every row of `expected.tsv` (vLLM 0.33.0's own results) and
//! matches every column exactly.

#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use std::fs::File;
use std::io::BufReader;
use std::path::PathBuf;

use kvtier::replay::Replayer;
use kvtier::trace::TraceReader;
use kvtier_core::manager::{ManagerConfig, OffloadManager, PolicyKind};

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("data")
        .join(name)
}

struct Row {
    trace: String,
    policy: PolicyKind,
    capacity: u32,
    threshold: u32,
    cols: Vec<(String, String)>,
}

fn rows() -> Vec<Row> {
    let text = std::fs::read_to_string(data("expected.tsv")).unwrap();
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split('\t').collect();
    lines
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            assert_eq!(f.len(), header.len(), "malformed row {l}");
            Row {
                trace: f[0].to_string(),
                policy: PolicyKind::from_name(f[1]).unwrap(),
                capacity: f[2].parse().unwrap(),
                threshold: f[3].parse().unwrap(),
                cols: header
                    .iter()
                    .zip(&f)
                    .map(|(h, v)| (h.to_string(), v.to_string()))
                    .collect(),
            }
        })
        .collect()
}

fn replay(row: &Row) -> Vec<(String, String)> {
    let mut cfg = ManagerConfig::new(row.capacity);
    cfg.policy = row.policy;
    cfg.store_threshold = row.threshold;
    cfg.max_tracker_size = 64_000;
    let mut replayer = Replayer::new(OffloadManager::new(cfg).unwrap(), 16);
    let file = File::open(data(&row.trace)).unwrap();
    let mut reader = TraceReader::new(BufReader::new(file)).unwrap();
    while let Some(rec) = reader.next_record().unwrap() {
        replayer.apply(rec).unwrap();
        if reader.records_read().is_multiple_of(61) {
            replayer.manager().inspect().check_invariants().unwrap();
        }
    }
    assert_eq!(replayer.open_requests(), 0);
    let c = replayer.counts();
    let m = replayer.manager();
    let mut out = vec![
        ("trace".to_string(), row.trace.clone()),
        ("policy".to_string(), row.policy.name().to_string()),
        ("capacity".to_string(), row.capacity.to_string()),
        ("store_threshold".to_string(), row.threshold.to_string()),
    ];
    let mut push = |k: &str, v: String| out.push((k.to_string(), v));
    push("requests", c.requests.to_string());
    push("request_blocks", c.request_blocks.to_string());
    push("hit_blocks", c.hit_blocks.to_string());
    push("hit_requests", c.hit_requests.to_string());
    push("stored_blocks", c.stored_blocks.to_string());
    push("evicted_blocks", c.evicted_blocks.to_string());
    push("store_failures", c.store_failures.to_string());
    push("stopped_at_pending", c.stopped_at_pending.to_string());
    push("resident_blocks", m.inspect().allocated().to_string());
    push(
        "stores_skipped",
        c.stores_skipped.map_or("-".to_string(), |v| v.to_string()),
    );
    push("digest", format!("{:016x}", c.digest));
    out
}

#[test]
fn every_expected_row_matches_exactly() {
    let rows = rows();
    assert_eq!(rows.len(), 9);
    for row in &rows {
        let got = replay(row);
        assert_eq!(
            got, row.cols,
            "{} {} {} {}",
            row.trace, row.policy, row.capacity, row.threshold
        );
    }
}
