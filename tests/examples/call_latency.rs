//! The slowest single `prepare_store` calls of a long churn, for the latency a scheduler loop
//! sees (medians hide them):
//!
//! ```text
//! cargo run --release -p kvtier-tests --example call_latency -- 1048576 arc 2000000
//! ```
//!
//! Arguments: chunks (default 1,048,576), policy (`lru` or `arc`), offers (default
//! 2,000,000). Each offer is one request storing 16 consecutive keys from a key space of three
//! times the capacity, so the tier fills, evicts on most offers, and ARC's ghost lists fill
//! too. Prints the median, the 99.99th percentile and the maximum of the calls' wall times,
//! and when each call over 1 ms happened (offer number and milliseconds).

use std::time::Instant;

use kvtier_core::BlockKey;
use kvtier_core::manager::{ManagerConfig, OffloadManager, PolicyKind, StoreOutcome, StorePlan};
use kvtier_tests::xorshift::xorshift;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let chunks: u32 = args.get(1).map_or(Ok(1 << 20), |s| s.parse())?;
    let policy = PolicyKind::from_name(args.get(2).map_or("lru", String::as_str))?;
    let offers: usize = args.get(3).map_or(Ok(2_000_000), |s| s.parse())?;
    let mut cfg = ManagerConfig::new(chunks);
    cfg.policy = policy;
    let mut m = OffloadManager::<BlockKey>::new(cfg)?;
    let mut plan = StorePlan::new();
    let mut next = xorshift(0x9e37_79b9_7f4a_7c15);
    let space = 3 * u64::from(chunks.max(1));
    let mut keys = Vec::with_capacity(16);
    let mut times = Vec::with_capacity(offers);
    let start = Instant::now();
    for i in 0..offers {
        let base = next() % space;
        keys.clear();
        keys.extend((0..16).map(|j| BlockKey::new(base * 16 + j, 0)));
        let req = m.on_new_request()?;
        let t = Instant::now();
        let stored = m.prepare_store(req, &keys, None, &mut plan).is_ok();
        times.push(t.elapsed());
        if stored {
            m.complete_store(plan.keys(), StoreOutcome::Stored);
        }
        m.on_request_finished(req)?;
        if i % 1024 == 0 {
            let _ = m.take_stats();
        }
    }
    let total = start.elapsed();
    let slow: Vec<String> = times
        .iter()
        .enumerate()
        .filter(|(_, t)| t.as_micros() > 1000)
        .map(|(i, t)| format!("{i}: {:.1} ms", t.as_secs_f64() * 1e3))
        .collect();
    let mut sorted = times;
    sorted.sort_unstable();
    // The call at rank ⌊(len − 1) · per / 10,000⌋ of the sorted times.
    let at = |per: usize| sorted.get(sorted.len().saturating_sub(1) * per / 10_000);
    let us = |t: Option<&std::time::Duration>| t.map_or(0.0, |t| t.as_secs_f64() * 1e6);
    println!(
        "{} chunks, {}, {offers} offers in {:.2} s: prepare_store median {:.1} µs, p99.99 {:.1} µs, \
         max {:.1} µs; {} calls over 1 ms{}{}",
        chunks,
        policy.name(),
        total.as_secs_f64(),
        us(at(5_000)),
        us(at(9_999)),
        us(sorted.last()),
        slow.len(),
        if slow.is_empty() { "" } else { ": " },
        slow.join(", ")
    );
    Ok(())
}
