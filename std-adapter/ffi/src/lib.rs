#![doc = include_str!("../README.md")]
#![deny(clippy::undocumented_unsafe_blocks)]

mod capacity;
mod handle;
mod manager;
mod ptr;
mod status;
mod types;

use core::ffi::{CStr, c_char, c_int};

pub use capacity::{
    kvtier_capacity, kvtier_capacity_budget, kvtier_capacity_full_attention,
    kvtier_full_attention_layout,
};
pub use handle::kvtier_manager;
pub use manager::{
    kvtier_complete_load, kvtier_complete_store, kvtier_config_init, kvtier_drain_events,
    kvtier_events_dropped, kvtier_inspect, kvtier_lookup, kvtier_manager_free, kvtier_manager_new,
    kvtier_pin_hit_prefix, kvtier_prepare_load, kvtier_prepare_store, kvtier_request_begin,
    kvtier_request_drop, kvtier_request_finish, kvtier_reset_cache, kvtier_stats_max_len,
    kvtier_take_stats, kvtier_touch,
};
pub use status::kvtier_status;
pub use types::{
    KVTIER_EVENT_REMOVED, KVTIER_EVENT_REMOVED_METADATA_ONLY, KVTIER_EVENT_STORED,
    KVTIER_LOOKUP_HIT, KVTIER_LOOKUP_HIT_PENDING, KVTIER_LOOKUP_MISS, KVTIER_POLICY_ARC,
    KVTIER_POLICY_LRU, KVTIER_STORE_FAILED, KVTIER_STORE_SUCCEEDED, kvtier_config, kvtier_event,
    kvtier_key, kvtier_manager_info,
};

/// The static message of a status code (`"unknown kvtier status code"` for a code that is not
/// one). The string is static: never free it.
///
/// Thread safety: callable from any thread.
#[unsafe(no_mangle)]
pub extern "C" fn kvtier_status_message(status: c_int) -> *const c_char {
    status::message_of(status).as_ptr()
}

/// This thread's detail of its last failed call (for example
/// `"prepare_load: key at index 3 is not in the tier"`), NUL-terminated, at most 255 bytes;
/// empty before any failure. The string belongs to the library and stays valid, on this
/// thread, until the next failing `kvtier_*` call on it; copy it to keep it.
///
/// Thread safety: each thread has its own detail.
#[unsafe(no_mangle)]
pub extern "C" fn kvtier_last_error() -> *const c_char {
    status::last_error_ptr()
}

const VERSION: &CStr =
    match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
        Ok(v) => v,
        Err(_) => c"unknown",
    };

/// The library's version, e.g. `"0.1.0"` (static: never free it).
///
/// Thread safety: callable from any thread.
#[unsafe(no_mangle)]
pub extern "C" fn kvtier_version() -> *const c_char {
    VERSION.as_ptr()
}
