//! The floor: the kvtrace replay protocol on a bare LRU (a hash map and an intrusive list over
//! `u32` indices — no request scope, no pinning, no pending state, no stats, no events) next to
//! kvtier's `OffloadManager` (LRU and ARC) on the same records, parsed once into memory before
//! anything is timed. Each is run `RUNS` times, alternating; the medians and the ratios
//! kvtier / floor per request-block are printed (figures are printed, never asserted; the
//! digests of kvtier's runs are checked against each other).
//!
//! ```sh
//! # gen_trace.py: the reference harness's generator, not in this repository (docs/benchmarks.md)
//! python3 gen_trace.py --ops 100000 -o /tmp/g100k.kvtrace
//! cargo run --release -p kvtier-tests --example floor -- /tmp/g100k.kvtrace 16384 5
//! # one of them alone (e.g. to count its instructions under valgrind): floor, lru or arc
//! cargo run --release -p kvtier-tests --example floor -- /tmp/g100k.kvtrace 16384 1 lru
//! ```
//!
//! kvtier's manager is built as `kvtier replay` builds it, its key tables growing as they fill
//! (`ManagerConfig::grow_tables`); with `UPFRONT=1` in the environment they are allocated
//! whole at construction instead. The bare LRU's map is reserved for the capacity.
//!
//! The bare LRU applies the protocol as simply as it can be applied: on `L`, probe the keys in
//! order while they are present (each hit moves to the front) and fold the hit count into the
//! digest; on `S`, insert the keys past the hits that are absent, evicting from the back when
//! full; on `C`, forget the request. One hash probe per looked-up block, one insert (and at most
//! one eviction) per stored block.

use std::io::BufReader;
use std::time::Instant;

use kvtier_cli::replay::{DIGEST_MULTIPLIER, Replayer};
use kvtier_cli::trace::{OwnedRecord, TraceReader};
use kvtier_core::hashing::Map;
use kvtier_core::manager::{ManagerConfig, OffloadManager, PolicyKind};

const NIL: u32 = u32::MAX;

/// A bare LRU of `u64` keys: one map from key to node, nodes in a doubly linked list.
struct BareLru {
    index: Map<u64, u32>,
    keys: Vec<u64>,
    prev: Vec<u32>,
    next: Vec<u32>,
    head: u32,
    tail: u32,
    capacity: u32,
}

impl BareLru {
    fn new(capacity: u32) -> Self {
        let mut index = Map::default();
        index.reserve(capacity as usize);
        BareLru {
            index,
            keys: Vec::with_capacity(capacity as usize),
            prev: Vec::with_capacity(capacity as usize),
            next: Vec::with_capacity(capacity as usize),
            head: NIL,
            tail: NIL,
            capacity,
        }
    }

    fn unlink(&mut self, i: u32) {
        let (p, n) = (self.prev[i as usize], self.next[i as usize]);
        if p == NIL {
            self.head = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NIL {
            self.tail = p;
        } else {
            self.prev[n as usize] = p;
        }
    }

    fn push_front(&mut self, i: u32) {
        self.prev[i as usize] = NIL;
        self.next[i as usize] = self.head;
        if self.head == NIL {
            self.tail = i;
        } else {
            self.prev[self.head as usize] = i;
        }
        self.head = i;
    }

    /// Present? Then it moves to the front.
    fn hit(&mut self, key: u64) -> bool {
        match self.index.get(&key) {
            Some(&i) => {
                if self.head != i {
                    self.unlink(i);
                    self.push_front(i);
                }
                true
            }
            None => false,
        }
    }

    /// Inserts an absent key at the front, evicting the back when full.
    fn insert(&mut self, key: u64) {
        if self.capacity == 0 || self.index.contains_key(&key) {
            return;
        }
        let i = if self.keys.len() < self.capacity as usize {
            let i = u32::try_from(self.keys.len()).unwrap_or(NIL);
            self.keys.push(key);
            self.prev.push(NIL);
            self.next.push(NIL);
            i
        } else {
            let victim = self.tail;
            self.unlink(victim);
            self.index.remove(&self.keys[victim as usize]);
            self.keys[victim as usize] = key;
            victim
        };
        self.index.insert(key, i);
        self.push_front(i);
    }
}

/// The protocol on the bare LRU; returns (request-blocks, digest). Never inlined, so that
/// `valgrind --tool=callgrind --toggle-collect=floor::floor_replay` counts it alone.
#[inline(never)]
fn floor_replay(records: &[OwnedRecord], capacity: u32) -> (u64, u64) {
    let mut lru = BareLru::new(capacity);
    // rid -> (index of its L record, hits)
    let mut open: Map<u64, (usize, usize)> = Map::default();
    let (mut blocks, mut digest) = (0u64, 0u64);
    for (at, record) in records.iter().enumerate() {
        match record {
            OwnedRecord::Load { rid, hashes } => {
                let k = hashes.iter().take_while(|&&h| lru.hit(h)).count();
                digest = digest
                    .wrapping_mul(DIGEST_MULTIPLIER)
                    .wrapping_add(k as u64);
                blocks += hashes.len() as u64;
                open.insert(*rid, (at, k));
            }
            OwnedRecord::Start { rid } => {
                if let Some(&(at, k)) = open.get(rid)
                    && let OwnedRecord::Load { hashes, .. } = &records[at]
                {
                    for &h in &hashes[k..] {
                        lru.insert(h);
                    }
                }
            }
            OwnedRecord::Complete { rid } => {
                open.remove(rid);
            }
        }
    }
    (blocks, digest)
}

/// The protocol on kvtier's manager; returns (request-blocks, digest). Never inlined (see above:
/// `--toggle-collect=floor::kvtier_replay`).
#[inline(never)]
fn kvtier_replay(records: &[OwnedRecord], capacity: u32, policy: PolicyKind) -> (u64, u64) {
    let mut config = ManagerConfig::new(capacity);
    config.policy = policy;
    // As `kvtier replay` builds it; `UPFRONT=1` allocates its key tables whole instead.
    config.grow_tables = std::env::var_os("UPFRONT").is_none();
    let manager = OffloadManager::new(config).expect("a valid manager config");
    let mut replayer = Replayer::new(manager, 16);
    for record in records {
        replayer
            .apply(record.as_record())
            .expect("the trace replays");
    }
    let counts = replayer.counts();
    (counts.request_blocks, counts.digest)
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

#[expect(clippy::cast_precision_loss, reason = "figures for people")]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let path = args.get(1).ok_or("usage: floor TRACE [CAPACITY] [RUNS]")?;
    let capacity: u32 = args.get(2).map_or(Ok(16_384), |s| s.parse())?;
    let runs: usize = args.get(3).map_or(Ok(5), |s| s.parse())?;
    let only = match args.get(4).map(String::as_str) {
        None => None,
        Some("floor") => Some(0),
        Some("lru") => Some(1),
        Some("arc") => Some(2),
        Some(other) => return Err(format!("unknown replayer `{other}`: floor, lru or arc").into()),
    };

    let started = Instant::now();
    let mut reader = TraceReader::new(BufReader::with_capacity(
        1 << 16,
        std::fs::File::open(path)?,
    ))?;
    let mut records = Vec::new();
    while let Some(record) = reader.next_record()? {
        records.push(record.to_owned_record());
    }
    println!(
        "{path}: {} records parsed in {:.3} s; capacity {capacity}; {runs} runs each, alternating",
        records.len(),
        started.elapsed().as_secs_f64()
    );

    let mut times: [Vec<f64>; 3] = [Vec::new(), Vec::new(), Vec::new()];
    let mut digests = [None; 3];
    let mut blocks = 0;
    for _ in 0..runs {
        for (slot, run) in times.iter_mut().zip(0..) {
            if only.is_some_and(|o| o != run) {
                continue;
            }
            let t = Instant::now();
            let (b, d) = match run {
                0 => floor_replay(&records, capacity),
                1 => kvtier_replay(&records, capacity, PolicyKind::Lru),
                _ => kvtier_replay(&records, capacity, PolicyKind::Arc),
            };
            slot.push(t.elapsed().as_secs_f64());
            blocks = b;
            match digests[run] {
                None => digests[run] = Some(d),
                Some(prev) if prev != d => return Err("a replay is not deterministic".into()),
                Some(_) => {}
            }
        }
    }
    if only.is_some() {
        let t = median(times.into_iter().flatten().collect());
        println!("{blocks} request-blocks in {t:.3} s (median)");
        return Ok(());
    }
    let [floor, lru, arc] = times.map(median);
    let per_block = |s: f64| s / blocks as f64 * 1e9;
    println!("{blocks} request-blocks per run; medians:");
    println!(
        "  bare LRU (floor)   {:>8.3} s  {:>7.1} ns/request-block  {:>6.2} M request-blocks/s  digest {:016x} (not vLLM's: no pending state)",
        floor,
        per_block(floor),
        blocks as f64 / floor / 1e6,
        digests[0].unwrap_or_default()
    );
    for (name, t, d) in [
        ("kvtier LRU", lru, digests[1]),
        ("kvtier ARC", arc, digests[2]),
    ] {
        println!(
            "  {name:<18} {:>8.3} s  {:>7.1} ns/request-block  {:>6.2} M request-blocks/s  digest {:016x}  {:.2}x the floor",
            t,
            per_block(t),
            blocks as f64 / t / 1e6,
            d.unwrap_or_default(),
            t / floor
        );
    }
    Ok(())
}
