//! The reuse tracker as vLLM's manager shows it (`counts`): an ordered map from each tracked
//! key to its offer count, least recently offered first.
//!
//! The core's tracker answers which keys it holds and their counts
//! ([`Inspect::tracker_count`](kvtier_core::manager::Inspect::tracker_count)) but not its
//! order, which only a reader of `counts` needs. The binding keeps that order beside it: after
//! each offer the tracker counted, every offered key it holds gets the next stamp — first those
//! it held before (their count is now 2 or more; vLLM moves them to the recent end in offer
//! order), then those the offer added (count 1, appended in offer order) — so that sorting the
//! tracked keys by stamp gives vLLM's order. A key the tracker dropped and took back gets a new
//! stamp when it comes back; a stamp left on a key no longer tracked is never read. Only a
//! manager with a reuse filter keeps stamps, one per key-table id.

use kvtier_core::manager::OffloadManager;

use crate::keys::{Interner, VKey};

/// The order of the reuse tracker's keys (see the module doc).
#[derive(Debug, Default)]
pub(crate) struct ReuseOrder {
    /// The stamp of each key-table id, 0 for none.
    stamps: Vec<u64>,
    next: u64,
}

impl ReuseOrder {
    /// Stamps the keys of `offer`, an offer the core's tracker has just counted.
    pub(crate) fn record(&mut self, m: &OffloadManager<VKey>, offer: &[VKey]) {
        let inspect = m.inspect();
        for moved in [true, false] {
            for k in offer {
                let count = inspect.tracker_count(k);
                if count == 0 || (count >= 2) != moved {
                    continue;
                }
                let id = k.id() as usize;
                if self.stamps.len() <= id {
                    self.stamps.resize(id + 1, 0);
                }
                self.next += 1;
                self.stamps[id] = self.next;
            }
        }
    }

    /// The tracked keys' values (the Python key objects) with their counts, least recently
    /// offered first.
    pub(crate) fn entries<'a, V>(
        &self,
        m: &OffloadManager<VKey>,
        keys: &'a Interner<V>,
    ) -> Vec<(&'a V, u32)> {
        let inspect = m.inspect();
        let mut tracked: Vec<(u64, &V, u32)> = keys
            .live()
            .filter_map(|(k, v)| {
                let count = inspect.tracker_count(&k);
                let stamp = self.stamps.get(k.id() as usize).copied().unwrap_or(0);
                (count > 0).then_some((stamp, v, count))
            })
            .collect();
        tracked.sort_unstable_by_key(|&(stamp, _, _)| stamp);
        tracked.into_iter().map(|(_, v, c)| (v, c)).collect()
    }
}
