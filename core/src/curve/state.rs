//! What the one-pass LRU stack ([`LruStack`](super::LruStack)) knows of each key and of each
//! open request.

use alloc::vec::Vec;

use super::CurveError;
use crate::hashing::Map;

/// No handle (a key met for the first time).
pub(super) const NONE: u32 = u32::MAX;

/// What the stack knows of one key.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct KeyState {
    pub(super) key: u64,
    /// Its time stamp; 0 while its slot is free.
    pub(super) ts: u32,
    /// Below this capacity the key is not readable: an open request met it absent there and
    /// its store has not completed (0: readable wherever resident).
    pub(super) floor: u32,
    /// The open request (`rid + 1`, 0: none yet) whose store holds the key below its floor:
    /// the first of the requests holding it to reach its store phase.
    pub(super) storer: u64,
    /// The last batch of moves that moved it.
    pub(super) batch: u32,
    /// Its live refresh shadow's id (see [`Shadows`](super::shadows::Shadows)), 0 for none.
    pub(super) shadow: u32,
    /// While an open request holds it resident behind a miss: the mark of its old stamp
    /// (where it really stands), 0 otherwise.
    pub(super) y_mark: u32,
}

/// The keys the stack knows, each in a slot named by a handle it keeps while it is known: the
/// stamps name their keys by handle, so a compaction renumbers them without the map, and an
/// open request remembers its keys' handles, so its store and its end need no look-up.
#[derive(Clone, Debug, Default)]
pub(super) struct Slots {
    pub(super) states: Vec<KeyState>,
    pub(super) free: Vec<u32>,
}

impl Slots {
    /// Room for `n` more keys, so that [`add`](Self::add) and [`drop`](Self::drop) need no
    /// allocation.
    pub(super) fn reserve(&mut self, n: usize) -> Result<(), CurveError> {
        let total = self.states.len() + n;
        self.states
            .try_reserve(n)
            .and_then(|()| self.free.try_reserve(total.saturating_sub(self.free.len())))
            .map_err(|_| CurveError::OutOfMemory)
    }

    /// A slot for `key`, its stamp 0.
    pub(super) fn add(&mut self, key: u64) -> u32 {
        let fresh = KeyState {
            key,
            ..KeyState::default()
        };
        if let Some(h) = self.free.pop() {
            self.states[h as usize] = fresh;
            return h;
        }
        self.states.push(fresh);
        #[expect(clippy::cast_possible_truncation, reason = "one slot per stamp, u32")]
        {
            (self.states.len() - 1) as u32
        }
    }

    /// Frees slot `h`.
    pub(super) fn drop(&mut self, h: u32) {
        self.states[h as usize].ts = 0;
        self.free.push(h);
    }

    /// `hint` when it is still `key`'s slot, else `key`'s slot from the map.
    #[inline]
    pub(super) fn find(&self, map: &Map<u64, u32>, key: u64, hint: u32) -> Option<u32> {
        match self.states.get(hint as usize) {
            Some(st) if st.ts != 0 && st.key == key => Some(hint),
            _ => map.get(&key).copied(),
        }
    }

    pub(super) fn heap_bytes(&self) -> usize {
        self.states.capacity() * size_of::<KeyState>() + self.free.capacity() * 4
    }
}

/// One open request.
#[derive(Clone, Debug, Default)]
pub(super) struct Open {
    pub(super) keys: Vec<u64>,
    /// Per key: its slot when last met ([`NONE`] before its first move).
    pub(super) hs: Vec<u32>,
    /// Per key: the capacity from which it was resident when the request arrived.
    pub(super) pre: Vec<u32>,
    /// Per key: `(u32::MAX, _)` when the request never observes it (pending under another store at
    /// every capacity that offers it, so its end does not refresh it); `(f, storer)` when it
    /// is pending under `storer`'s store below capacity `f` only; `(0, 0)` otherwise.
    pub(super) skip: Vec<(u32, u64)>,
    /// The first stamp its arrival gave.
    pub(super) ts_start: u32,
    pub(super) started: bool,
}
