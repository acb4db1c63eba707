//! The plain C types of the ABI: keys, the manager configuration, events, introspection.
#![allow(non_camel_case_types, reason = "C names")]

use kvtier_core::BlockKey;
use kvtier_core::OffloadKey;
use kvtier_core::hashing::FixedState;
use kvtier_core::manager::{EventKind, LookupResult, ManagerConfig, PolicyKind};

use crate::status::{Status, fail};

/// An offload key: a 64-bit block hash plus the KV-cache group it belongs to. Ordered and
/// hashed exactly as `kvtier_core::BlockKey`, so the manager behaves identically.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct kvtier_key {
    /// The block's hash.
    pub hash: u64,
    /// The KV-cache group index.
    pub group: u32,
}

impl kvtier_key {
    fn block_key(self) -> BlockKey {
        BlockKey::new(self.hash, self.group)
    }
}

impl core::hash::Hash for kvtier_key {
    fn hash<H: core::hash::Hasher>(&self, state: &mut H) {
        self.block_key().hash(state);
    }
}

impl OffloadKey for kvtier_key {
    fn group(&self) -> u32 {
        self.group
    }
}

/// `kvtier_config.policy`: vLLM's rank-based, request-scoped LRU.
pub const KVTIER_POLICY_LRU: u32 = 0;
/// `kvtier_config.policy`: vLLM's adaptive replacement cache.
pub const KVTIER_POLICY_ARC: u32 = 1;

/// `kvtier_lookup` result: the key is not in the tier.
pub const KVTIER_LOOKUP_MISS: u32 = 0;
/// `kvtier_lookup` result: the key is in the tier but its store has not completed.
pub const KVTIER_LOOKUP_HIT_PENDING: u32 = 1;
/// `kvtier_lookup` result: the key is in the tier and readable.
pub const KVTIER_LOOKUP_HIT: u32 = 2;

/// `kvtier_complete_store` outcome: the transfers succeeded; the keys become readable.
pub const KVTIER_STORE_SUCCEEDED: u32 = 0;
/// `kvtier_complete_store` outcome: the transfers failed; the keys are removed.
pub const KVTIER_STORE_FAILED: u32 = 1;

/// `kvtier_event.kind`: the keys' stores completed; they are readable.
pub const KVTIER_EVENT_STORED: u32 = 0;
/// `kvtier_event.kind`: the keys were evicted.
pub const KVTIER_EVENT_REMOVED: u32 = 1;
/// `kvtier_event.kind`: the keys' stores failed and their slots were released (cleanup, not
/// an eviction).
pub const KVTIER_EVENT_REMOVED_METADATA_ONLY: u32 = 2;

/// How a manager is built. Fill it with `kvtier_config_init` (vLLM's defaults), change fields,
/// then pass it to `kvtier_manager_new`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct kvtier_config {
    /// Slots in the CPU tier (vLLM's `num_chunks`); 0 is legal (every store fails).
    pub num_chunks: u32,
    /// `KVTIER_POLICY_LRU` or `KVTIER_POLICY_ARC`.
    pub policy: u32,
    /// Admit a new key only on its `store_threshold`-th offer; 0 and 1 mean no filter.
    pub store_threshold: u32,
    /// The reuse tracker's size (vLLM's default 64,000).
    pub max_tracker_size: u32,
    /// 1 to queue stored/removed events for `kvtier_drain_events`, 0 not to.
    pub enable_events: u32,
    /// The most keys held by undrained events; an event that does not fit is dropped whole.
    pub max_event_keys: u32,
    /// The most requests in flight at once.
    pub max_requests: u32,
    /// The seed of every hash map of the manager (change it to harden against chosen-collision
    /// keys; the manager's decisions do not depend on it).
    pub hash_seed: u64,
    /// The most bytes the manager may allocate at construction; a configuration that needs
    /// more is `KVTIER_OUT_OF_MEMORY` before anything is allocated. 0: no limit beyond what
    /// the allocator grants.
    pub memory_limit: u64,
}

impl kvtier_config {
    /// The defaults of `ManagerConfig::new(num_chunks)`.
    pub(crate) fn defaults(num_chunks: u32) -> Self {
        let c = ManagerConfig::new(num_chunks);
        kvtier_config {
            num_chunks: c.num_chunks,
            policy: match c.policy {
                PolicyKind::Lru => KVTIER_POLICY_LRU,
                PolicyKind::Arc => KVTIER_POLICY_ARC,
            },
            store_threshold: c.store_threshold,
            max_tracker_size: c.max_tracker_size,
            enable_events: u32::from(c.enable_events),
            max_event_keys: c.max_event_keys,
            max_requests: c.max_requests,
            hash_seed: c.hasher.seed,
            memory_limit: c.memory_limit.unwrap_or(0),
        }
    }

    /// The core configuration, or `KVTIER_INVALID_ARGUMENT` for an unknown enum value.
    pub(crate) fn to_core(self) -> Result<ManagerConfig, Status> {
        let mut c = ManagerConfig::new(self.num_chunks);
        c.policy = match self.policy {
            KVTIER_POLICY_LRU => PolicyKind::Lru,
            KVTIER_POLICY_ARC => PolicyKind::Arc,
            p => {
                return Err(fail(
                    Status::KVTIER_INVALID_ARGUMENT,
                    format_args!("kvtier_config.policy is {p}: expected 0 (LRU) or 1 (ARC)"),
                ));
            }
        };
        c.enable_events = match self.enable_events {
            0 => false,
            1 => true,
            v => {
                return Err(fail(
                    Status::KVTIER_INVALID_ARGUMENT,
                    format_args!("kvtier_config.enable_events is {v}: expected 0 or 1"),
                ));
            }
        };
        c.store_threshold = self.store_threshold;
        c.max_tracker_size = self.max_tracker_size;
        c.max_event_keys = self.max_event_keys;
        c.max_requests = self.max_requests;
        c.hasher = FixedState::with_seed(self.hash_seed);
        c.memory_limit = (self.memory_limit > 0).then_some(self.memory_limit);
        Ok(c)
    }
}

/// One drained event: its kind and where its keys are in the keys buffer of the same
/// `kvtier_drain_events` call.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct kvtier_event {
    /// `KVTIER_EVENT_STORED`, `KVTIER_EVENT_REMOVED` or `KVTIER_EVENT_REMOVED_METADATA_ONLY`.
    pub kind: u32,
    /// Index of the event's first key in the keys buffer.
    pub first_key: usize,
    /// Number of keys of the event (at least 1).
    pub num_keys: usize,
}

/// The C code of an event kind.
pub(crate) fn event_kind_code(kind: EventKind) -> u32 {
    match kind {
        EventKind::Stored => KVTIER_EVENT_STORED,
        EventKind::Removed => KVTIER_EVENT_REMOVED,
        EventKind::RemovedMetadataOnly => KVTIER_EVENT_REMOVED_METADATA_ONLY,
    }
}

/// The C code of a lookup result.
pub(crate) fn lookup_code(r: LookupResult) -> u32 {
    match r {
        LookupResult::Miss => KVTIER_LOOKUP_MISS,
        LookupResult::HitPending => KVTIER_LOOKUP_HIT_PENDING,
        LookupResult::Hit => KVTIER_LOOKUP_HIT,
    }
}

/// A manager's counters, from `kvtier_inspect`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct kvtier_manager_info {
    /// Capacity in chunks.
    pub num_chunks: u32,
    /// Resident chunks (allocated slots).
    pub allocated: u32,
    /// Free slots.
    pub free_chunks: u32,
    /// Chunks idle and evictable.
    pub evictable: u32,
    /// Chunks whose store is pending.
    pub write_pending: u32,
    /// Requests live (begun and not finished or dropped).
    pub live_requests: u32,
    /// Bytes of heap the manager holds.
    pub heap_bytes: u64,
}
