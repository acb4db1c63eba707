//! One small error type per [`BlockPool`](super::BlockPool) operation. Nothing changes on error.

use core::fmt;

/// Why [`BlockPool::new`](super::BlockPool::new) failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NewPoolError {
    /// `num_blocks` was 0; the pool needs at least the null block (vLLM asserts `> 0`).
    ZeroBlocks,
    /// The per-block tables could not be allocated.
    AllocFailed {
        /// The number of blocks asked for.
        num_blocks: u32,
    },
}

impl fmt::Display for NewPoolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            NewPoolError::ZeroBlocks => {
                f.write_str("a block pool needs at least one block (the null block), got 0")
            }
            NewPoolError::AllocFailed { num_blocks } => {
                write!(f, "cannot allocate a block pool of {num_blocks} blocks")
            }
        }
    }
}

impl core::error::Error for NewPoolError {}

/// [`BlockPool::get_new_blocks`](super::BlockPool::get_new_blocks) asked for more blocks than
/// are free.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GetBlocksError {
    /// Blocks asked for.
    pub requested: u32,
    /// Blocks free.
    pub free: u32,
}

impl fmt::Display for GetBlocksError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cannot get {} free blocks from the pool: only {} are free",
            self.requested, self.free
        )
    }
}

impl core::error::Error for GetBlocksError {}

/// A block id not below the pool's `num_blocks`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutOfRange {
    /// The id given.
    pub block: u32,
    /// The pool's number of blocks.
    pub num_blocks: u32,
}

impl fmt::Display for OutOfRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "block id {} is out of range for a pool of {} blocks",
            self.block, self.num_blocks
        )
    }
}

impl core::error::Error for OutOfRange {}

/// Why [`BlockPool::touch`](super::BlockPool::touch) failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TouchError {
    /// A block id was out of range.
    OutOfRange(OutOfRange),
    /// A block's reference count would pass `u32::MAX`.
    RefCountOverflow {
        /// The block.
        block: u32,
    },
}

impl fmt::Display for TouchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            TouchError::OutOfRange(e) => write!(f, "cannot touch: {e}"),
            TouchError::RefCountOverflow { block } => {
                write!(
                    f,
                    "cannot touch block {block}: its reference count is at u32::MAX"
                )
            }
        }
    }
}

impl core::error::Error for TouchError {}

/// Why [`BlockPool::free_blocks`](super::BlockPool::free_blocks) failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FreeError {
    /// A block id was out of range.
    OutOfRange(OutOfRange),
    /// A block would be freed more often than it is referenced (its count would go below 0).
    NotInUse {
        /// The block.
        block: u32,
    },
}

impl fmt::Display for FreeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            FreeError::OutOfRange(e) => write!(f, "cannot free: {e}"),
            FreeError::NotInUse { block } => {
                write!(
                    f,
                    "cannot free block {block}: it is not in use (reference count 0)"
                )
            }
        }
    }
}

impl core::error::Error for FreeError {}

/// Why [`BlockPool::cache_full_blocks`](super::BlockPool::cache_full_blocks) failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheError {
    /// `block_size` was 0.
    ZeroBlockSize,
    /// `num_full_blocks` exceeds the number of blocks given.
    BlocksTooShort {
        /// `num_full_blocks`.
        num_full_blocks: u32,
        /// The number of blocks given.
        len: usize,
    },
    /// `num_full_blocks` exceeds the number of keys given.
    KeysTooShort {
        /// `num_full_blocks`.
        num_full_blocks: u32,
        /// The number of keys given.
        len: usize,
    },
    /// The mask's length is not `num_full_blocks − num_cached_blocks`.
    MaskLength {
        /// The length required.
        expected: usize,
        /// The length given.
        len: usize,
    },
    /// A block id was out of range.
    OutOfRange(OutOfRange),
    /// A block already holds a hash covering at least as many tokens (vLLM asserts here; only
    /// a hash over fewer tokens may be replaced).
    AlreadyHashed {
        /// The block.
        block: u32,
        /// Tokens covered by its current hash.
        num_tokens: u64,
        /// Tokens the new hash would cover.
        new_num_tokens: u64,
    },
}

impl fmt::Display for CacheError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            CacheError::ZeroBlockSize => f.write_str("cannot cache blocks: block_size is 0"),
            CacheError::BlocksTooShort {
                num_full_blocks,
                len,
            } => write!(
                f,
                "cannot cache {num_full_blocks} full blocks: only {len} blocks given"
            ),
            CacheError::KeysTooShort {
                num_full_blocks,
                len,
            } => write!(
                f,
                "cannot cache {num_full_blocks} full blocks: only {len} keys given"
            ),
            CacheError::MaskLength { expected, len } => write!(
                f,
                "block mask has {len} entries, expected one per new full block ({expected})"
            ),
            CacheError::OutOfRange(e) => write!(f, "cannot cache: {e}"),
            CacheError::AlreadyHashed {
                block,
                num_tokens,
                new_num_tokens,
            } => write!(
                f,
                "block {block} already has a hash over {num_tokens} tokens; \
                 a new hash over {new_num_tokens} tokens cannot replace it"
            ),
        }
    }
}

impl core::error::Error for CacheError {}

/// Why [`BlockPool::insert_hash`](super::BlockPool::insert_hash) failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InsertHashError {
    /// The block id was out of range.
    OutOfRange(OutOfRange),
    /// The null block never holds a hash.
    NullBlock,
    /// The block holds another hash.
    AlreadyHashed {
        /// The block.
        block: u32,
    },
    /// Every secondary hash the pool has room for is in use
    /// ([`BlockPoolConfig::secondary_capacity`](super::BlockPoolConfig::secondary_capacity)).
    NoSecondaryRoom {
        /// The block.
        block: u32,
    },
}

impl fmt::Display for InsertHashError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            InsertHashError::OutOfRange(e) => write!(f, "cannot insert a hash: {e}"),
            InsertHashError::NullBlock => f.write_str("the null block cannot hold a hash"),
            InsertHashError::AlreadyHashed { block } => {
                write!(f, "block {block} already holds another hash")
            }
            InsertHashError::NoSecondaryRoom { block } => write!(
                f,
                "no room for another secondary hash of block {block} (secondary_capacity)"
            ),
        }
    }
}

impl core::error::Error for InsertHashError {}
