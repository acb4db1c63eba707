//! Test conveniences over [`OffloadManager::prepare_store`]: a fresh [`StorePlan`] per call, and
//! the outcome of a `bool` that a generated operation carries.

use kvtier_core::OffloadKey;
use kvtier_core::manager::{OffloadManager, RequestId, StoreError, StoreOutcome, StorePlan};

/// `prepare_store` into a new plan.
///
/// # Errors
/// The manager's [`StoreError`], [`StoreError::NoRoom`] included.
pub fn store<K: OffloadKey>(
    m: &mut OffloadManager<K>,
    req: RequestId,
    keys: &[K],
    end_tokens: Option<&[u64]>,
) -> Result<StorePlan<K>, StoreError> {
    let mut plan = StorePlan::new();
    m.prepare_store(req, keys, end_tokens, &mut plan)?;
    Ok(plan)
}

/// [`store`], with [`StoreError::NoRoom`] as `None`, for the callers for which running out of
/// room is an expected result rather than a failure.
///
/// # Errors
/// Any other [`StoreError`].
pub fn store_or_no_room<K: OffloadKey>(
    m: &mut OffloadManager<K>,
    req: RequestId,
    keys: &[K],
    end_tokens: Option<&[u64]>,
) -> Result<Option<StorePlan<K>>, StoreError> {
    match store(m, req, keys, end_tokens) {
        Ok(plan) => Ok(Some(plan)),
        Err(StoreError::NoRoom { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// [`StoreOutcome::Stored`] for `true`, [`StoreOutcome::Failed`] for `false`.
#[must_use]
pub fn outcome(success: bool) -> StoreOutcome {
    if success {
        StoreOutcome::Stored
    } else {
        StoreOutcome::Failed
    }
}
