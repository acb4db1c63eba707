//! What a manager handle holds: the manager, and what a call could not hand over yet.

use kvtier_core::manager::{ConfigError, OffloadManager, StorePlan};
use kvtier_core::stats::Payload;

use crate::status::{Status, fail};
use crate::types::{kvtier_config, kvtier_event, kvtier_key};

/// What a handle holds: the manager, and what a call could not hand over because the caller's
/// buffer was too short (kept for the next call, so nothing is lost).
#[derive(Debug)]
pub(crate) struct State {
    pub(super) manager: OffloadManager<kvtier_key>,
    /// The last store decision (reused: the warm path allocates nothing).
    pub(super) plan: StorePlan<kvtier_key>,
    /// Drained events not yet delivered (at most `max_event_keys` keys).
    pub(super) events: Vec<kvtier_event>,
    pub(super) event_keys: Vec<kvtier_key>,
    /// Drained stats not yet delivered, aggregated.
    pub(super) stats: Option<Payload>,
    /// The encoding of `stats` (at most `wire::MAX_ENCODED_LEN` bytes).
    pub(super) wire: Vec<u8>,
}

impl State {
    /// A manager built from `cfg`.
    pub(crate) fn new(cfg: &kvtier_config) -> Result<Self, Status> {
        let manager = OffloadManager::new(cfg.to_core()?).map_err(config_status)?;
        Ok(State {
            manager,
            plan: StorePlan::new(),
            events: Vec::new(),
            event_keys: Vec::new(),
            stats: None,
            wire: Vec::new(),
        })
    }
}

fn config_status(e: ConfigError) -> Status {
    let status = match e {
        ConfigError::OutOfMemory { .. } => Status::KVTIER_OUT_OF_MEMORY,
        _ => Status::KVTIER_INVALID_CONFIG,
    };
    fail(status, e)
}
