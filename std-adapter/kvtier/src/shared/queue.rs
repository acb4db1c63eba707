//! [`Inbox`]: the stats collector's queue, first in first out, bounded by bytes and by
//! messages. A data message waits for room (back-pressure); a control message (flush, stop)
//! never waits and is not counted against the bounds; a pop waits for a message or a deadline.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

// The collector's threads are OS threads, never modelled by loom: std's primitives, not the
// facade's.

/// The queue is closed: the message was not taken (it is handed back).
#[derive(Debug)]
pub(crate) struct Closed<T>(pub(crate) T);

#[derive(Debug)]
struct Entry<T> {
    item: T,
    /// Accounted bytes; `None` for a control message (outside the bounds).
    bytes: Option<usize>,
}

#[derive(Debug)]
struct State<T> {
    entries: VecDeque<Entry<T>>,
    /// Accounted bytes of the data messages queued.
    bytes: usize,
    /// Data messages queued.
    frames: usize,
    /// The most bytes ever queued at once.
    peak_bytes: usize,
    closed: bool,
}

/// A bounded first-in first-out queue (see the [module docs](self)).
#[derive(Debug)]
pub(crate) struct Inbox<T> {
    state: Mutex<State<T>>,
    not_empty: Condvar,
    not_full: Condvar,
    max_bytes: usize,
    max_frames: usize,
}

impl<T> Inbox<T> {
    /// A queue of at most `max_bytes` accounted bytes and `max_frames` data messages (each at
    /// least 1).
    pub(crate) fn new(max_bytes: usize, max_frames: usize) -> Self {
        Inbox {
            state: Mutex::new(State {
                entries: VecDeque::new(),
                bytes: 0,
                frames: 0,
                peak_bytes: 0,
                closed: false,
            }),
            not_empty: Condvar::new(),
            not_full: Condvar::new(),
            max_bytes: max_bytes.max(1),
            max_frames: max_frames.max(1),
        }
    }

    /// The state (nothing panics while it is locked, so a poisoned lock still holds a
    /// consistent queue).
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The most bytes one data message may account for.
    pub(crate) fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    /// Queues a data message of `bytes` accounted bytes (at most [`max_bytes`](Self::max_bytes)),
    /// waiting while it does not fit.
    pub(crate) fn push(&self, item: T, bytes: usize) -> Result<(), Closed<T>> {
        let mut st = self.lock();
        loop {
            if st.closed {
                return Err(Closed(item));
            }
            let fits = st.frames < self.max_frames
                && st
                    .bytes
                    .checked_add(bytes)
                    .is_some_and(|b| b <= self.max_bytes);
            // A message larger than the whole bound is taken into an empty queue, so it cannot
            // wait forever (callers keep messages within the bound).
            if fits || st.frames == 0 {
                break;
            }
            st = self
                .not_full
                .wait(st)
                .unwrap_or_else(PoisonError::into_inner);
        }
        st.bytes = st.bytes.saturating_add(bytes);
        st.frames += 1;
        st.peak_bytes = st.peak_bytes.max(st.bytes);
        st.entries.push_back(Entry {
            item,
            bytes: Some(bytes),
        });
        drop(st);
        self.not_empty.notify_one();
        Ok(())
    }

    /// Queues a control message, behind every message queued so far, without waiting.
    pub(crate) fn push_control(&self, item: T) -> Result<(), Closed<T>> {
        let mut st = self.lock();
        if st.closed {
            return Err(Closed(item));
        }
        st.entries.push_back(Entry { item, bytes: None });
        drop(st);
        self.not_empty.notify_one();
        Ok(())
    }

    fn take(&self, st: &mut State<T>) -> Option<T> {
        let entry = st.entries.pop_front()?;
        if let Some(b) = entry.bytes {
            st.bytes = st.bytes.saturating_sub(b);
            st.frames = st.frames.saturating_sub(1);
            // Room for messages of any size: wake every waiting sender.
            self.not_full.notify_all();
        }
        Some(entry.item)
    }

    /// The oldest message, waiting for one until `deadline` (`None` then), or for as long as
    /// it takes without a deadline.
    pub(crate) fn pop_by(&self, deadline: Option<Instant>) -> Option<T> {
        let mut st = self.lock();
        loop {
            if let Some(item) = self.take(&mut st) {
                return Some(item);
            }
            let Some(deadline) = deadline else {
                st = self
                    .not_empty
                    .wait(st)
                    .unwrap_or_else(PoisonError::into_inner);
                continue;
            };
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            st = self
                .not_empty
                .wait_timeout(st, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// The oldest message, if any, without waiting.
    pub(crate) fn try_pop(&self) -> Option<T> {
        let mut st = self.lock();
        self.take(&mut st)
    }

    /// Refuses every later push; senders waiting for room get their message back.
    pub(crate) fn close(&self) {
        self.lock().closed = true;
        self.not_full.notify_all();
    }

    /// (accounted bytes queued, data messages queued, the most bytes ever queued at once).
    pub(crate) fn levels(&self) -> (usize, usize, usize) {
        let st = self.lock();
        (st.bytes, st.frames, st.peak_bytes)
    }
}
