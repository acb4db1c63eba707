//! [`ManagerConfig`]: everything an [`OffloadManager`](super::OffloadManager) is sized and
//! configured with, validated once.

use core::fmt;

use crate::hashing::FixedState;
use crate::stats::CpuTierInfo;

/// The eviction policy, chosen at construction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum PolicyKind {
    /// vLLM's rank-based, request-scoped LRU (`"lru"`, the default).
    #[default]
    Lru,
    /// vLLM's adaptive replacement cache (`"arc"`).
    Arc,
}

impl PolicyKind {
    /// vLLM's name for the policy.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Lru => "lru",
            PolicyKind::Arc => "arc",
        }
    }

    /// Parses vLLM's policy name (`"lru"` or `"arc"`).
    ///
    /// # Errors
    /// [`UnknownPolicy`] for any other name (vLLM raises `ValueError("Unknown cache policy")`).
    pub fn from_name(name: &str) -> Result<Self, UnknownPolicy> {
        match name {
            "lru" => Ok(PolicyKind::Lru),
            "arc" => Ok(PolicyKind::Arc),
            _ => Err(UnknownPolicy),
        }
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A policy name other than `"lru"` or `"arc"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnknownPolicy;

impl fmt::Display for UnknownPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("unknown cache policy: expected \"lru\" or \"arc\"")
    }
}

impl core::error::Error for UnknownPolicy {}

/// How an [`OffloadManager`](super::OffloadManager) is built: `new(num_chunks)` fills vLLM's
/// defaults; change the public fields, then pass it to
/// [`OffloadManager::new`](super::OffloadManager::new), which validates it once.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct ManagerConfig {
    /// Slots in the tier (vLLM's `num_chunks`). 0 is legal: every store that needs a slot fails.
    pub num_chunks: u32,
    /// The eviction policy.
    pub policy: PolicyKind,
    /// Admit a new key only on its `store_threshold`-th offer. 0 and 1 mean no filter (and no
    /// `stores_skipped` metric), as in vLLM.
    pub store_threshold: u32,
    /// The reuse tracker's size (vLLM's default 64,000). 0 tracks (and admits) nothing when the
    /// filter is on.
    pub max_tracker_size: u32,
    /// Queue stored/removed events for [`take_events`](super::OffloadManager::take_events).
    pub enable_events: bool,
    /// The most keys held by undrained events; an event that does not fit is dropped whole and
    /// counted in [`events_dropped`](super::OffloadManager::events_dropped).
    pub max_event_keys: u32,
    /// The most requests in flight at once (request slots, each with its own state).
    pub max_requests: u32,
    /// The CPU tier's facts for `config_info`; `None` reports an empty mapping, as vLLM does
    /// without an info object.
    pub info: Option<CpuTierInfo>,
    /// The hasher seed for every map of the manager (deterministic; change it to harden
    /// against chosen-collision keys).
    pub hasher: FixedState,
    /// The most bytes the manager may allocate at construction
    /// ([`OffloadManager::required_bytes`](super::OffloadManager::required_bytes)); a
    /// configuration that needs more is [`ConfigError::OutOfMemory`] before anything is
    /// allocated. `None` (the default): no limit beyond what the allocator grants.
    pub memory_limit: Option<u64>,
    /// Let the key tables (the chunk index, ARC's ghost index, the reuse tracker's index)
    /// start small and double as they fill, never past the size
    /// [`required_bytes`](super::OffloadManager::required_bytes) counts, instead of
    /// allocating them whole at construction. A large tier then touches memory in proportion
    /// to what it holds, and its lookups stay in cache while it is mostly empty; in exchange
    /// [`prepare_store`](super::OffloadManager::prepare_store) allocates while the tables grow
    /// (and fails with [`StoreError::OutOfMemory`](super::StoreError::OutOfMemory), changing
    /// nothing, if the allocator refuses). `false` (the default): construction allocates
    /// everything and no call allocates once warm, for runtimes with one allocation at start.
    pub grow_tables: bool,
}

impl ManagerConfig {
    /// vLLM's defaults for `num_chunks` slots: LRU, no store threshold, tracker size 64,000,
    /// events off; 65,536 event keys and 4,096 requests in flight.
    #[must_use]
    pub fn new(num_chunks: u32) -> Self {
        ManagerConfig {
            num_chunks,
            policy: PolicyKind::Lru,
            store_threshold: 0,
            max_tracker_size: 64_000,
            enable_events: false,
            max_event_keys: 65_536,
            max_requests: 4_096,
            info: None,
            hasher: FixedState::default(),
            memory_limit: None,
            grow_tables: false,
        }
    }

    /// Whether the reuse filter is on (`store_threshold ≥ 2`).
    #[must_use]
    pub fn filter_enabled(&self) -> bool {
        self.store_threshold >= 2
    }

    /// Checks the configuration.
    ///
    /// # Errors
    /// [`ConfigError`] naming the field that is out of range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max_requests == 0 {
            return Err(ConfigError::ZeroMaxRequests);
        }
        // Slots and request anchors share one u32 node space with u32::MAX as "none".
        if u64::from(self.num_chunks) + u64::from(self.max_requests) >= u64::from(u32::MAX) {
            return Err(ConfigError::TooLarge {
                num_chunks: self.num_chunks,
                max_requests: self.max_requests,
            });
        }
        // ARC's key table holds the chunks and 2 · num_chunks ghosts, by u32 ids.
        if self.policy == PolicyKind::Arc && u64::from(self.num_chunks) * 3 >= u64::from(u32::MAX) {
            return Err(ConfigError::ArcTooLarge {
                num_chunks: self.num_chunks,
            });
        }
        Ok(())
    }
}

/// Why a [`ManagerConfig`] was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// `max_requests` is 0: no request could ever be served.
    ZeroMaxRequests,
    /// The manager's fixed arrays for this configuration (about 62 bytes per chunk under LRU,
    /// 125 under ARC, plus the tracker and the event queue) exceed
    /// [`ManagerConfig::memory_limit`], or could not be allocated.
    OutOfMemory {
        /// Bytes the configuration needs
        /// ([`OffloadManager::required_bytes`](super::OffloadManager::required_bytes)).
        needed: u64,
        /// The limit it exceeds; `None` when there was no limit and the allocator refused.
        limit: Option<u64>,
    },
    /// `num_chunks + max_requests` does not fit the u32 index space.
    TooLarge {
        /// The configured slot count.
        num_chunks: u32,
        /// The configured request limit.
        max_requests: u32,
    },
    /// ARC keeps `2 · num_chunks` ghost keys in the chunks' key table, whose
    /// `3 · num_chunks` ids must fit the u32 index space (`num_chunks` at most 1,431,655,764).
    ArcTooLarge {
        /// The configured slot count.
        num_chunks: u32,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::ZeroMaxRequests => f.write_str("max_requests must be at least 1"),
            ConfigError::OutOfMemory {
                needed,
                limit: Some(limit),
            } => write!(
                f,
                "the manager needs {needed} bytes for this many chunks, requests, tracker \
                 entries and event keys, over the memory limit of {limit} bytes"
            ),
            ConfigError::OutOfMemory {
                needed,
                limit: None,
            } => write!(
                f,
                "cannot allocate the manager's {needed} bytes for this many chunks, requests, \
                 tracker entries and event keys: out of memory"
            ),
            ConfigError::TooLarge {
                num_chunks,
                max_requests,
            } => write!(
                f,
                "num_chunks ({num_chunks}) plus max_requests ({max_requests}) exceeds the u32 \
                 index space"
            ),
            ConfigError::ArcTooLarge { num_chunks } => write!(
                f,
                "num_chunks ({num_chunks}) is too large for ARC: its key table of the chunks \
                 and 2 · num_chunks ghost entries exceeds the u32 index space (num_chunks at \
                 most 1431655764)"
            ),
        }
    }
}

impl core::error::Error for ConfigError {}
