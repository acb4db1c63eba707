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

use kvtier_cli::Cli;
use kvtier_core::BlockKey;
use kvtier_core::manager::{ConfigError, ManagerConfig, OffloadManager, PolicyKind};

struct Counting;

thread_local! {
    /// Bytes allocated minus bytes freed on this thread (tests run on several threads).
    static NET: Cell<i64> = const { Cell::new(0) };
    /// Refuse every allocation of at least this many bytes on this thread.
    static REFUSE_FROM: Cell<usize> = const { Cell::new(usize::MAX) };
}

fn refused(layout: Layout) -> bool {
    REFUSE_FROM
        .try_with(|r| layout.size() >= r.get())
        .unwrap_or(false)
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
        if refused(layout) {
            return std::ptr::null_mut();
        }
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
    let mut arc = ManagerConfig::new(1_431_655_764);
    arc.policy = PolicyKind::Arc;
    arc.max_requests = 65_536;
    let mut tracker = ManagerConfig::new(1024);
    tracker.max_tracker_size = u32::MAX;
    tracker.store_threshold = 2;
    tracker.max_requests = 65_536;
    let mut one = ManagerConfig::new(4_000_000_000);
    one.max_requests = 1;
    // Bytes per chunk (or tracker entry), rounded down: keys, reference counts, slot
    // pool, table and the policy's arrays (the same at 32 and 64 bits: `BlockKey` is 12
    // bytes on both).
    let per = [54, 99, 38, 54];
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
    let args = Cli::try_parse_from(argv).unwrap();
    kvtier_cli::replay::replay(&args.replay_options().unwrap(), false)
        .unwrap_err()
        .to_string()
}

#[test]
fn replay_refuses_huge_capacities_with_the_limit_in_the_message() {
    let commands: [&[&str]; 4] = [
        &["--capacity", "4294901758"],
        &["--policy", "arc", "--capacity", "1431655764"],
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
    // The largest ARC is 1,431,655,764 chunks (`huge()` builds it, to run out of memory);
    // one more is refused by the configuration.
    let mut cfg = ManagerConfig::new(1_431_655_765);
    cfg.policy = PolicyKind::Arc;
    assert_eq!(
        OffloadManager::<BlockKey>::new(cfg).unwrap_err(),
        ConfigError::ArcTooLarge {
            num_chunks: 1_431_655_765
        }
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
        "num_chunks (2147483648) is too large for ARC: its key table of the chunks and 2 · \
         num_chunks ghost entries exceeds the u32 index space (num_chunks at most 1431655764)"
    );
}

fn replay_args(extra: &[&str]) -> kvtier_cli::replay::ReplayOptions {
    let mut argv = vec!["kvtier", "replay"];
    argv.extend_from_slice(extra);
    Cli::try_parse_from(argv).unwrap().replay_options().unwrap()
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

/// With `grow_tables`, a manager starts with small key tables and ends, once full, with
/// tables no larger than an up-front manager's; and it decides exactly what an up-front manager decides (the same hit
/// digest, counts, eviction order and tracker state on a generated workload that fills a
/// 6,000-chunk tier, so every table doubles past its first size).
#[test]
fn growing_tables_decide_the_same_and_stay_within_required_bytes() {
    use kvtier_cli::replay::Replayer;
    use kvtier_cli::workload::{Generator, GeneratorConfig};
    for (policy, threshold) in [
        (PolicyKind::Lru, 0),
        (PolicyKind::Arc, 0),
        (PolicyKind::Lru, 2),
        (PolicyKind::Arc, 2),
    ] {
        let mut cfg = ManagerConfig::new(6_000);
        cfg.policy = policy;
        cfg.store_threshold = threshold;
        cfg.max_tracker_size = 5_000;
        let need = OffloadManager::<BlockKey>::required_bytes(&cfg);
        let mut grown = cfg;
        grown.grow_tables = true;
        let (m, at_start) = allocated_by(|| OffloadManager::<BlockKey>::new(grown).unwrap());
        // The chunk index alone: 8,192 buckets of 5 bytes when whole, 2,048 at first (the
        // other arrays are reserved whole either way and touched only as they fill).
        assert!(
            need - at_start >= 30_000,
            "{policy:?}: {at_start} of {need} bytes at start"
        );
        let mut a = Replayer::new(OffloadManager::new(cfg).unwrap(), 16);
        let mut b = Replayer::new(m, 16);
        let records = Generator::new(GeneratorConfig::new(11, 3_000))
            .unwrap()
            .into_owned_records();
        for rec in records {
            let rec = rec.as_record();
            assert_eq!(a.apply(rec), b.apply(rec), "{policy:?}");
        }
        assert_eq!(a.counts(), b.counts(), "{policy:?}");
        let (ia, ib) = (a.manager().inspect(), b.manager().inspect());
        assert_eq!(ia.eviction_order(), ib.eviction_order(), "{policy:?}");
        assert_eq!(ia.arc_sizes(), ib.arc_sizes(), "{policy:?}");
        assert_eq!(ia.tracker_len(), ib.tracker_len(), "{policy:?}");
        assert_eq!(ib.allocated(), 6_000, "{policy:?}: the tier filled");
        // Per-request state is the same in both; the grown tables are at most the whole ones.
        let (whole, held) = (ia.heap_bytes(), ib.heap_bytes());
        assert!(held <= whole, "{policy:?}: {held} > {whole}");
        assert!(held as u64 > at_start, "{policy:?}: the tables grew");
    }
}

/// A table that cannot grow fails the offer with `StoreError::OutOfMemory` and changes
/// nothing; the same offer succeeds once memory is granted.
#[test]
fn a_table_that_cannot_grow_fails_the_offer_unchanged() {
    use kvtier_core::manager::{StoreError, StorePlan};
    let mut cfg = ManagerConfig::new(100_000);
    cfg.grow_tables = true;
    let mut m = OffloadManager::<BlockKey>::new(cfg).unwrap();
    let req = m.on_new_request().unwrap();
    let mut plan = StorePlan::new();
    let first: Vec<BlockKey> = (0..1000).map(|i| BlockKey::new(i, 0)).collect();
    m.prepare_store(req, &first, None, &mut plan).unwrap();
    let more: Vec<BlockKey> = (1000..3000).map(|i| BlockKey::new(i, 0)).collect();
    let before = (m.inspect().allocated(), m.inspect().eviction_order());
    // The grown index is far larger than any per-call buffer this offer needs.
    REFUSE_FROM.with(|r| r.set(16 * 1024));
    let e = m.prepare_store(req, &more, None, &mut plan);
    REFUSE_FROM.with(|r| r.set(usize::MAX));
    assert_eq!(e, Err(StoreError::OutOfMemory));
    assert_eq!(
        e.unwrap_err().to_string(),
        "prepare_store: out of memory growing the key tables for this offer; nothing changed"
    );
    assert!(plan.keys().is_empty());
    assert_eq!(
        (m.inspect().allocated(), m.inspect().eviction_order()),
        before
    );
    assert_eq!(m.lookup(&more[0]), kvtier_core::manager::LookupResult::Miss);
    m.prepare_store(req, &more, None, &mut plan).unwrap();
    assert_eq!(plan.keys().len(), 2000);
    assert_eq!(m.inspect().allocated(), 3000);
    m.inspect().check_invariants().unwrap();
}
