//! The one place the adapter takes its synchronisation primitives from: `std`'s, or loom's
//! when built with `RUSTFLAGS="--cfg loom"`, so the model checker explores every interleaving
//! of the same code (`std-adapter/kvtier/tests/loom_shared.rs`).
//!
//! # Poisoning policy
//!
//! A `std` mutex is poisoned when a thread panics while holding it. Every
//! [`OffloadManager`](kvtier_core::manager::OffloadManager) call and every exporter update
//! validates its input before it mutates anything, so a panic can only strike *between* two
//! complete calls and the value behind the lock is always in a consistent state. [`lock`]
//! therefore recovers the value from a poisoned mutex (and clears the poison) instead of
//! panicking in every later caller; [`lock_reporting`] does the same and says whether it had to.

#[cfg(loom)]
pub use loom::sync::{Arc, Mutex, MutexGuard};
#[cfg(not(loom))]
pub use std::sync::{Arc, Mutex, MutexGuard};

/// Locks `m`, recovering the value if a panicking thread poisoned it (see the module docs).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    lock_reporting(m).0
}

/// [`lock`], plus whether the mutex was poisoned (the poison is cleared).
pub fn lock_reporting<T>(m: &Mutex<T>) -> (MutexGuard<'_, T>, bool) {
    match m.lock() {
        Ok(g) => (g, false),
        Err(poisoned) => {
            // loom's mutex has no poison to clear: it never poisons in a model.
            #[cfg(not(loom))]
            m.clear_poison();
            (poisoned.into_inner(), true)
        }
    }
}
