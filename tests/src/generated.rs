//! The built-in generator's records (seed 7) the benches replay, and their request-blocks.

use kvtier_cli::trace::OwnedRecord;
use kvtier_cli::workload::{Generator, GeneratorConfig};

/// `requests` generated requests of seed 7 as owned records, and the blocks their `L` records
/// look up (the request-blocks a replay's cost is divided by).
///
/// # Panics
/// Never for `requests` ≥ 1 (the generator's config is valid).
#[must_use]
#[expect(clippy::unwrap_used, reason = "a fixed, valid generator configuration")]
pub fn records(requests: u64) -> (Vec<OwnedRecord>, u64) {
    let g = Generator::new(GeneratorConfig::new(7, requests)).unwrap();
    let recs: Vec<OwnedRecord> = g.into_owned_records().collect();
    let blocks = recs
        .iter()
        .map(|r| match r {
            OwnedRecord::Load { hashes, .. } => hashes.len() as u64,
            _ => 0,
        })
        .sum();
    (recs, blocks)
}
