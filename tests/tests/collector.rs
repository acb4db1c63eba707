//! `StatsCollector`: child processes send wire-encoded payloads over loopback sockets and the
//! exported totals equal the sum of their increments; threads sending right up to shutdown
//! lose nothing; managers are drained with their info on the first drain; bad bytes are
//! counted, not fatal.

#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use kvtier::export::{ExporterConfig, OffloadExporter, encode_text};
use kvtier::shared::{CollectorConfig, SharedManager, StatsCollector, write_frame};
use kvtier_core::manager::{CpuTierInfo, ManagerConfig, OffloadManager};
use kvtier_core::stats::{Gauge, Payload, catalogue};
use kvtier_tests::store::store_or_no_room;

const CHILDREN: u64 = 4;
const FRAMES: u64 = 20;
const CHILD_ENV: &str = "KVTIER_COLLECTOR_CHILD";

/// Payload `j` of child `i`.
fn child_payload(i: u64, j: u64) -> Payload {
    let mut p = Payload::new();
    p.increase_counter(catalogue::STORES_SKIPPED, &[], (i + 1) * (j + 1))
        .unwrap();
    p.increase_counter(catalogue::LOAD_BYTES, &[], 1000 * i + j)
        .unwrap();
    p.observe(catalogue::LOAD_SIZE, &[], (j + 1) * 1_000_000)
        .unwrap();
    p.set_gauge(
        catalogue::CPU_CACHE_USAGE_PERC,
        &[],
        Gauge::fraction(j, FRAMES),
    )
    .unwrap();
    p
}

/// The child's side: connect, say which engine, send every frame, exit.
fn child(spec: &str) {
    let (i, port) = spec.split_once(':').unwrap();
    let i: u64 = i.parse().unwrap();
    let mut s = TcpStream::connect(("127.0.0.1", port.parse::<u16>().unwrap())).unwrap();
    s.write_all(&[u8::try_from(i % 2).unwrap()]).unwrap();
    for j in 0..FRAMES {
        write_frame(&mut s, &child_payload(i, j)).unwrap();
    }
    s.flush().unwrap();
}

#[test]
fn child_processes_totals_equal_the_sum_of_their_increments() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        child(&spec);
        return;
    }
    let registry = prometheus::Registry::new();
    let exporter = OffloadExporter::register(&registry, ExporterConfig::new("m", 2)).unwrap();
    let collector = StatsCollector::spawn::<u64>(
        exporter.clone(),
        Vec::new(),
        CollectorConfig::new(Duration::from_millis(20)),
    )
    .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let exe = std::env::current_exe().unwrap();
    let mut children: Vec<_> = (0..CHILDREN)
        .map(|i| {
            Command::new(&exe)
                .args([
                    "--exact",
                    "child_processes_totals_equal_the_sum_of_their_increments",
                    "--test-threads=1",
                ])
                .env(CHILD_ENV, format!("{i}:{port}"))
                .stdout(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    listener.set_nonblocking(true).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut readers = Vec::new();
    while (readers.len() as u64) < CHILDREN {
        assert!(
            Instant::now() < deadline,
            "children did not connect in time"
        );
        match listener.accept() {
            Ok((mut s, _)) => {
                s.set_nonblocking(false).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                let mut engine = [0u8; 1];
                s.read_exact(&mut engine).unwrap();
                readers.push(collector.ingest(s, usize::from(engine[0])).unwrap());
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("accept: {e}"),
        }
    }
    for c in &mut children {
        assert!(c.wait().unwrap().success());
    }
    for r in readers {
        assert_eq!(r.join().unwrap().unwrap(), FRAMES);
    }
    let report = collector.shutdown();
    assert_eq!(report.payloads, CHILDREN * FRAMES);
    assert_eq!(report.rejected, 0);

    let text = encode_text(&registry).unwrap();
    for engine in 0..2u64 {
        let kids: Vec<u64> = (0..CHILDREN).filter(|i| i % 2 == engine).collect();
        let skipped: u64 = kids
            .iter()
            .map(|i| (0..FRAMES).map(|j| (i + 1) * (j + 1)).sum::<u64>())
            .sum();
        let bytes: u64 = kids
            .iter()
            .map(|i| (0..FRAMES).map(|j| 1000 * i + j).sum::<u64>())
            .sum();
        let sizes: u64 = kids.len() as u64 * (1..=FRAMES).sum::<u64>() * 1_000_000;
        let totals = exporter.totals(usize::try_from(engine).unwrap()).unwrap();
        assert_eq!(
            totals.counter(catalogue::STORES_SKIPPED, &[]),
            Some(skipped)
        );
        assert_eq!(totals.counter(catalogue::LOAD_BYTES, &[]), Some(bytes));
        let h = totals.histogram(catalogue::LOAD_SIZE, &[]).unwrap();
        assert_eq!((h.count(), h.sum()), (kids.len() as u64 * FRAMES, sizes));
        let line = format!(
            "vllm:kv_offload_stores_skipped_total{{model_name=\"m\",engine=\"{engine}\"}} {skipped}\n"
        );
        assert!(text.contains(&line), "{line} not in\n{text}");
    }
}

#[test]
fn threads_sending_until_shutdown_lose_nothing() {
    let registry = prometheus::Registry::new();
    let exporter = OffloadExporter::register(&registry, ExporterConfig::new("m", 1)).unwrap();
    let collector = StatsCollector::spawn::<u64>(
        exporter.clone(),
        Vec::new(),
        CollectorConfig::new(Duration::from_secs(3600)),
    )
    .unwrap();
    let handles: Vec<_> = (0..4u64)
        .map(|t| {
            let sender = collector.sender();
            thread::spawn(move || {
                for j in 0..500u64 {
                    let mut p = Payload::new();
                    p.increase_counter(catalogue::ALLOCATION_FAILURE, &[], t + j)
                        .unwrap();
                    if j % 2 == 0 {
                        sender.send(0, p).unwrap();
                    } else {
                        sender
                            .send_bytes(0, kvtier_core::stats::wire::encode_to_vec(&p))
                            .unwrap();
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    // One hour between exports: only shutdown hands the payloads over.
    assert_eq!(
        exporter
            .totals(0)
            .unwrap()
            .counter(catalogue::ALLOCATION_FAILURE, &[]),
        None
    );
    let sender = collector.sender();
    sender.send_bytes(0, vec![1, 2, 3]).unwrap();
    let report = collector.shutdown();
    assert_eq!(report.payloads, 2000);
    assert_eq!(report.rejected, 1);
    let expected: u64 = (0..4u64)
        .map(|t| (0..500u64).map(|j| t + j).sum::<u64>())
        .sum();
    assert_eq!(
        exporter
            .totals(0)
            .unwrap()
            .counter(catalogue::ALLOCATION_FAILURE, &[]),
        Some(expected)
    );
    assert!(sender.send(0, Payload::new()).is_err());
}

#[test]
fn managers_are_drained_with_their_info_first() {
    let registry = prometheus::Registry::new();
    let exporter = OffloadExporter::register(&registry, ExporterConfig::new("m", 1)).unwrap();
    let mut cfg = ManagerConfig::new(4);
    cfg.store_threshold = 2;
    cfg.info = Some(CpuTierInfo {
        num_chunks: 4,
        blocks_per_chunk: 2,
        kv_cache_size_bytes: Some(4096),
        kv_cache_size_tokens: None,
    });
    let m = Arc::new(SharedManager::new(OffloadManager::<u64>::new(cfg).unwrap()));
    let collector = StatsCollector::spawn(
        exporter.clone(),
        vec![(0, Arc::clone(&m))],
        CollectorConfig::new(Duration::from_secs(3600)),
    )
    .unwrap();
    // C5 through the collector: skipped 3, then stored with usage 0.75.
    m.with(|mgr| {
        let req = mgr.on_new_request().unwrap();
        store_or_no_room(mgr, req, &[1, 2, 3], None).unwrap();
    });
    collector.flush().unwrap();
    m.with(|mgr| {
        let req = mgr.on_new_request().unwrap();
        store_or_no_room(mgr, req, &[1, 2, 3], None).unwrap();
    });
    let report = collector.shutdown();
    assert_eq!(report.drains, 2);
    let text = encode_text(&registry).unwrap();
    let e = "{model_name=\"m\",engine=\"0\"}";
    assert!(
        text.contains(&format!("vllm:kv_offload_stores_skipped_total{e} 3\n")),
        "{text}"
    );
    assert!(text.contains(&format!("vllm:kv_offload_cpu_cache_usage_perc{e} 0.75\n")));
    assert!(text.contains(
        "vllm:kv_offload_config_info{model_name=\"m\",engine=\"0\",cpu_num_chunks=\"4\",\
         cpu_blocks_per_chunk=\"2\",cpu_kv_cache_size_bytes=\"4096\",\
         cpu_kv_cache_size_tokens=\"None\"} 1\n"
    ));
}
