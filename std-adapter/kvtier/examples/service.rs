//! Use kvtier from a service: two engines, each with its manager behind a lock, worker threads
//! that look up-and-pin, store and finish requests, a stats collector that drains the managers
//! and exports them on a private Prometheus registry, and `/metrics` on loopback.
//!
//! Run with `cargo run -p kvtier --example service`; it prints one scrape and exits.

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use kvtier::export::{ExporterConfig, OffloadExporter, encode_text};
use kvtier::http::{MetricsServer, ServerConfig};
use kvtier::shared::{CollectorConfig, SharedManager, StatsCollector};
use kvtier_core::manager::{ManagerConfig, OffloadManager, StoreError, StoreOutcome, StorePlan};
use kvtier_core::stats::CpuTierInfo;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // One manager per engine, each with its tier's facts for vllm:kv_offload_config_info.
    let engines: Vec<Arc<SharedManager<u64>>> = (0..2)
        .map(|_| {
            let mut cfg = ManagerConfig::new(1024);
            cfg.store_threshold = 2;
            cfg.info = Some(CpuTierInfo {
                num_chunks: 1024,
                blocks_per_chunk: 1,
                kv_cache_size_bytes: None,
                kv_cache_size_tokens: None,
            });
            OffloadManager::new(cfg).map(|m| Arc::new(SharedManager::new(m)))
        })
        .collect::<Result<_, _>>()?;

    // A private registry (never the global default), the exporter, the collector thread.
    let registry = prometheus::Registry::new();
    let exporter = OffloadExporter::register(&registry, ExporterConfig::new("my-model", 2))?;
    let sources = engines.iter().cloned().enumerate().collect();
    let collector = StatsCollector::spawn(
        exporter,
        sources,
        CollectorConfig::new(Duration::from_secs(1)),
    )?;

    // /metrics on loopback, encoded from the registry at each scrape.
    let scrape = registry.clone();
    let server = MetricsServer::bind("127.0.0.1:0", ServerConfig::default(), move || {
        encode_text(&scrape)
    })?;
    eprintln!("metrics at http://{}/metrics", server.local_addr());

    // Workers: per request, look up and pin the cached prefix in one critical section, load
    // it, then offer the rest for storing and complete the store.
    let workers: Vec<_> = engines
        .iter()
        .map(|m| {
            let m = Arc::clone(m);
            thread::spawn(move || -> Result<(), kvtier::Error> {
                // One reusable plan per worker: the warm path allocates nothing.
                let mut plan = StorePlan::new();
                for r in 0..200u64 {
                    let keys: Vec<u64> = (r % 7..r % 7 + 16).collect();
                    let req = m.with(|mgr| mgr.on_new_request())?;
                    let pinned = m.lookup_and_pin(req, &keys, None)?;
                    m.with(|mgr| -> Result<(), kvtier::Error> {
                        let loaded = keys.get(..pinned.hits).unwrap_or(&[]);
                        mgr.complete_load(loaded)?;
                        let rest = keys.get(pinned.hits..).unwrap_or(&[]);
                        match mgr.prepare_store(req, rest, None, &mut plan) {
                            // A real service writes the blocks here, then reports the outcome.
                            Ok(()) => {
                                mgr.complete_store(plan.keys(), StoreOutcome::Stored);
                            }
                            // Everything idle is in use: this request's tail is not offloaded.
                            Err(StoreError::NoRoom { .. }) => {}
                            Err(e) => return Err(e.into()),
                        }
                        Ok(mgr.on_request_finished(req)?)
                    })?;
                }
                Ok(())
            })
        })
        .collect();
    for w in workers {
        w.join().map_err(|_| "a worker panicked")??;
    }

    // Shutdown drains every manager one last time; nothing sent before it is lost.
    let report = collector.shutdown();
    eprintln!("collector: {report:?}");
    let text = encode_text(&registry)?;
    for line in text
        .lines()
        .filter(|l| l.starts_with("vllm:kv_offload_stores_skipped"))
    {
        println!("{line}");
    }
    server.stop();
    Ok(())
}
