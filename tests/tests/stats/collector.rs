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

use kvtier::export::{ExporterConfig, OffloadExporter, encode_text, format_float};
use kvtier::shared::{CollectorConfig, RejectReason, SharedManager, StatsCollector, write_frame};
use kvtier_core::manager::{ManagerConfig, OffloadManager};
use kvtier_core::stats::CpuTierInfo;
use kvtier_core::stats::{Gauge, Payload, catalogue};
use kvtier_tests::store::store_or_no_room;

const CHILDREN: u64 = 4;
const FRAMES: u64 = 20;
const CHILD_ENV: &str = "KVTIER_COLLECTOR_CHILD";

/// `test`'s name as the harness lists it: the path of this module in the test binary, then the
/// name (a child process re-runs exactly that test).
fn harness_name(test: &str) -> String {
    match module_path!().split_once("::") {
        Some((_, module)) => format!("{module}::{test}"),
        None => test.to_owned(),
    }
}

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
    let name = harness_name("child_processes_totals_equal_the_sum_of_their_increments");
    let mut children: Vec<_> = (0..CHILDREN)
        .map(|i| {
            Command::new(&exe)
                .args(["--exact", name.as_str(), "--test-threads=1"])
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
        #[expect(clippy::cast_precision_loss, reason = "small test counts")]
        let value = format_float(skipped as f64);
        let line = format!(
            "vllm:kv_offload_stores_skipped_total{{engine=\"{engine}\",model_name=\"m\"}} {value}\n"
        );
        assert!(text.contains(&line), "{line} not in\n{text}");
    }
}

#[test]
fn threads_sending_until_shutdown_lose_nothing() {
    let (_registry, exporter, collector) = collector_with(
        1,
        Vec::new(),
        CollectorConfig::new(Duration::from_secs(3600)),
    );
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
    // One hour between exports: only shutdown hands the payloads over (until then the
    // counter shows its start value).
    assert_eq!(failures_total(&exporter), Some(0));
    let sender = collector.sender();
    sender.send_bytes(0, vec![1, 2, 3]).unwrap();
    let report = collector.shutdown();
    assert_eq!(report.payloads, 2000);
    assert_eq!(report.rejected, 1);
    let expected: u64 = (0..4u64)
        .map(|t| (0..500u64).map(|j| t + j).sum::<u64>())
        .sum();
    assert_eq!(failures_total(&exporter), Some(expected));
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
    let e = "{engine=\"0\",model_name=\"m\"}";
    assert!(
        text.contains(&format!("vllm:kv_offload_stores_skipped_total{e} 3.0\n")),
        "{text}"
    );
    assert!(text.contains(&format!("vllm:kv_offload_cpu_cache_usage_perc{e} 0.75\n")));
    assert!(text.contains(
        "vllm:kv_offload_config_info{cpu_blocks_per_chunk=\"2\",cpu_kv_cache_size_bytes=\"4096\",\
         cpu_kv_cache_size_tokens=\"None\",cpu_num_chunks=\"4\",engine=\"0\",model_name=\"m\"} 1.0\n"
    ));
}

/// A registry, its exporter of `engines` engines of model "m", and a collector feeding it.
fn collector_with(
    engines: u32,
    sources: Vec<(usize, Arc<SharedManager<u64>>)>,
    config: CollectorConfig,
) -> (prometheus::Registry, OffloadExporter, StatsCollector) {
    let registry = prometheus::Registry::new();
    let exporter = OffloadExporter::register(&registry, ExporterConfig::new("m", engines)).unwrap();
    let collector = StatsCollector::spawn(exporter.clone(), sources, config).unwrap();
    (registry, exporter, collector)
}

/// Engine 0's `vllm:kv_offload_allocation_failure` total.
fn failures_total(exporter: &OffloadExporter) -> Option<u64> {
    exporter
        .totals(0)
        .unwrap()
        .counter(catalogue::ALLOCATION_FAILURE, &[])
}

/// A payload that adds `by` to `vllm:kv_offload_allocation_failure`.
fn failures(by: u64) -> Payload {
    let mut p = Payload::new();
    p.increase_counter(catalogue::ALLOCATION_FAILURE, &[], by)
        .unwrap();
    p
}

#[test]
fn one_bad_payload_is_rejected_alone_and_the_interval_is_exported() {
    // The manager's own drained stats go into the same interval's sum.
    let mut cfg = ManagerConfig::new(4);
    cfg.store_threshold = 2;
    let m = Arc::new(SharedManager::new(OffloadManager::<u64>::new(cfg).unwrap()));
    let (registry, exporter, collector) = collector_with(
        1,
        vec![(0, Arc::clone(&m))],
        CollectorConfig::new(Duration::from_secs(3600)),
    );
    collector.register_metrics(&registry).unwrap();
    m.with(|mgr| {
        let req = mgr.on_new_request().unwrap();
        kvtier_tests::store::store(mgr, req, &[1, 2, 3], None).unwrap();
    });
    let sender = collector.sender();
    for i in 0..10 {
        if i == 4 {
            // From a newer engine: one name the catalogue does not know, next to a known one.
            let mut bad = failures(1000);
            bad.increase_counter("vllm:kv_offload_from_a_newer_engine", &[], 1)
                .unwrap();
            sender.send(0, bad).unwrap();
        }
        if i % 2 == 0 {
            sender.send(0, failures(5)).unwrap();
        } else {
            let bytes = kvtier_core::stats::wire::encode_to_vec(&failures(5));
            sender.send_bytes(0, bytes).unwrap();
        }
    }
    collector.flush().unwrap();
    let totals = exporter.totals(0).unwrap();
    // Nothing of the bad payload, everything of the others.
    assert_eq!(totals.counter(catalogue::ALLOCATION_FAILURE, &[]), Some(50));
    assert_eq!(totals.counter(catalogue::STORES_SKIPPED, &[]), Some(3));
    assert_eq!(collector.rejected(RejectReason::UnknownMetric), 1);
    for r in RejectReason::ALL {
        if r != RejectReason::UnknownMetric {
            assert_eq!(collector.rejected(r), 0, "{r}");
        }
    }
    let text = encode_text(&registry).unwrap();
    let e = "{engine=\"0\",model_name=\"m\"}";
    assert!(
        text.contains(&format!(
            "vllm:kv_offload_allocation_failure_total{e} 50.0\n"
        )),
        "{text}"
    );
    assert!(
        text.contains("kvtier_collector_rejected_payloads_total{reason=\"unknown_metric\"} 1.0\n")
    );
    assert!(
        text.contains("kvtier_collector_rejected_payloads_total{reason=\"label_count\"} 0.0\n")
    );
    let report = collector.shutdown();
    assert_eq!(report.payloads, 11);
    assert_eq!(report.rejected, 1);
}

#[test]
fn each_kind_of_bad_payload_is_counted_under_its_reason() {
    let (_registry, exporter, collector) = collector_with(
        1,
        Vec::new(),
        CollectorConfig::new(Duration::from_secs(3600)),
    );
    let sender = collector.sender();
    let mut label_count = Payload::new();
    label_count
        .increase_counter(catalogue::STORES_SKIPPED, &["x"], 1)
        .unwrap();
    let mut type_mismatch = Payload::new();
    type_mismatch
        .set_gauge(catalogue::STORES_SKIPPED, &[], Gauge::int(1))
        .unwrap();
    let mut bounds = Payload::new();
    bounds
        .merge_histogram(
            catalogue::LOAD_SIZE,
            &[],
            &kvtier_core::stats::Histogram::new(&[1, 2, 3]).unwrap(),
        )
        .unwrap();
    for p in [label_count, type_mismatch, bounds] {
        sender.send(0, p).unwrap();
    }
    sender.send_bytes(0, b"not a payload".to_vec()).unwrap();
    // Longer than any payload: rejected without being queued.
    sender
        .send_bytes(0, vec![0; kvtier_core::stats::wire::MAX_ENCODED_LEN + 1])
        .unwrap();
    // An engine the exporter does not have: only that engine's sum is refused.
    sender.send(7, failures(1)).unwrap();
    sender.send(0, failures(2)).unwrap();
    // One series more than the engine's totals can hold (they start with the families shown
    // at zero), though it fits in a sum with the payload before: refused alone.
    let held = exporter.totals(0).unwrap().len();
    assert!(held >= 2, "{held} series at the start");
    let wide = wide_frame(kvtier_core::stats::payload::MAX_SERIES - held + 1);
    sender
        .send(0, kvtier_core::stats::wire::decode(&wide).unwrap())
        .unwrap();
    collector.flush().unwrap();
    assert_eq!(collector.rejected(RejectReason::LabelCount), 1);
    assert_eq!(collector.rejected(RejectReason::TypeMismatch), 1);
    assert_eq!(collector.rejected(RejectReason::BoundsMismatch), 1);
    assert_eq!(collector.rejected(RejectReason::Decode), 2);
    assert_eq!(collector.rejected(RejectReason::UnknownEngine), 1);
    assert_eq!(collector.rejected(RejectReason::TooManySeries), 1);
    assert_eq!(failures_total(&exporter), Some(2));
    let report = collector.shutdown();
    assert_eq!(report.rejected, 7);
}

/// Wire bytes of a payload with `series` counter series of ~200-byte label values, +1 each.
fn wide_frame(series: usize) -> Vec<u8> {
    let mut p = Payload::new();
    for i in 0..series {
        let source = format!("{i:04}{}", "s".repeat(200));
        p.increase_counter(catalogue::PROMPT_TOKENS_CACHED_BY_SOURCE, &[&source], 1)
            .unwrap();
    }
    kvtier_core::stats::wire::encode_to_vec(&p)
}

#[test]
fn a_flood_through_ingest_waits_for_room_and_the_queue_keeps_its_byte_bound() {
    let m = Arc::new(SharedManager::new(
        OffloadManager::<u64>::new(ManagerConfig::new(4)).unwrap(),
    ));
    let mut config = CollectorConfig::new(Duration::from_millis(10));
    config.max_queue_bytes = 2 << 20;
    let (_registry, exporter, collector) = collector_with(1, vec![(0, Arc::clone(&m))], config);
    let frame = wide_frame(200);
    const FRAMES: u64 = 600;
    assert!(
        frame.len() as u64 * FRAMES > 10 * (2 << 20),
        "a flood far past the bound"
    );
    let (reader, mut writer) = std::io::pipe().unwrap();
    let ingest = collector.ingest(reader, 0).unwrap();
    let written = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let count = Arc::clone(&written);
    let bytes = frame.clone();
    // Holding the manager's lock stops the collector at its next drain: the queue fills.
    let flood = m.with(|_| {
        let flood = thread::spawn(move || {
            for _ in 0..FRAMES {
                let len = u32::try_from(bytes.len()).unwrap();
                writer.write_all(&len.to_le_bytes()).unwrap();
                writer.write_all(&bytes).unwrap();
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let l = collector.queue_levels();
            assert!(l.bytes <= l.max_bytes, "{l:?}");
            if l.bytes + frame.len() > l.max_bytes {
                break;
            }
            assert!(Instant::now() < deadline, "the queue never filled: {l:?}");
            thread::sleep(Duration::from_millis(5));
        }
        let l = collector.queue_levels();
        assert_eq!(l.max_bytes, 2 << 20);
        assert_eq!(l.bytes, l.frames * frame.len());
        // The writer is held back (by the pipe, once the ingest thread stops reading).
        thread::sleep(Duration::from_millis(50));
        let w = written.load(std::sync::atomic::Ordering::SeqCst);
        assert!(w < FRAMES, "the writer was never held back");
        flood
    });
    flood.join().unwrap();
    assert_eq!(ingest.join().unwrap().unwrap(), FRAMES);
    collector.flush().unwrap();
    let l = collector.queue_levels();
    assert!(l.peak_bytes <= l.max_bytes, "{l:?}");
    assert!(l.peak_bytes + frame.len() > l.max_bytes, "{l:?}");
    // Nothing was dropped: every series got every frame's increment.
    let totals = exporter.totals(0).unwrap();
    for i in [0, 99, 199] {
        let source = format!("{i:04}{}", "s".repeat(200));
        assert_eq!(
            totals.counter(catalogue::PROMPT_TOKENS_CACHED_BY_SOURCE, &[&source]),
            Some(FRAMES),
            "series {i}"
        );
    }
    let report = collector.shutdown();
    assert_eq!((report.payloads, report.rejected), (FRAMES, 0));
}

#[test]
fn a_queue_of_few_frames_holds_at_most_that_many() {
    let m = Arc::new(SharedManager::new(
        OffloadManager::<u64>::new(ManagerConfig::new(4)).unwrap(),
    ));
    let mut config = CollectorConfig::new(Duration::from_millis(10));
    config.max_queue_frames = 8;
    let (_registry, exporter, collector) = collector_with(1, vec![(0, Arc::clone(&m))], config);
    let sender = collector.sender();
    const FRAMES: u64 = 100_000;
    // Holding the manager's lock stops the collector at its next drain, within an interval
    // of the flood's start: the queue fills.
    let flood = m.with(|_| {
        let flood = thread::spawn(move || {
            for _ in 0..FRAMES {
                sender.send(0, failures(1)).unwrap();
            }
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        while collector.queue_levels().frames < 8 {
            assert!(Instant::now() < deadline, "the queue never filled");
            thread::sleep(Duration::from_millis(5));
        }
        thread::sleep(Duration::from_millis(20));
        assert_eq!(collector.queue_levels().frames, 8);
        flood
    });
    flood.join().unwrap();
    collector.flush().unwrap();
    assert_eq!(failures_total(&exporter), Some(FRAMES));
}

#[test]
fn interval_exports_run_while_the_queue_is_never_empty() {
    let interval = Duration::from_millis(10);
    let (_registry, exporter, collector) =
        collector_with(1, Vec::new(), CollectorConfig::new(interval));
    // Small frames, sent far faster than they are decoded and summed.
    let frame = kvtier_core::stats::wire::encode_to_vec(&failures(1));
    const FRAMES: u64 = 200_000;
    let sender = collector.sender();
    let start = Instant::now();
    let flood = thread::spawn(move || {
        for _ in 0..FRAMES {
            sender.send_bytes(0, frame.clone()).unwrap();
        }
    });
    flood.join().unwrap();
    // Queued behind the whole flood: returns once it has been applied.
    collector.flush().unwrap();
    let elapsed = start.elapsed();
    let report = collector.shutdown();
    assert_eq!(report.payloads, FRAMES);
    assert_eq!(failures_total(&exporter), Some(FRAMES));
    // Exports during the flood: all but the flush's and the shutdown's.
    let during = report.flushes - 2;
    let due = u64::try_from(elapsed.as_nanos() / interval.as_nanos()).unwrap();
    assert!(
        due >= 8,
        "the flood took {elapsed:?}, too short to tell (raise FRAMES)"
    );
    assert!(
        during >= due / 4,
        "{during} exports in {elapsed:?} at a {interval:?} interval"
    );
}

#[test]
fn an_interval_too_long_for_an_instant_exports_on_flush() {
    let (_registry, exporter, collector) =
        collector_with(1, Vec::new(), CollectorConfig::new(Duration::MAX));
    collector.sender().send(0, failures(3)).unwrap();
    collector.flush().unwrap();
    assert_eq!(failures_total(&exporter), Some(3));
    assert_eq!(collector.shutdown().flushes, 2);
}
