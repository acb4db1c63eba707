//! `manager_ops`: arbitrary sequences of every `OffloadManager` call (the shared
//! `kvtier_tests::manager_model::Op`), both policies, with and without the store threshold, on
//! small capacities so eviction and failure paths are hot. After every step:
//!
//! * `check_invariants()` holds, `allocated − free = write_pending + pinned + evictable` (i.e.
//!   `allocated = pending + pinned + idle`, `allocated + free = capacity`), no slot holds two
//!   keys, the three usage gauges are within [0, 1];
//! * an op that returned a typed error left the manager as a clone taken before it: the same
//!   observable snapshot, the same pending events and the same stats drain;
//! * LRU: the same outcome and snapshot as the reference model (vLLM 0.33.0's manager);
//!   ARC: `prepare_store` is legal (stored = absent admitted offered keys in order, exactly the
//!   victims needed, each idle and not offered).
#![no_main]

use arbitrary::Arbitrary;
use kvtier_core::manager::PolicyKind;
use kvtier_tests::manager_checks::run_ops;
use kvtier_tests::manager_model::{Config, Op};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Input {
    capacity: u8,
    arc: bool,
    store_threshold: u8,
    max_tracker_size: u8,
    small_event_queue: bool,
    max_requests: u8,
    /// Each op with a flag: steer its keys towards keys in a useful state.
    ops: Vec<(Op, bool)>,
}

impl Input {
    fn config(&self) -> Config {
        Config {
            capacity: u32::from(self.capacity % 8),
            policy: if self.arc {
                PolicyKind::Arc
            } else {
                PolicyKind::Lru
            },
            store_threshold: u32::from(self.store_threshold % 4),
            max_tracker_size: u32::from(self.max_tracker_size % 6),
            max_event_keys: if self.small_event_queue { 3 } else { 64 },
            max_requests: u32::from(self.max_requests % 4) + 1,
        }
    }
}

fuzz_target!(|input: Input| {
    // Every run starts with a live request in slot 0, so stores and loads can succeed from the
    // first op (the fuzzer can still finish or drop it).
    let first = (Op::NewRequest { slot: 0 }, false);
    if let Err(e) = run_ops(input.config(), core::iter::once(first).chain(input.ops)) {
        panic!("{e}");
    }
});
