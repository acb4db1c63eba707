//! Replays an in-memory generated workload through the manager alone (records parsed up
//! front), for profiling: `cargo run --release -p kvtier-tests --example replay_mem -- 20000 16384 lru`.

use std::time::Instant;

use kvtier_cli::replay::Replayer;
use kvtier_cli::trace::OwnedRecord;
use kvtier_cli::workload::{Generator, GeneratorConfig};
use kvtier_core::manager::{ManagerConfig, OffloadManager, PolicyKind};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let requests: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(20_000);
    let capacity: u32 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(16_384);
    let policy =
        PolicyKind::from_name(args.get(3).map_or("lru", String::as_str)).unwrap_or_default();
    let g = Generator::new(GeneratorConfig::new(7, requests)).expect("valid generator config");
    let recs: Vec<OwnedRecord> = g.into_owned_records().collect();
    let mut cfg = ManagerConfig::new(capacity);
    cfg.policy = policy;
    let mut r = Replayer::new(OffloadManager::new(cfg).expect("valid manager config"), 16);
    let t = Instant::now();
    for rec in &recs {
        r.apply(rec.as_record()).expect("generated traces replay");
    }
    let wall = t.elapsed().as_secs_f64();
    let c = r.counts();
    println!(
        "{} request-blocks in {:.3} s: {:.2} M/s (digest {:016x}, hits {})",
        c.request_blocks,
        wall,
        c.request_blocks as f64 / wall / 1e6,
        c.digest,
        c.hit_blocks
    );
}
