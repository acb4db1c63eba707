//! vLLM's string request ids as the core's `u64` request ids.
//!
//! An id is mapped while the core tracks the request ([`SimpleScheduler::is_tracked`]); a
//! request the core no longer tracks is forgotten ([`ReqIds::forget_untracked`]), so the map
//! holds at most the core's `max_requests` entries between calls. A request id the map does
//! not know stands for a request the core does not track: it is passed as [`UNKNOWN`], which
//! the core finds nowhere.

use std::collections::HashMap;

use kvtier_core::simple::SimpleScheduler;
use pyo3::prelude::*;
use pyo3::types::PyString;

/// The core id of a request the core does not track (never given out).
pub(super) const UNKNOWN: u64 = u64::MAX;

/// The request id map.
#[derive(Debug, Default)]
pub(super) struct ReqIds {
    by_name: HashMap<String, u64>,
    names: HashMap<u64, (String, Py<PyString>)>,
    next: u64,
    /// Names forgotten since the last [`ReqIds::take_forgotten`].
    forgotten: Vec<Py<PyString>>,
}

impl ReqIds {
    /// The core id of `name`, or [`UNKNOWN`].
    pub(super) fn get(&self, name: &Bound<'_, PyAny>) -> PyResult<u64> {
        let s = name.cast::<PyString>()?;
        Ok(self.by_name.get(s.to_str()?).copied().unwrap_or(UNKNOWN))
    }

    /// The core id of `name`, giving it a new one if it has none.
    pub(super) fn get_or_insert(&mut self, name: &Bound<'_, PyAny>) -> PyResult<u64> {
        let s = name.cast::<PyString>()?;
        let key = s.to_str()?;
        if let Some(&id) = self.by_name.get(key) {
            return Ok(id);
        }
        let id = self.next;
        self.next += 1;
        self.by_name.insert(key.to_owned(), id);
        self.names.insert(id, (key.to_owned(), s.clone().unbind()));
        Ok(id)
    }

    /// The name of core id `id`, if mapped.
    pub(super) fn name(&self, id: u64) -> Option<&Py<PyString>> {
        self.names.get(&id).map(|(_, n)| n)
    }

    /// Forgets `id` unless the core tracks it.
    pub(super) fn forget_if_untracked(&mut self, s: &SimpleScheduler, id: u64) {
        if id == UNKNOWN || s.is_tracked(id) {
            return;
        }
        if let Some((key, name)) = self.names.remove(&id) {
            self.by_name.remove(&key);
            self.forgotten.push(name);
        }
    }

    /// Forgets every request the core no longer tracks.
    pub(super) fn forget_untracked(&mut self, s: &SimpleScheduler) {
        let gone: Vec<u64> = self
            .names
            .keys()
            .copied()
            .filter(|&id| !s.is_tracked(id))
            .collect();
        for id in gone {
            self.forget_if_untracked(s, id);
        }
    }

    /// The names forgotten since the last call (the caller drops what it keeps for them).
    pub(super) fn take_forgotten(&mut self) -> Vec<Py<PyString>> {
        std::mem::take(&mut self.forgotten)
    }

    /// Requests mapped.
    pub(super) fn len(&self) -> usize {
        self.names.len()
    }
}
