//! [`ReplayError`]: why a record could not be replayed.

use std::fmt;

use kvtier_core::manager::{CompleteLoadError, LoadError, RequestError, StoreError};

/// Why a record could not be replayed. The reader already rejects the order errors for files;
/// the replayer checks again so that any record source is safe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReplayError {
    /// An `L` for a request that is already open.
    DuplicateRequest(u64),
    /// An `S` or `C` for a request that is not open.
    UnknownRequest(u64),
    /// An `S` twice, or a `C` before the `S`.
    OutOfOrder(u64),
    /// An `L` arriving while the manager already holds `max_requests` requests in flight.
    TooManyRequests {
        /// The request id.
        rid: u64,
        /// The manager's `max_requests`.
        max_requests: u32,
    },
    /// An `L` whose blocks would bring the open requests' blocks past the replayer's
    /// [`Replayer::with_max_open_blocks`](super::Replayer::with_max_open_blocks) limit.
    TooManyOpenBlocks {
        /// The request id.
        rid: u64,
        /// The request's blocks.
        blocks: u64,
        /// The blocks of the requests already open.
        open: u64,
        /// The limit.
        max_open_blocks: u64,
    },
    /// An `L` whose blocks after its leading hits (the keys its `S` offers to `prepare_store`)
    /// repeat a hash: the manager refuses an offer holding a key twice.
    RepeatedHash {
        /// The request id.
        rid: u64,
        /// The repeated hash.
        hash: u64,
        /// The 1-based block of its first occurrence.
        first: u64,
        /// The 1-based block of the repeat.
        repeat: u64,
    },
    /// An `L` whose last end-token position, `blocks · block_tokens`, exceeds `i64::MAX`.
    PositionTooLarge {
        /// The request id.
        rid: u64,
    },
    /// The replayer's buffers could not grow to hold the `L`'s blocks: out of memory.
    OutOfMemory {
        /// The request id.
        rid: u64,
    },
    /// The manager refused a request context or finishing it (a bug: the handle is live).
    Request(RequestError),
    /// The manager refused a load (a bug: the keys were just looked up).
    Load(LoadError),
    /// The manager refused to complete a load (a bug: the keys were pinned by this request).
    CompleteLoad(CompleteLoadError),
    /// The manager refused a store (a bug: the `L` checks every documented cause).
    Store(StoreError),
}

impl fmt::Display for ReplayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReplayError::DuplicateRequest(r) => write!(f, "request {r} arrived twice"),
            ReplayError::UnknownRequest(r) => write!(f, "request {r} is not open"),
            ReplayError::OutOfOrder(r) => write!(f, "request {r}: records out of order"),
            ReplayError::TooManyRequests { rid, max_requests } => write!(
                f,
                "request {rid} arrives while {max_requests} requests are in flight, the \
                 manager's max_requests"
            ),
            ReplayError::TooManyOpenBlocks {
                rid,
                blocks,
                open,
                max_open_blocks,
            } => write!(
                f,
                "request {rid}'s {blocks} blocks would bring the open requests to {} blocks, \
                 over the limit of {max_open_blocks}",
                open.saturating_add(*blocks)
            ),
            ReplayError::RepeatedHash {
                rid,
                hash,
                first,
                repeat,
            } => write!(
                f,
                "request {rid} repeats block hash {hash:016x} (blocks {first} and {repeat}) in \
                 the blocks it would store: a store offer cannot hold a key twice"
            ),
            ReplayError::PositionTooLarge { rid } => write!(
                f,
                "request {rid}: its end-token positions (blocks · block_tokens) exceed i64::MAX"
            ),
            ReplayError::OutOfMemory { rid } => {
                write!(f, "request {rid}: out of memory for its blocks")
            }
            ReplayError::Request(e) => write!(f, "{e}"),
            ReplayError::Load(e) => write!(f, "{e}"),
            ReplayError::CompleteLoad(e) => write!(f, "{e}"),
            ReplayError::Store(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ReplayError {}
