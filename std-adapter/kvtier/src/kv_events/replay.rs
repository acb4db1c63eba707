//! The replay side of the stream, as vLLM answers on its ROUTER socket: the buffer of the
//! last `buffer_steps` batches ([`ReplayBuffer`]), a request's start sequence
//! ([`start_sequence`]) and the end marker ([`end_marker`], [`END_SEQ`]).
//!
//! A client (a DEALER sending `("", start)`, or a REQ sending `start`) gets, for every
//! buffered batch numbered `start` or later, the frames `("", topic, seq, payload)`, then
//! `("", "", END_SEQ, "")`.

use std::collections::VecDeque;

/// The sequence frame of the end marker: −1 as 8 bytes big-endian (all ones).
pub const END_SEQ: [u8; 8] = (-1i64).to_be_bytes();

/// The frames that end a replay to client `id`: `(id, "", "", END_SEQ, "")`.
#[must_use]
pub fn end_marker(id: &[u8]) -> [&[u8]; 5] {
    [id, b"", b"", &END_SEQ, b""]
}

/// A request's start sequence as vLLM reads it: the frame's bytes as one unsigned big-endian
/// integer of any length (empty is 0). A value past `u64::MAX` is `u64::MAX` (no batch is
/// numbered that high, so only the end marker answers it, as in vLLM).
///
/// ```
/// use kvtier::kv_events::start_sequence;
/// assert_eq!(start_sequence(&7u64.to_be_bytes()), 7);
/// assert_eq!(start_sequence(&[]), 0);
/// assert_eq!(start_sequence(&[1, 0]), 256);
/// assert_eq!(start_sequence(&[1; 9]), u64::MAX);
/// ```
#[must_use]
pub fn start_sequence(frame: &[u8]) -> u64 {
    let lead = frame.len().saturating_sub(8);
    if frame[..lead].iter().any(|b| *b != 0) {
        return u64::MAX;
    }
    frame[lead..]
        .iter()
        .fold(0u64, |acc, b| (acc << 8) | u64::from(*b))
}

/// The last `steps` batches sent, with their sequence numbers.
#[derive(Clone, Debug)]
pub struct ReplayBuffer {
    steps: usize,
    batches: VecDeque<(u64, Vec<u8>)>,
}

impl ReplayBuffer {
    /// An empty buffer holding at most `steps` batches (0: replays only the end marker).
    #[must_use]
    pub fn new(steps: usize) -> Self {
        ReplayBuffer {
            steps,
            batches: VecDeque::new(),
        }
    }

    /// Keeps batch `seq`, forgetting the oldest past the bound.
    pub fn push(&mut self, seq: u64, payload: Vec<u8>) {
        if self.steps == 0 {
            return;
        }
        if self.batches.len() == self.steps {
            self.batches.pop_front();
        }
        self.batches.push_back((seq, payload));
    }

    /// The buffered batches numbered `start` or later, oldest first.
    pub fn from(&self, start: u64) -> impl Iterator<Item = (u64, &[u8])> {
        self.batches
            .iter()
            .filter(move |(seq, _)| *seq >= start)
            .map(|(seq, p)| (*seq, p.as_slice()))
    }

    /// Batches held.
    #[must_use]
    pub fn len(&self) -> usize {
        self.batches.len()
    }

    /// Whether no batch is held.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.batches.is_empty()
    }
}
