//! The manager's per-operation errors. On any error the manager is unchanged.

use core::fmt;

use super::request::RequestError;

/// Why `prepare_load` refused (vLLM asserts instead).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LoadError {
    /// The request handle is not live.
    Request(RequestError),
    /// `keys[index]` is not in the tier.
    NotPresent {
        /// Position in the `keys` argument.
        index: usize,
    },
    /// `keys[index]` is still being stored and cannot be read.
    NotReady {
        /// Position in the `keys` argument.
        index: usize,
    },
    /// `keys[index]` already has `i32::MAX` loads in flight.
    TooManyPins {
        /// Position in the `keys` argument.
        index: usize,
    },
    /// The positions do not fit the keys (see [`PositionError`]).
    Positions(PositionError),
    /// `prepare_load_slots` got a different number of slots than keys.
    SlotsMismatch {
        /// Keys given.
        keys: usize,
        /// Slots given.
        slots: usize,
    },
}

/// Why `complete_load` refused (vLLM asserts instead).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CompleteLoadError {
    /// `keys[index]` is not in the tier.
    NotPresent {
        /// Position in the `keys` argument.
        index: usize,
    },
    /// `keys[index]` has no load in flight (counting earlier occurrences in the same call).
    NotPinned {
        /// Position in the `keys` argument.
        index: usize,
    },
}

/// Why `prepare_store` refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreError {
    /// The request handle is not live.
    Request(RequestError),
    /// `keys[index]` repeats an earlier key of the same offer (vLLM would allocate it twice
    /// and leak a slot).
    DuplicateKey {
        /// Position in the `keys` argument.
        index: usize,
    },
    /// The positions do not fit the keys (see [`PositionError`]).
    Positions(PositionError),
    /// Not enough room: `need` chunks had to be evicted but fewer could be (vLLM's
    /// `prepare_store` returning `None`, an allocation failure). No chunk changed; the offer
    /// was still counted, as in vLLM.
    NoRoom {
        /// Chunks that had to be evicted (candidates beyond the free slots).
        need: u32,
        /// Chunks that were idle, including any this offer protected from eviction.
        evictable: u32,
    },
    /// A key table could not grow for this offer
    /// ([`ManagerConfig::grow_tables`](super::ManagerConfig::grow_tables)); nothing changed.
    OutOfMemory,
}

/// A problem with the end-token positions passed alongside keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PositionError {
    /// The positions slice is not as long as the keys slice.
    LengthMismatch {
        /// Keys given.
        keys: usize,
        /// Positions given.
        positions: usize,
    },
    /// A position is above `i64::MAX` (ranks store it negated).
    TooLarge {
        /// Position in the slices.
        index: usize,
    },
}

impl fmt::Display for PositionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PositionError::LengthMismatch { keys, positions } => {
                write!(f, "{positions} end-token positions given for {keys} keys")
            }
            PositionError::TooLarge { index } => {
                write!(f, "end-token position at index {index} exceeds i64::MAX")
            }
        }
    }
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::Request(e) => write!(f, "prepare_load: {e}"),
            LoadError::NotPresent { index } => {
                write!(f, "prepare_load: key at index {index} is not in the tier")
            }
            LoadError::NotReady { index } => write!(
                f,
                "prepare_load: key at index {index} is still being stored and cannot be read"
            ),
            LoadError::TooManyPins { index } => {
                write!(
                    f,
                    "prepare_load: key at index {index} has i32::MAX loads in flight"
                )
            }
            LoadError::Positions(e) => write!(f, "prepare_load: {e}"),
            LoadError::SlotsMismatch { keys, slots } => {
                write!(f, "prepare_load: {keys} keys but {slots} slots")
            }
        }
    }
}

impl fmt::Display for CompleteLoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CompleteLoadError::NotPresent { index } => {
                write!(f, "complete_load: key at index {index} is not in the tier")
            }
            CompleteLoadError::NotPinned { index } => {
                write!(
                    f,
                    "complete_load: key at index {index} has no load in flight"
                )
            }
        }
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Request(e) => write!(f, "prepare_store: {e}"),
            StoreError::DuplicateKey { index } => write!(
                f,
                "prepare_store: key at index {index} repeats an earlier key of the same offer"
            ),
            StoreError::Positions(e) => write!(f, "prepare_store: {e}"),
            StoreError::NoRoom { need, evictable } => write!(
                f,
                "prepare_store: no room: {need} chunks must be evicted and {evictable} are \
                 idle (idle chunks offered by this call cannot be evicted)"
            ),
            StoreError::OutOfMemory => write!(
                f,
                "prepare_store: out of memory growing the key tables for this offer; nothing \
                 changed"
            ),
        }
    }
}

impl core::error::Error for PositionError {}
impl core::error::Error for LoadError {}
impl core::error::Error for CompleteLoadError {}
impl core::error::Error for StoreError {}

impl From<RequestError> for LoadError {
    fn from(e: RequestError) -> Self {
        LoadError::Request(e)
    }
}

impl From<RequestError> for StoreError {
    fn from(e: RequestError) -> Self {
        StoreError::Request(e)
    }
}
