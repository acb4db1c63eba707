//! The manager's memory budget: `required_bytes` is what construction allocates (measured by a
//! counting allocator), a configuration over `memory_limit` is `ConfigError::OutOfMemory` before
//! anything is allocated, and the replay command refuses such capacities instead of being
//! killed by the kernel.

#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::PathBuf;

use clap::Parser;
use kvtier::cli::{Cli, Command};
use kvtier_core::BlockKey;
use kvtier_core::manager::{ConfigError, ManagerConfig, OffloadManager, PolicyKind};

struct Counting;

thread_local! {
    /// Bytes allocated minus bytes freed on this thread (tests run on several threads).
    static NET: Cell<i64> = const { Cell::new(0) };
}

fn add(delta: i64) {
    // `try_with` fails only while the thread is being torn down; nothing is measured then.
    let _ = NET.try_with(|n| n.set(n.get() + delta));
}

#[expect(
    clippy::cast_possible_wrap,
    reason = "allocation sizes are below isize::MAX"
)]
fn size(layout: Layout) -> i64 {
    layout.size() as i64
}

// SAFETY: forwards to the system allocator unchanged; only counts bytes. (This test crate is
// not kvtier-core, whose no-unsafe rule this does not touch.)
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        add(size(layout));
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        add(-size(layout));
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    #[expect(
        clippy::cast_possible_wrap,
        reason = "allocation sizes are below isize::MAX"
    )]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        add(new_size as i64 - size(layout));
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Net bytes `f` leaves allocated on this thread.
fn allocated_by<T>(f: impl FnOnce() -> T) -> (T, u64) {
    let before = NET.with(Cell::get);
    let out = f();
    let after = NET.with(Cell::get);
    (out, u64::try_from(after - before).unwrap())
}

fn configs() -> Vec<ManagerConfig> {
    let mut out = Vec::new();
    for policy in [PolicyKind::Lru, PolicyKind::Arc] {
        for (chunks, threshold, tracker, events) in [
            (0, 0, 0, false),
            (1, 0, 64_000, false),
            (1000, 2, 5000, true),
            (100_000, 3, 64_000, true),
            (70_001, 0, 0, false),
        ] {
            let mut c = ManagerConfig::new(chunks);
            c.policy = policy;
            c.store_threshold = threshold;
            c.max_tracker_size = tracker;
            c.enable_events = events;
            c.max_requests = 777;
            out.push(c);
        }
    }
    out
}

#[test]
fn required_bytes_is_what_construction_allocates() {
    for cfg in configs() {
        let need = OffloadManager::<BlockKey>::required_bytes(&cfg);
        let (m, got) = allocated_by(|| OffloadManager::<BlockKey>::new(cfg).unwrap());
        // Exact on x86-64 (16-byte hash-table groups); 8-byte groups allocate up to 8 bytes
        // less per table (four tables at most).
        assert!(
            got <= need && need - got <= 32,
            "{cfg:?}: required {need}, allocated {got}"
        );
        assert_eq!(m.inspect().heap_bytes() as u64, got, "{cfg:?}");
        // u64 keys are half the size: the count follows the key type.
        let need64 = OffloadManager::<u64>::required_bytes(&cfg);
        let (_, got64) = allocated_by(|| OffloadManager::<u64>::new(cfg).unwrap());
        assert!(got64 <= need64 && need64 - got64 <= 32, "{cfg:?}: u64 keys");
    }
}

#[test]
fn a_config_over_the_limit_is_refused_before_allocating() {
    for cfg in configs() {
        let need = OffloadManager::<BlockKey>::required_bytes(&cfg);
        let mut at = cfg;
        at.memory_limit = Some(need);
        assert!(OffloadManager::<BlockKey>::new(at).is_ok(), "{cfg:?}");
        if need == 0 {
            continue;
        }
        let mut under = cfg;
        under.memory_limit = Some(need - 1);
        let (r, got) = allocated_by(|| OffloadManager::<BlockKey>::new(under));
        assert_eq!(
            r.unwrap_err(),
            ConfigError::OutOfMemory {
                needed: need,
                limit: Some(need - 1)
            }
        );
        assert_eq!(got, 0, "nothing stays allocated");
    }
}

/// The four configurations that used to be killed at 24 GB of resident memory.
fn huge() -> Vec<(ManagerConfig, u64)> {
    let mut lru = ManagerConfig::new(4_294_901_758);
    lru.max_requests = 65_536;
    let mut arc = ManagerConfig::new(2_147_450_879);
    arc.policy = PolicyKind::Arc;
    arc.max_requests = 65_536;
    let mut tracker = ManagerConfig::new(1024);
    tracker.max_tracker_size = u32::MAX;
    tracker.store_threshold = 2;
    tracker.max_requests = 65_536;
    let mut one = ManagerConfig::new(4_000_000_000);
    one.max_requests = 1;
    // Bytes per chunk (or tracker entry), rounded down: keys, reference counts, stamps, slot
    // pool, table and the policy's arrays (a few of them pointer-sized).
    #[cfg(target_pointer_width = "64")]
    let per = [59, 120, 41, 59];
    #[cfg(not(target_pointer_width = "64"))]
    let per = [58, 113, 38, 58];
    [lru, arc, tracker, one]
        .into_iter()
        .zip(per)
        .map(|(c, per)| {
            let n = u64::from(
                c.num_chunks
                    .max(c.max_tracker_size * u32::from(c.store_threshold >= 2)),
            );
            (c, n * per)
        })
        .collect()
}

#[test]
fn huge_capacities_are_out_of_memory_not_an_abort() {
    for (mut cfg, at_least) in huge() {
        cfg.memory_limit = Some(1 << 30);
        let need = OffloadManager::<BlockKey>::required_bytes(&cfg);
        assert!(need >= at_least, "{cfg:?}: {need} < {at_least}");
        let err = OffloadManager::<BlockKey>::new(cfg).unwrap_err();
        assert_eq!(
            err,
            ConfigError::OutOfMemory {
                needed: need,
                limit: Some(1 << 30)
            }
        );
        assert_eq!(
            err.to_string(),
            format!(
                "the manager needs {need} bytes for this many chunks, requests, tracker entries \
                 and event keys, over the memory limit of 1073741824 bytes"
            )
        );
    }
}

fn replay_error(extra: &[&str]) -> String {
    let trace = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("data/small-a.kvtrace")
        .display()
        .to_string();
    let mut argv = vec!["kvtier", "replay", "--memory-limit", "1073741824"];
    if !extra.contains(&"--requests") {
        argv.extend(["--trace", trace.as_str()]);
    }
    argv.extend_from_slice(extra);
    let Command::Replay(args) = Cli::try_parse_from(argv).unwrap().command else {
        panic!("not a replay");
    };
    kvtier::replay_run::replay(&args.options, false)
        .unwrap_err()
        .to_string()
}

#[test]
fn replay_refuses_huge_capacities_with_the_limit_in_the_message() {
    let commands: [&[&str]; 4] = [
        &["--capacity", "4294901758"],
        &["--policy", "arc", "--capacity", "2147450879"],
        &["--max-tracker-size", "4294967295", "--store-threshold", "2"],
        &[
            "--requests",
            "100000",
            "--capacity",
            "4000000000",
            "--max-requests",
            "1",
        ],
    ];
    for (extra, (cfg, _)) in commands.into_iter().zip(huge()) {
        let need = OffloadManager::<BlockKey>::required_bytes(&cfg);
        let err = replay_error(extra);
        assert!(
            err.ends_with(&format!(
                "the manager needs {need} bytes for this many chunks, requests, tracker \
                 entries and event keys, over the memory limit of 1073741824 bytes"
            )),
            "{extra:?}: {err}"
        );
    }
}

#[test]
fn lru_overflow_does_not_mention_arc() {
    let mut cfg = ManagerConfig::new(u32::MAX - 10);
    cfg.max_requests = 100;
    let e = OffloadManager::<BlockKey>::new(cfg).unwrap_err();
    assert_eq!(
        e.to_string(),
        "num_chunks (4294967285) plus max_requests (100) exceeds the u32 index space"
    );
    let mut cfg = ManagerConfig::new(1 << 31);
    cfg.policy = PolicyKind::Arc;
    let e = OffloadManager::<BlockKey>::new(cfg).unwrap_err();
    assert_eq!(
        e,
        ConfigError::ArcTooLarge {
            num_chunks: 1 << 31
        }
    );
    assert_eq!(
        e.to_string(),
        "num_chunks (2147483648) is too large for ARC: its 2 · num_chunks ghost entries \
         exceed the u32 index space"
    );
}

fn replay_args(extra: &[&str]) -> kvtier::replay_run::ReplayOptions {
    let mut argv = vec!["kvtier", "replay"];
    argv.extend_from_slice(extra);
    let Command::Replay(args) = Cli::try_parse_from(argv).unwrap().command else {
        panic!("not a replay");
    };
    args.options
}

#[test]
fn the_command_line_limit_defaults_to_the_available_memory() {
    let (m, _) = replay_args(&["--memory-limit", "123456789"])
        .manager(None)
        .unwrap();
    assert_eq!(m.config().memory_limit, Some(123_456_789));
    let (m, _) = replay_args(&[]).manager(None).unwrap();
    // MemAvailable moves between two reads: only its presence is stable.
    assert_eq!(
        m.config().memory_limit.is_some(),
        kvtier::memory::available_bytes().is_some()
    );
    assert_eq!(
        m.config().memory_limit.is_some(),
        cfg!(target_os = "linux") && std::path::Path::new("/proc/meminfo").exists()
    );
}
