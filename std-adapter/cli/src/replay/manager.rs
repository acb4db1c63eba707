//! The manager options every replaying command shares ([`ManagerArgs`], `--policy` through
//! [`parse_policy`]) and the manager they build, refused as [`ManagerError`] in the words of the
//! options.

use std::fmt;

use kvtier_core::manager::{ConfigError, ManagerConfig, OffloadManager, PolicyKind, UnknownPolicy};
use kvtier_core::stats::CpuTierInfo;

use crate::replay::{DEFAULT_MAX_OPEN_BLOCKS, Replayer};

/// The manager options every replaying command (`replay`, `serve`, `sweep`) takes.
#[derive(Debug, Clone, clap::Args)]
pub struct ManagerArgs {
    /// Size of the reuse tracker.
    #[arg(long, default_value_t = 64_000, value_name = "M")]
    pub max_tracker_size: u32,
    /// Requests in flight each manager can hold at once (a trace with more open requests is
    /// an error naming the line).
    #[arg(long, default_value_t = 65_536, value_name = "N")]
    pub max_requests: u32,
    /// Blocks each replayer holds over the requests open at once, 12 bytes each (a trace with
    /// more is an error naming the line).
    #[arg(long, default_value_t = DEFAULT_MAX_OPEN_BLOCKS, value_name = "N")]
    pub max_open_blocks: u64,
    /// The most bytes each manager may allocate (default: the machine's available memory); a
    /// configuration that needs more is refused before anything is allocated.
    #[arg(long, value_name = "BYTES")]
    pub memory_limit: Option<u64>,
    /// Queue the manager's stored and removed events (set when they are published).
    #[arg(skip)]
    pub events: bool,
}

impl Default for ManagerArgs {
    fn default() -> Self {
        ManagerArgs {
            max_tracker_size: 64_000,
            max_requests: 65_536,
            max_open_blocks: DEFAULT_MAX_OPEN_BLOCKS,
            memory_limit: None,
            events: false,
        }
    }
}

impl ManagerArgs {
    /// The manager of `capacity` chunks with `policy` and `store_threshold` under these
    /// options, its key tables growing as they fill
    /// ([`ManagerConfig::grow_tables`]). Its `config_info` reports the capacity and `None`
    /// for the sizes a replay cannot know.
    ///
    /// # Errors
    /// [`ManagerError`] for a rejected configuration, in the words of the options that set it.
    pub fn manager(
        &self,
        policy: PolicyKind,
        capacity: u32,
        store_threshold: u32,
    ) -> Result<OffloadManager, ManagerError> {
        let mut cfg = ManagerConfig::new(capacity);
        cfg.info = Some(CpuTierInfo {
            num_chunks: u64::from(capacity),
            blocks_per_chunk: 1,
            kv_cache_size_bytes: None,
            kv_cache_size_tokens: None,
        });
        cfg.policy = policy;
        cfg.store_threshold = store_threshold;
        cfg.max_tracker_size = self.max_tracker_size;
        cfg.max_requests = self.max_requests;
        cfg.memory_limit = self.memory_limit.or_else(kvtier::memory::available_bytes);
        cfg.enable_events = self.events;
        // A replay or a server holds what its traffic stores, often far below the capacity
        // asked for: tables that grow keep its lookups in cache and its memory to its use.
        cfg.grow_tables = true;
        OffloadManager::new(cfg).map_err(|e| match e {
            ConfigError::ZeroMaxRequests => ManagerError::ZeroMaxRequests,
            ConfigError::ArcTooLarge { .. } => ManagerError::ArcTooLarge { capacity },
            ConfigError::TooLarge { .. } => ManagerError::TooLarge {
                capacity,
                max_requests: self.max_requests,
            },
            e => ManagerError::Config(e),
        })
    }

    /// A replayer over `manager` with `block_tokens` tokens per block and these options'
    /// `--max-open-blocks`.
    #[must_use]
    pub fn replayer(&self, manager: OffloadManager, block_tokens: u32) -> Replayer {
        Replayer::new(manager, u64::from(block_tokens)).with_max_open_blocks(self.max_open_blocks)
    }
}

/// Why the manager of a replay could not be built; the message names the options at fault.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ManagerError {
    /// The trace header's `capacity` does not fit in `u32`.
    HeaderCapacity(u64),
    /// `--max-requests 0`.
    ZeroMaxRequests,
    /// The capacity is too large for ARC's ghost lists.
    ArcTooLarge {
        /// The capacity in chunks.
        capacity: u32,
    },
    /// The capacity plus `--max-requests` pass the slot range.
    TooLarge {
        /// The capacity in chunks.
        capacity: u32,
        /// `--max-requests`.
        max_requests: u32,
    },
    /// Any other configuration the core refuses (e.g. over `--memory-limit`).
    Config(ConfigError),
}

impl fmt::Display for ManagerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ManagerError::HeaderCapacity(c) => {
                write!(f, "trace header capacity {c} does not fit in u32")
            }
            ManagerError::ZeroMaxRequests => f.write_str("--max-requests must be at least 1"),
            ManagerError::ArcTooLarge { capacity } => write!(
                f,
                "capacity {capacity} is too large for --policy arc: ARC's key table of the \
                 chunks and their 2 · capacity ghosts needs 3 · capacity below 4294967295 \
                 (capacity at most 1431655764)"
            ),
            ManagerError::TooLarge {
                capacity,
                max_requests,
            } => write!(
                f,
                "capacity {capacity} plus --max-requests {max_requests} must be below 4294967295"
            ),
            ManagerError::Config(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for ManagerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ManagerError::Config(e) => Some(e),
            _ => None,
        }
    }
}

/// Parses a policy name as vLLM names it (`lru`, `arc`) into the core's [`PolicyKind`].
///
/// ```
/// use kvtier_core::manager::PolicyKind;
/// assert_eq!(kvtier_cli::replay::parse_policy("arc"), Ok(PolicyKind::Arc));
/// assert_eq!(
///     kvtier_cli::replay::parse_policy("fifo").unwrap_err().to_string(),
///     "unknown cache policy: expected \"lru\" or \"arc\""
/// );
/// ```
///
/// # Errors
/// The core's [`UnknownPolicy`] for any other name.
pub fn parse_policy(name: &str) -> Result<PolicyKind, UnknownPolicy> {
    PolicyKind::from_name(name)
}
