//! vLLM's OffloadingConnector behind the engine model's GPU front: the offload manager of a
//! [`Replayer`] as the engine's [`Connector`]. The engine's hooks become the kvtrace records
//! of the replay protocol, so the tier, its counts and its stats are the replayer's: `L` (the
//! keys past the GPU's hit, the scan capped short of the last token) at the request's first
//! admission, `S` when its prompt is computed, `C` when it finished and its stores completed.

use kvtier_core::BlockKey;
use kvtier_core::block_pool::BlockPool;

use crate::engine::{Connector, FinishedRequest, GroupTables, LookupQuery};
use crate::replay::{ReplayError, ReplayStats, Replayer};
use crate::trace::Record;

/// The replay's tier as the engine's connector: each hook a record for `replayer`, through
/// `stats` when given (`keys` is scratch).
#[derive(Debug)]
pub struct TierConnector<'a> {
    stats: Option<&'a mut ReplayStats>,
    replayer: &'a mut Replayer,
    keys: &'a mut Vec<BlockKey>,
}

impl<'a> TierConnector<'a> {
    /// The connector over `replayer`, each hook a record applied through `stats` when given
    /// (`keys` is scratch).
    #[must_use]
    pub fn new(
        stats: Option<&'a mut ReplayStats>,
        replayer: &'a mut Replayer,
        keys: &'a mut Vec<BlockKey>,
    ) -> Self {
        TierConnector {
            stats,
            replayer,
            keys,
        }
    }

    fn record(&mut self, rec: Record<'_>) -> Result<(), ReplayError> {
        match self.stats.as_deref_mut() {
            Some(stats) => stats.apply(self.replayer, rec),
            None => self.replayer.apply(rec),
        }
    }
}

impl Connector for TierConnector<'_> {
    type Error = ReplayError;

    fn lookup(&mut self, q: &LookupQuery<'_>) -> Result<usize, ReplayError> {
        let remaining = q.remaining();
        let scan = remaining.get(..q.max_hit_blocks).unwrap_or(remaining);
        self.keys.clear();
        self.keys.extend(scan.iter().map(|&h| BlockKey::new(h, 0)));
        Ok(self.replayer.manager().scan_hit_prefix(self.keys).hits)
    }

    fn allocated(
        &mut self,
        _gpu: &mut BlockPool<BlockKey>,
        q: &LookupQuery<'_>,
        _tables: GroupTables<'_>,
        _external_blocks: usize,
    ) -> Result<(), ReplayError> {
        self.replayer.set_max_hits(q.max_hit_blocks);
        let rec = Record::Load {
            rid: q.rid,
            hashes: q.remaining(),
        };
        // The scan repeats `lookup`'s, with nothing changed in between: the same hits.
        self.record(rec)
    }

    fn prefill_done(&mut self, rid: u64) -> Result<(), ReplayError> {
        self.record(Record::Start { rid })
    }

    fn finished(
        &mut self,
        _gpu: &mut BlockPool<BlockKey>,
        req: &FinishedRequest<'_>,
    ) -> Result<(), ReplayError> {
        self.record(Record::Complete { rid: req.rid })
    }
}
