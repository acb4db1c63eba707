//! One small error type per [`SimpleScheduler`](super::SimpleScheduler) operation. Nothing
//! changes on error.

use core::fmt;

/// Why a configuration is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigError {
    /// `block_size` was 0.
    ZeroBlockSize,
    /// `num_gpu_blocks` was 0.
    ZeroGpuBlocks,
    /// `world_size` was 0.
    ZeroWorldSize,
    /// `max_requests` or `max_blocks_per_request` was 0, or `max_requests` above 2^24.
    ZeroBound,
    /// The GPU's KV bytes were 0 (the pool size divides by them).
    ZeroGpuBytes,
    /// An aligned pool size of 0 (the pool needs its null block).
    ZeroCpuBlocks,
    /// An explicit `num_cpu_blocks` outside `1..=local_capacity` (vLLM's `ValueError`).
    ExplicitBlocks {
        /// The count given.
        num_cpu_blocks: u32,
        /// The blocks the byte budget holds.
        local_capacity: u64,
    },
    /// The pool size does not fit in `u32`.
    PoolTooLarge {
        /// The size computed.
        blocks: u64,
    },
    /// A [`Layout`](super::Layout) that is not one.
    Layout {
        /// What is wrong with it.
        why: &'static str,
    },
    /// Block sizes (the scheduler's, the hash block's, the groups') vLLM would refuse.
    BlockSizes {
        /// What is wrong with them.
        why: &'static str,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ConfigError::ZeroBlockSize => f.write_str("block_size must be > 0"),
            ConfigError::ZeroGpuBlocks => f.write_str("num_gpu_blocks must be > 0"),
            ConfigError::ZeroWorldSize => f.write_str("world_size must be > 0"),
            ConfigError::ZeroBound => {
                f.write_str("max_requests must be in 1..=2^24 and max_blocks_per_request > 0")
            }
            ConfigError::ZeroGpuBytes => f.write_str("gpu_total_bytes must be > 0"),
            ConfigError::ZeroCpuBlocks => f.write_str("the CPU pool needs at least one block"),
            ConfigError::ExplicitBlocks {
                num_cpu_blocks,
                local_capacity,
            } => write!(
                f,
                "num_cpu_blocks={num_cpu_blocks} must be between 1 and local offload capacity \
                 {local_capacity}"
            ),
            ConfigError::Layout { why } => write!(f, "invalid KV-cache group layout: {why}"),
            ConfigError::BlockSizes { why } => write!(f, "invalid block sizes: {why}"),
            ConfigError::PoolTooLarge { blocks } => {
                write!(
                    f,
                    "a CPU pool of {blocks} blocks does not fit in u32 block ids"
                )
            }
        }
    }
}

impl core::error::Error for ConfigError {}

/// Why [`SimpleScheduler::new`](super::SimpleScheduler::new) failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NewError {
    /// The configuration is invalid.
    Config(ConfigError),
    /// The tables could not be allocated.
    AllocFailed,
}

impl fmt::Display for NewError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NewError::Config(e) => write!(f, "invalid simple offload config: {e}"),
            NewError::AllocFailed => f.write_str("cannot allocate the simple offloader's tables"),
        }
    }
}

impl core::error::Error for NewError {}

/// An input the caller passed is outside what the scheduler was built for (shared by the
/// operations below).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InputError {
    /// A GPU block id not in the GPU view.
    GpuBlockOutOfRange {
        /// The id.
        block: u32,
    },
    /// Tracking one more request would pass `max_requests`.
    TooManyRequests,
    /// A request's block table or hit would pass `max_blocks_per_request`.
    TooManyBlocks {
        /// The request.
        req: u64,
    },
    /// With events on, a request's block hashes do not cover its computed tokens (the
    /// payloads name them).
    HashesTooShort {
        /// The request.
        req: u64,
    },
    /// A request appears twice in one step's scheduled list.
    DuplicateRequest {
        /// The request.
        req: u64,
    },
    /// The loads registered since the last step name more GPU blocks than the GPU pool has
    /// (each load targets blocks of its own request's table).
    TooManyLoadBlocks,
    /// The GPU view has more blocks than `num_gpu_blocks`.
    GpuPoolSize {
        /// The GPU view's count.
        num_blocks: u32,
    },
}

impl fmt::Display for InputError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            InputError::GpuBlockOutOfRange { block } => {
                write!(f, "GPU block id {block} is out of range")
            }
            InputError::TooManyRequests => f.write_str("max_requests requests are already tracked"),
            InputError::TooManyBlocks { req } => {
                write!(
                    f,
                    "request {req} would hold more than max_blocks_per_request blocks"
                )
            }
            InputError::HashesTooShort { req } => {
                write!(
                    f,
                    "request {req}'s block hashes do not cover its computed tokens"
                )
            }
            InputError::DuplicateRequest { req } => {
                write!(f, "request {req} is scheduled twice in one step")
            }
            InputError::TooManyLoadBlocks => {
                f.write_str("the pending loads name more GPU blocks than the GPU pool has")
            }
            InputError::GpuPoolSize { num_blocks } => {
                write!(
                    f,
                    "the GPU view has {num_blocks} blocks, more than the configured count"
                )
            }
        }
    }
}

impl core::error::Error for InputError {}

/// Why [`SimpleScheduler::update_state_after_alloc`](super::SimpleScheduler::update_state_after_alloc)
/// failed (vLLM asserts each of these).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllocStateError {
    /// An input out of range.
    Input(InputError),
    /// `num_external_tokens` is not a multiple of the hash block size.
    Unaligned {
        /// The tokens given.
        num_external_tokens: u64,
    },
    /// The request already has a load that has not finished.
    LoadPending {
        /// The request.
        req: u64,
    },
    /// The block table is too short for the external blocks.
    TableTooShort {
        /// The request.
        req: u64,
    },
}

impl fmt::Display for AllocStateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            AllocStateError::Input(e) => e.fmt(f),
            AllocStateError::Unaligned {
                num_external_tokens,
            } => write!(
                f,
                "num_external_tokens={num_external_tokens} is not aligned to the hash block size"
            ),
            AllocStateError::LoadPending { req } => {
                write!(f, "request {req} already has a load registered")
            }
            AllocStateError::TableTooShort { req } => write!(
                f,
                "request {req}'s block table does not reach its external blocks"
            ),
        }
    }
}

impl core::error::Error for AllocStateError {}

/// Why [`SimpleScheduler::update_connector_output`](super::SimpleScheduler::update_connector_output)
/// failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputError {
    /// A store event that was never issued.
    UnknownStoreEvent {
        /// The event index.
        event: u64,
    },
    /// A stored GPU block lost its hash before the store completed (the GPU side broke the
    /// pin the scheduler holds; vLLM asserts).
    GpuBlockUnhashed {
        /// The block.
        block: u32,
    },
}

impl fmt::Display for OutputError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            OutputError::UnknownStoreEvent { event } => {
                write!(f, "store event {event} was never issued")
            }
            OutputError::GpuBlockUnhashed { block } => {
                write!(f, "GPU block {block} has no hash at store completion")
            }
        }
    }
}

impl core::error::Error for OutputError {}
