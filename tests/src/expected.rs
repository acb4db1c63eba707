//! The reference-results tables (`tests/data/expected*.tsv`, vLLM 0.33.0's own results): their
//! rows, and one replay of a row's configuration over any record source with every column of
//! the table computed the same way, so a test compares whole rows.

use std::path::{Path, PathBuf};

use kvtier_cli::replay::Replayer;
use kvtier_cli::trace::RecordSource;
use kvtier_core::manager::{ManagerConfig, OffloadManager, PolicyKind};

/// A file of `tests/data/`.
#[must_use]
pub fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("data")
        .join(name)
}

/// One row of a reference table.
#[derive(Clone, Debug)]
pub struct Row {
    /// The trace file, in `tests/data/`.
    pub trace: String,
    /// The policy.
    pub policy: PolicyKind,
    /// The capacity in chunks.
    pub capacity: u32,
    /// The store threshold.
    pub threshold: u32,
    /// Every column, `(name, value)` in the table's order.
    pub cols: Vec<(String, String)>,
}

/// The rows of the table at `path`.
///
/// # Errors
/// A message naming the unreadable file or the malformed row.
pub fn rows(path: &Path) -> Result<Vec<Row>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().ok_or("empty table")?.split('\t').collect();
    lines
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            if f.len() != header.len() || f.len() < 4 {
                return Err(format!("malformed row {l}"));
            }
            let bad = |what: &str| format!("row {l}: bad {what}");
            Ok(Row {
                trace: f[0].to_string(),
                policy: PolicyKind::from_name(f[1]).map_err(|_| bad("policy"))?,
                capacity: f[2].parse().map_err(|_| bad("capacity"))?,
                threshold: f[3].parse().map_err(|_| bad("store_threshold"))?,
                cols: header
                    .iter()
                    .zip(&f)
                    .map(|(h, v)| (h.to_string(), v.to_string()))
                    .collect(),
            })
        })
        .collect()
}

/// Replays `source` under `row`'s configuration (tracker size 64,000, vLLM's default) with
/// `block_tokens` tokens per block, checking the manager's invariants every 61 records, and
/// returns every column of the table.
///
/// # Errors
/// A message for a source, replay or invariant error, or a request left open.
pub fn replay_row<S: RecordSource>(
    row: &Row,
    mut source: S,
    block_tokens: u64,
) -> Result<Vec<(String, String)>, String>
where
    S::Error: std::fmt::Display,
{
    let mut cfg = ManagerConfig::new(row.capacity);
    cfg.policy = row.policy;
    cfg.store_threshold = row.threshold;
    cfg.max_tracker_size = 64_000;
    let manager = OffloadManager::new(cfg).map_err(|e| e.to_string())?;
    let mut replayer = Replayer::new(manager, block_tokens);
    let mut records = 0u64;
    while let Some(rec) = source.next_record().map_err(|e| e.to_string())? {
        replayer
            .apply(rec)
            .map_err(|e| format!("record {}: {e}", records + 1))?;
        records += 1;
        if records.is_multiple_of(61) {
            replayer
                .manager()
                .inspect()
                .check_invariants()
                .map_err(|e| format!("record {records}: {e:?}"))?;
        }
    }
    if replayer.open_requests() != 0 {
        return Err(format!("{} requests left open", replayer.open_requests()));
    }
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
    Ok(out)
}
