//! [`SharedManager`]: one [`OffloadManager`] behind a lock, with closure-scoped access and an
//! atomic lookup-then-pin.

use kvtier_core::manager::{LoadError, LookupResult, OffloadManager, RequestId};
use kvtier_core::stats::Payload;
use kvtier_core::{BlockKey, OffloadKey};

use crate::sync::{Mutex, lock, lock_reporting};

/// What [`SharedManager::lookup_and_pin`] found and pinned.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pinned {
    /// Leading keys that were HITs and are now pinned for loading.
    pub hits: usize,
    /// Their slots, in key order (`slots.len() == hits`).
    pub slots: Vec<u32>,
    /// Whether the scan stopped at a key whose store is still pending (HIT_PENDING).
    pub stopped_at_pending: bool,
}

/// An [`OffloadManager`] shared between threads.
///
/// Every method takes the lock once, so what it does is atomic with respect to other threads;
/// [`with`](Self::with) gives closure-scoped access for anything else. A poisoned lock is
/// recovered (see [`sync`](crate::sync)): the manager validates before it mutates, so it is
/// consistent whatever panicked.
///
/// ```
/// use kvtier::shared::SharedManager;
/// use kvtier_core::manager::{ManagerConfig, OffloadManager, StoreOutcome, StorePlan};
///
/// let shared = SharedManager::new(OffloadManager::<u64>::new(ManagerConfig::new(4))?);
/// let mut plan = StorePlan::new();
/// let stored = shared.with(|m| -> Result<usize, kvtier::Error> {
///     let req = m.on_new_request()?;
///     m.prepare_store(req, &[1, 2], None, &mut plan)?;
///     Ok(m.complete_store(plan.keys(), StoreOutcome::Stored))
/// })?;
/// assert_eq!(stored, 2);
/// let req = shared.with(|m| m.on_new_request())?;
/// let pinned = shared.lookup_and_pin(req, &[1, 2, 3], None)?;
/// assert_eq!((pinned.hits, pinned.slots), (2, vec![0, 1]));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct SharedManager<K: OffloadKey = BlockKey> {
    inner: Mutex<OffloadManager<K>>,
}

impl<K: OffloadKey> SharedManager<K> {
    /// Shares `manager`.
    #[must_use]
    pub fn new(manager: OffloadManager<K>) -> Self {
        SharedManager {
            inner: Mutex::new(manager),
        }
    }

    /// Runs `f` with the manager locked (one critical section).
    pub fn with<R>(&self, f: impl FnOnce(&mut OffloadManager<K>) -> R) -> R {
        f(&mut lock(&self.inner))
    }

    /// [`with`](Self::with), plus whether the lock had been poisoned by a panicking thread
    /// (the value is recovered and the poison cleared).
    pub fn with_reporting<R>(&self, f: impl FnOnce(&mut OffloadManager<K>) -> R) -> (R, bool) {
        let (mut g, poisoned) = lock_reporting(&self.inner);
        (f(&mut g), poisoned)
    }

    /// [`OffloadManager::lookup`] of one key.
    #[must_use]
    pub fn lookup(&self, key: &K) -> LookupResult {
        lock(&self.inner).lookup(key)
    }

    /// [`OffloadManager::pin_hit_prefix`] in one critical section, with the slots copied out:
    /// no eviction can fall between a HIT and its pin. `end_tokens`, if given, holds one
    /// position per key (only the pinned prefix is used).
    ///
    /// # Errors
    /// [`LoadError`] (e.g. a request that is not live, or positions of the wrong length);
    /// nothing is pinned then.
    pub fn lookup_and_pin(
        &self,
        req: RequestId,
        keys: &[K],
        end_tokens: Option<&[u64]>,
    ) -> Result<Pinned, LoadError> {
        let mut m = lock(&self.inner);
        let p = m.pin_hit_prefix(req, keys, end_tokens)?;
        Ok(Pinned {
            hits: p.hits,
            slots: p.slots.to_vec(),
            stopped_at_pending: p.stopped_at_pending,
        })
    }

    /// Drains the manager's stats as a payload ([`OffloadManager::take_stats_payload`]).
    pub fn drain_payload(&self) -> Payload {
        lock(&self.inner).take_stats_payload()
    }

    /// The manager back (recovered if the lock was poisoned).
    pub fn into_inner(self) -> OffloadManager<K> {
        self.inner
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Independent managers, one per engine, each behind its own lock (no lock is shared between
/// engines, so engines never contend).
#[derive(Debug)]
pub struct ShardedManager<K: OffloadKey = BlockKey> {
    shards: Vec<SharedManager<K>>,
}

impl<K: OffloadKey> ShardedManager<K> {
    /// One shard per manager, in engine order.
    #[must_use]
    pub fn new(managers: Vec<OffloadManager<K>>) -> Self {
        ShardedManager {
            shards: managers.into_iter().map(SharedManager::new).collect(),
        }
    }

    /// The number of engines.
    #[must_use]
    pub fn len(&self) -> usize {
        self.shards.len()
    }

    /// True when there is no engine.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.shards.is_empty()
    }

    /// Engine `engine`'s manager.
    #[must_use]
    pub fn get(&self, engine: usize) -> Option<&SharedManager<K>> {
        self.shards.get(engine)
    }

    /// Runs `f` on engine `engine`'s manager; `None` when there is no such engine.
    pub fn with<R>(&self, engine: usize, f: impl FnOnce(&mut OffloadManager<K>) -> R) -> Option<R> {
        self.shards.get(engine).map(|s| s.with(f))
    }

    /// Every engine's manager, in engine order.
    pub fn iter(&self) -> impl Iterator<Item = &SharedManager<K>> {
        self.shards.iter()
    }

    /// Drains every engine's stats, in engine order (one lock at a time).
    pub fn drain_payloads(&self) -> Vec<Payload> {
        self.shards
            .iter()
            .map(SharedManager::drain_payload)
            .collect()
    }
}
