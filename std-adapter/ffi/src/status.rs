//! Status codes, their static messages, and the per-thread detail of the last failure.

use core::ffi::{CStr, c_char, c_int};
use core::fmt::{self, Write as _};
use std::cell::Cell;

/// The status every `kvtier_*` call returns (as an `int`). `KVTIER_OK` is 0; every other value
/// names what was wrong, and a call that returns one changed nothing.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(non_camel_case_types, reason = "C names")]
pub enum kvtier_status {
    /// Success.
    KVTIER_OK = 0,
    /// A required pointer argument is NULL.
    KVTIER_NULL_POINTER = 1,
    /// The manager handle is not live: never created, or already destroyed.
    KVTIER_INVALID_HANDLE = 2,
    /// Another call on the same handle is running on another thread.
    KVTIER_BUSY = 3,
    /// An argument is out of range: an unknown enum value, a misaligned pointer, or an array
    /// length whose byte size overflows.
    KVTIER_INVALID_ARGUMENT = 4,
    /// An output buffer is too short; the needed length was written to its length argument.
    KVTIER_BUFFER_TOO_SMALL = 5,
    /// The manager configuration is out of range (see `kvtier_last_error`).
    KVTIER_INVALID_CONFIG = 6,
    /// The manager's memory could not be allocated.
    KVTIER_OUT_OF_MEMORY = 7,
    /// `max_requests` requests are already live.
    KVTIER_TOO_MANY_REQUESTS = 8,
    /// The request id is not live (finished, dropped, or never begun).
    KVTIER_UNKNOWN_REQUEST = 9,
    /// A key is not in the tier.
    KVTIER_NOT_PRESENT = 10,
    /// A key's store has not completed, so it cannot be read.
    KVTIER_NOT_READY = 11,
    /// A key has no load in flight to complete.
    KVTIER_NOT_PINNED = 12,
    /// A key already has `INT32_MAX` loads in flight.
    KVTIER_TOO_MANY_PINS = 13,
    /// A store offer names a key twice.
    KVTIER_DUPLICATE_KEY = 14,
    /// An end-token position is above `INT64_MAX`.
    KVTIER_BAD_POSITION = 15,
    /// The store needs more evictions than there are idle chunks (vLLM's `None`).
    KVTIER_NO_ROOM = 16,
    /// The layout or budget of a capacity computation is invalid, or a figure overflows.
    KVTIER_CAPACITY_ERROR = 17,
    /// One request of `max_model_len` tokens does not fit in the GPU memory given.
    KVTIER_DOES_NOT_FIT = 18,
    /// An earlier call on this handle panicked; only `kvtier_manager_free` is accepted.
    KVTIER_POISONED = 19,
    /// The call panicked inside kvtier (a bug); the panic was caught at the boundary.
    KVTIER_PANIC = 20,
    /// An internal consistency check failed (a bug in kvtier).
    KVTIER_INTERNAL = 21,
}

pub(crate) use kvtier_status as Status;

impl Status {
    /// Every status, in code order.
    pub(crate) const ALL: [Status; 22] = [
        Status::KVTIER_OK,
        Status::KVTIER_NULL_POINTER,
        Status::KVTIER_INVALID_HANDLE,
        Status::KVTIER_BUSY,
        Status::KVTIER_INVALID_ARGUMENT,
        Status::KVTIER_BUFFER_TOO_SMALL,
        Status::KVTIER_INVALID_CONFIG,
        Status::KVTIER_OUT_OF_MEMORY,
        Status::KVTIER_TOO_MANY_REQUESTS,
        Status::KVTIER_UNKNOWN_REQUEST,
        Status::KVTIER_NOT_PRESENT,
        Status::KVTIER_NOT_READY,
        Status::KVTIER_NOT_PINNED,
        Status::KVTIER_TOO_MANY_PINS,
        Status::KVTIER_DUPLICATE_KEY,
        Status::KVTIER_BAD_POSITION,
        Status::KVTIER_NO_ROOM,
        Status::KVTIER_CAPACITY_ERROR,
        Status::KVTIER_DOES_NOT_FIT,
        Status::KVTIER_POISONED,
        Status::KVTIER_PANIC,
        Status::KVTIER_INTERNAL,
    ];

    /// The status as the `int` the C functions return.
    pub(crate) fn code(self) -> c_int {
        self as c_int
    }

    /// The static message of this status.
    pub(crate) fn message(self) -> &'static CStr {
        match self {
            Status::KVTIER_OK => c"ok",
            Status::KVTIER_NULL_POINTER => c"a required pointer argument is NULL",
            Status::KVTIER_INVALID_HANDLE => {
                c"the manager handle is not live (never created or already destroyed)"
            }
            Status::KVTIER_BUSY => c"another call on the same handle is running on another thread",
            Status::KVTIER_INVALID_ARGUMENT => {
                c"an argument is out of range (unknown enum value, misaligned pointer or oversized length)"
            }
            Status::KVTIER_BUFFER_TOO_SMALL => {
                c"an output buffer is too short; the needed length was written"
            }
            Status::KVTIER_INVALID_CONFIG => c"the manager configuration is out of range",
            Status::KVTIER_OUT_OF_MEMORY => c"out of memory",
            Status::KVTIER_TOO_MANY_REQUESTS => c"max_requests requests are already live",
            Status::KVTIER_UNKNOWN_REQUEST => c"the request id is not live",
            Status::KVTIER_NOT_PRESENT => c"a key is not in the tier",
            Status::KVTIER_NOT_READY => c"a key is still being stored and cannot be read",
            Status::KVTIER_NOT_PINNED => c"a key has no load in flight",
            Status::KVTIER_TOO_MANY_PINS => c"a key already has INT32_MAX loads in flight",
            Status::KVTIER_DUPLICATE_KEY => c"a store offer names a key twice",
            Status::KVTIER_BAD_POSITION => c"an end-token position exceeds INT64_MAX",
            Status::KVTIER_NO_ROOM => {
                c"no room: the store needs more evictions than there are idle chunks"
            }
            Status::KVTIER_CAPACITY_ERROR => {
                c"the capacity layout or budget is invalid, or a figure overflows"
            }
            Status::KVTIER_DOES_NOT_FIT => {
                c"one request of max_model_len tokens does not fit in the GPU memory"
            }
            Status::KVTIER_POISONED => {
                c"an earlier call on this handle panicked; only kvtier_manager_free is accepted"
            }
            Status::KVTIER_PANIC => c"a call panicked inside kvtier (a bug); the panic was caught",
            Status::KVTIER_INTERNAL => c"an internal consistency check failed (a bug in kvtier)",
        }
    }
}

/// Bytes kept of the last failure's detail, the terminating NUL included.
const DETAIL_CAP: usize = 256;

thread_local! {
    /// The detail of this thread's last failed call, NUL-terminated (no heap: a fixed array).
    static LAST_ERROR: Cell<[u8; DETAIL_CAP]> = const { Cell::new([0; DETAIL_CAP]) };
}

/// Writes into a fixed buffer, truncating (at a character boundary) and keeping room for the
/// NUL.
struct Truncating {
    buf: [u8; DETAIL_CAP],
    len: usize,
}

impl fmt::Write for Truncating {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for c in s.chars() {
            let mut utf8 = [0u8; 4];
            let bytes = c.encode_utf8(&mut utf8).as_bytes();
            // Interior NULs would cut the C string short: drop them.
            if bytes == [0] {
                continue;
            }
            if self.len + bytes.len() >= DETAIL_CAP {
                return Ok(());
            }
            self.buf[self.len..self.len + bytes.len()].copy_from_slice(bytes);
            self.len += bytes.len();
        }
        Ok(())
    }
}

/// Records `detail` as this thread's last error and returns `status`.
pub(crate) fn fail(status: Status, detail: impl fmt::Display) -> Status {
    let mut w = Truncating {
        buf: [0; DETAIL_CAP],
        len: 0,
    };
    // Truncating never fails.
    let _ = write!(w, "{detail}");
    LAST_ERROR.with(|c| c.set(w.buf));
    status
}

/// Records the status's own message as the detail and returns it.
pub(crate) fn fail_plain(status: Status) -> Status {
    let msg = status.message().to_str().unwrap_or("");
    fail(status, msg)
}

/// A pointer to this thread's last error detail (NUL-terminated; empty before any failure).
pub(crate) fn last_error_ptr() -> *const c_char {
    LAST_ERROR.with(|c| c.as_ptr().cast::<c_char>().cast_const())
}

/// The message of status code `code`, or a fixed text for an unknown code.
pub(crate) fn message_of(code: c_int) -> &'static CStr {
    Status::ALL
        .iter()
        .find(|s| s.code() == code)
        .map_or(c"unknown kvtier status code", |s| s.message())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_dense_and_messages_distinct() {
        for (i, s) in Status::ALL.iter().enumerate() {
            assert_eq!(usize::try_from(s.code()), Ok(i));
            assert_eq!(message_of(s.code()), s.message());
        }
        let mut msgs: Vec<_> = Status::ALL.iter().map(|s| s.message()).collect();
        msgs.sort();
        msgs.dedup();
        assert_eq!(msgs.len(), Status::ALL.len());
        assert_eq!(message_of(-1), c"unknown kvtier status code");
        assert_eq!(message_of(22), c"unknown kvtier status code");
    }

    #[test]
    fn detail_is_truncated_at_a_char_boundary_without_nuls() {
        let long = "é".repeat(300);
        fail(Status::KVTIER_INTERNAL, &long);
        let got = LAST_ERROR.with(Cell::get);
        let end = got.iter().position(|&b| b == 0).unwrap_or(DETAIL_CAP);
        assert_eq!(end, 254, "127 two-byte characters, then the NUL");
        assert!(core::str::from_utf8(&got[..end]).is_ok());
        fail(Status::KVTIER_INTERNAL, "a\0b");
        let got = LAST_ERROR.with(Cell::get);
        assert_eq!(&got[..3], b"ab\0");
    }
}
