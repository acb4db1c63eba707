//! The request-order check of a kvtrace (one `L`, then one `S`, then one `C` per request), in
//! memory bounded by the requests in flight plus the gaps between completed ids (both capped).

use std::collections::BTreeMap;

use kvtier_core::hashing::{FixedState, Map};

use super::error::TraceErrorKind;
use super::record::RecordKind;

/// A set of `u64` kept as disjoint, non-adjacent inclusive intervals: tiny when the ids are dense.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct IntervalSet {
    /// start → end (inclusive); no two intervals overlap or touch.
    ranges: BTreeMap<u64, u64>,
    len: u64,
}

impl IntervalSet {
    /// Whether `id` is in the set.
    pub(crate) fn contains(&self, id: u64) -> bool {
        self.ranges
            .range(..=id)
            .next_back()
            .is_some_and(|(_, &end)| id <= end)
    }

    /// Adds `id`; `false` (and no change) if it was already there.
    pub(crate) fn insert(&mut self, id: u64) -> bool {
        let below = self.ranges.range(..=id).next_back().map(|(&s, &e)| (s, e));
        if below.is_some_and(|(_, end)| id <= end) {
            return false;
        }
        let joins_below = below.filter(|&(_, end)| end.checked_add(1) == Some(id));
        let above = id
            .checked_add(1)
            .and_then(|next| self.ranges.get(&next).map(|&end| (next, end)));
        match (joins_below, above) {
            (Some((start, _)), Some((next, end))) => {
                self.ranges.remove(&next);
                self.ranges.insert(start, end);
            }
            (Some((start, _)), None) => {
                self.ranges.insert(start, id);
            }
            (None, Some((next, end))) => {
                self.ranges.remove(&next);
                self.ranges.insert(id, end);
            }
            (None, None) => {
                self.ranges.insert(id, id);
            }
        }
        self.len = self.len.saturating_add(1);
        true
    }

    /// The number of ids in the set.
    pub(crate) const fn len(&self) -> u64 {
        self.len
    }

    /// The number of disjoint intervals held (what the memory use grows with).
    pub(crate) fn intervals(&self) -> usize {
        self.ranges.len()
    }
}

/// The state of an open request: loaded (`L` seen) or started (`S` seen), with its `L`'s line.
#[derive(Clone, Copy, Debug)]
struct Open {
    started: bool,
    line: u64,
}

/// Checks the L → S → C order of every request.
#[derive(Debug)]
pub(crate) struct RequestTracker {
    open: Map<u64, Open>,
    closed: IntervalSet,
    max_open: usize,
    max_ranges: usize,
}

impl RequestTracker {
    /// A tracker of at most `max_open` open requests whose completed ids form at most
    /// `max_ranges` ranges.
    pub(crate) fn new(max_open: usize, max_ranges: usize) -> Self {
        RequestTracker {
            open: Map::with_hasher(FixedState::default()),
            closed: IntervalSet::default(),
            max_open,
            max_ranges,
        }
    }

    /// Records the `L` of `rid` at `line`.
    pub(crate) fn load(&mut self, rid: u64, line: u64) -> Result<(), TraceErrorKind> {
        if self.open.contains_key(&rid) {
            return Err(TraceErrorKind::RepeatedLoad {
                rid,
                completed: false,
            });
        }
        if self.closed.contains(rid) {
            return Err(TraceErrorKind::RepeatedLoad {
                rid,
                completed: true,
            });
        }
        if self.open.len() >= self.max_open {
            return Err(TraceErrorKind::TooManyOpenRequests);
        }
        self.open.insert(
            rid,
            Open {
                started: false,
                line,
            },
        );
        Ok(())
    }

    fn missing(&self, record: RecordKind, rid: u64) -> TraceErrorKind {
        if self.closed.contains(rid) {
            TraceErrorKind::AfterComplete { record, rid }
        } else {
            TraceErrorKind::UnknownRequest { record, rid }
        }
    }

    /// Records the `S` of `rid`.
    pub(crate) fn start(&mut self, rid: u64) -> Result<(), TraceErrorKind> {
        let Some(open) = self.open.get_mut(&rid) else {
            return Err(self.missing(RecordKind::Start, rid));
        };
        if open.started {
            return Err(TraceErrorKind::RepeatedStart { rid });
        }
        open.started = true;
        Ok(())
    }

    /// Records the `C` of `rid`.
    pub(crate) fn complete(&mut self, rid: u64) -> Result<(), TraceErrorKind> {
        match self.open.get(&rid) {
            None => Err(self.missing(RecordKind::Complete, rid)),
            Some(open) if !open.started => Err(TraceErrorKind::CompleteBeforeStart { rid }),
            Some(_) => {
                self.open.remove(&rid);
                self.closed.insert(rid);
                if self.closed.intervals() > self.max_ranges {
                    return Err(TraceErrorKind::SparseRequestIds);
                }
                Ok(())
            }
        }
    }

    /// The number of open requests.
    pub(crate) fn open_count(&self) -> usize {
        self.open.len()
    }

    /// The open request with the smallest id and its `L`'s line (independent of map order).
    pub(crate) fn first_open(&self) -> Option<(u64, u64)> {
        self.open
            .iter()
            .min_by_key(|(rid, _)| **rid)
            .map(|(&rid, open)| (rid, open.line))
    }

    /// The completed ids.
    pub(crate) fn closed(&self) -> &IntervalSet {
        &self.closed
    }
}
