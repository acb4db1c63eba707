//! The bounded event queue: stored and removed notifications, kept until `take_events`.

use alloc::vec::Vec;

use crate::reserve::{AllocError, array_bytes, with_capacity};

/// What an [`OffloadEvent`] announces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// The keys' stores completed; they are readable (`removed = false`).
    Stored,
    /// The keys were evicted (`removed = true`).
    Removed,
    /// The keys' stores failed and their slots were released (`removed = true`,
    /// `metadata_only = true`): cleanup, not a public eviction. When drained, the event keeps
    /// only the keys that are still absent, and is dropped if none is.
    RemovedMetadataOnly,
}

impl EventKind {
    /// vLLM's `removed` flag.
    #[must_use]
    pub fn removed(self) -> bool {
        !matches!(self, EventKind::Stored)
    }

    /// vLLM's `metadata_only` flag.
    #[must_use]
    pub fn metadata_only(self) -> bool {
        matches!(self, EventKind::RemovedMetadataOnly)
    }
}

/// One drained event: its kind and its keys, borrowed from the manager.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OffloadEvent<'a, K> {
    /// What happened.
    pub kind: EventKind,
    /// To which keys, in the order vLLM lists them.
    pub keys: &'a [K],
}

#[derive(Clone, Copy, Debug)]
struct Header {
    kind: EventKind,
    start: u32,
    len: u32,
}

/// A queue holding at most `max_keys` keys (over all undrained events); an event that does not
/// fit is dropped whole and counted.
#[derive(Clone, Debug)]
pub(crate) struct EventQueue<K> {
    keys: Vec<K>,
    headers: Vec<Header>,
    max_keys: u32,
    pub(crate) dropped_events: u64,
    pub(crate) dropped_keys: u64,
}

impl<K: Copy> EventQueue<K> {
    /// The bytes [`EventQueue::new`] allocates for `max_keys` keys.
    pub(crate) fn bytes(max_keys: u64) -> u64 {
        array_bytes(max_keys, core::mem::size_of::<K>())
            .saturating_add(array_bytes(max_keys, core::mem::size_of::<Header>()))
    }

    pub(crate) fn new(max_keys: u32) -> Result<Self, AllocError> {
        Ok(EventQueue {
            keys: with_capacity(max_keys as usize)?,
            headers: with_capacity(max_keys as usize)?,
            max_keys,
            dropped_events: 0,
            dropped_keys: 0,
        })
    }

    /// Queues one event for `keys` (nothing when `keys` is empty).
    pub(crate) fn push(&mut self, kind: EventKind, keys: impl ExactSizeIterator<Item = K>) {
        let n = keys.len();
        if n == 0 {
            return;
        }
        let used = self.keys.len();
        if used + n > self.max_keys as usize {
            self.dropped_events = self.dropped_events.saturating_add(1);
            self.dropped_keys = self.dropped_keys.saturating_add(n as u64);
            return;
        }
        self.keys.extend(keys);
        #[expect(
            clippy::cast_possible_truncation,
            reason = "bounded by max_keys, a u32"
        )]
        self.headers.push(Header {
            kind,
            start: used as u32,
            len: n as u32,
        });
    }

    /// Drains every event in order, filtering metadata-only removals to the keys for which
    /// `still_absent` holds and skipping them when none is left.
    pub(crate) fn drain(
        &mut self,
        mut still_absent: impl FnMut(&K) -> bool,
        mut f: impl FnMut(OffloadEvent<'_, K>),
    ) {
        for h in &self.headers {
            let range = h.start as usize..(h.start + h.len) as usize;
            if h.kind == EventKind::RemovedMetadataOnly {
                // Compact the kept keys to the front of the event's own range.
                let mut kept = range.start;
                for i in range.clone() {
                    let k = self.keys[i];
                    if still_absent(&k) {
                        self.keys[kept] = k;
                        kept += 1;
                    }
                }
                if kept > range.start {
                    f(OffloadEvent {
                        kind: h.kind,
                        keys: &self.keys[range.start..kept],
                    });
                }
            } else {
                f(OffloadEvent {
                    kind: h.kind,
                    keys: &self.keys[range],
                });
            }
        }
        self.headers.clear();
        self.keys.clear();
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.keys.capacity() * core::mem::size_of::<K>()
            + self.headers.capacity() * core::mem::size_of::<Header>()
    }
}
