//! The policy behind a manager (LRU or ARC) and the request bookkeeping that feeds it: vLLM's
//! record of a request's cache accesses and the key order a finished request commits.

use alloc::vec::Vec;

use super::PositionError;
use super::arc::Arc;
use super::chunks::Chunks;
use super::links;
use super::lru::Lru;
use super::request::{INSERTED, REUSED, RequestState};
use crate::key::OffloadKey;

/// The eviction policy of one manager.
#[derive(Clone, Debug)]
pub(crate) enum Policy {
    Lru(Lru),
    Arc(Arc),
}

/// Checks an optional positions slice against the keys.
pub(crate) fn check_positions(
    keys: usize,
    end_tokens: Option<&[u64]>,
) -> Result<(), PositionError> {
    let Some(p) = end_tokens else { return Ok(()) };
    if p.len() != keys {
        return Err(PositionError::LengthMismatch {
            keys,
            positions: p.len(),
        });
    }
    match p.iter().position(|&v| v > i64::MAX as u64) {
        Some(index) => Err(PositionError::TooLarge { index }),
        None => Ok(()),
    }
}

/// vLLM's `_record_request_cache_access` for one call, key by key: marks each entry seen (in
/// order), marks one flagged `reused` as reused unless this request inserted it, and tells the
/// policy about each newly seen one. The request's LRU rank is taken at the call's first newly
/// seen key (vLLM takes it once per call that sees a new key, before ranking them; nothing
/// between the two touches the policy).
pub(crate) struct Access {
    req_index: u32,
    major: Option<u64>,
}

impl Access {
    /// One call's access record for the request in slot `req_index`.
    pub(crate) const fn new(req_index: u32) -> Self {
        Access {
            req_index,
            major: None,
        }
    }

    /// Records entry `e`, `reused` or not, with its slot when resident (`NIL` when absent,
    /// which the caller has just looked up).
    #[inline(always)]
    pub(crate) fn record<K: OffloadKey>(
        &mut self,
        st: &mut RequestState<K>,
        e: u32,
        reused: bool,
        slot: u32,
        policy: &mut Policy,
        chunks: &Chunks<K>,
    ) {
        let new = st.observe(e);
        let entry = &mut st.entries[e as usize];
        if slot != links::NIL {
            entry.slot = slot;
        }
        if reused && entry.flags & INSERTED == 0 {
            entry.flags |= REUSED;
        }
        if new && let Policy::Lru(lru) = policy {
            let pos = entry.pos();
            let major = match self.major {
                Some(m) => m,
                None => *self
                    .major
                    .insert(lru.begin_access(&mut st.rank, self.req_index)),
            };
            if let (Some(p), true) = (pos, slot != links::NIL) {
                lru.on_access(
                    slot,
                    p,
                    major,
                    self.req_index,
                    chunks.keys(),
                    &mut st.displaced,
                );
            }
        }
    }
}

/// The request's seen keys head to tail, as vLLM orders them for `on_request_finished`:
/// `st.observed` itself when it is already in that order, else sorted into `scratch`.
pub(crate) fn order_keys<'a, K: OffloadKey>(
    st: &'a RequestState<K>,
    scratch: &'a mut Vec<u32>,
) -> &'a [u32] {
    if st.in_order {
        return &st.observed;
    }
    scratch.clear();
    scratch.extend_from_slice(&st.observed);
    let order = &mut scratch[..];
    let es = &st.entries;
    if order.iter().all(|&i| es[i as usize].pos().is_some()) {
        // (position, group, observation order).
        order.sort_unstable_by_key(|&i| {
            let e = &es[i as usize];
            (e.pos(), e.key.group(), e.seq)
        });
        return scratch;
    }
    order.sort_unstable_by_key(|&i| (es[i as usize].key.group(), es[i as usize].seq));
    // Within each group, by position if every key of the group has one.
    let mut start = 0;
    while start < order.len() {
        let g = es[order[start] as usize].key.group();
        let mut end = start;
        while end < order.len() && es[order[end] as usize].key.group() == g {
            end += 1;
        }
        let run = &mut order[start..end];
        if run.iter().all(|&i| es[i as usize].pos().is_some()) {
            run.sort_unstable_by_key(|&i| (es[i as usize].pos(), es[i as usize].seq));
        }
        start = end;
    }
    scratch
}
