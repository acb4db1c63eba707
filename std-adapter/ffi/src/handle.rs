//! Manager handles: a registry of live handles, exclusive entry per call, and the boundary that
//! turns every panic into `KVTIER_PANIC`.
//!
//! The library keeps the addresses of its live handles in a set. Every call looks its handle up
//! there before touching it, so a destroyed or made-up pointer is `KVTIER_INVALID_HANDLE`
//! without ever being dereferenced. Only when a later `kvtier_manager_new` returns the same
//! address does a stale pointer name that new manager (which cannot be detected). A call then
//! marks the handle busy: a second call on the same handle from another thread meanwhile gets
//! `KVTIER_BUSY` instead of a data race, and destroy waits for no one (it fails with
//! `KVTIER_BUSY` too). A panic inside a call poisons the handle.

use core::ffi::c_int;
use std::cell::UnsafeCell;
use std::collections::BTreeSet;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::manager::state::State;
use crate::status::{Status, fail, fail_plain};

/// An offload manager behind the C ABI (opaque to C).
#[allow(non_camel_case_types, reason = "C name")]
#[derive(Debug)]
pub struct kvtier_manager {
    busy: AtomicBool,
    poisoned: AtomicBool,
    state: UnsafeCell<State>,
}

/// Addresses of the live handles.
static LIVE: Mutex<BTreeSet<usize>> = Mutex::new(BTreeSet::new());

fn live() -> MutexGuard<'static, BTreeSet<usize>> {
    // Nothing panics while the set is locked; recover anyway.
    LIVE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Boxes `state` as a new live handle.
pub(crate) fn register(state: State) -> *mut kvtier_manager {
    let ptr = Box::into_raw(Box::new(kvtier_manager {
        busy: AtomicBool::new(false),
        poisoned: AtomicBool::new(false),
        state: UnsafeCell::new(state),
    }));
    live().insert(ptr as usize);
    ptr
}

/// A call's exclusive access to a live handle; releases it when dropped (and poisons it when
/// dropped by a panic).
pub(crate) struct Entered<'a> {
    handle: &'a kvtier_manager,
}

impl Entered<'_> {
    /// The handle's state, exclusively.
    pub(crate) fn state(&mut self) -> &mut State {
        // SAFETY: `busy` was set by this guard's `enter` and is cleared only by its drop, so no
        // other `Entered` (and no destroy) exists for this handle; `&mut self` makes this the
        // only borrow through the guard.
        unsafe { &mut *self.handle.state.get() }
    }
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.handle.poisoned.store(true, Ordering::Release);
        }
        self.handle.busy.store(false, Ordering::Release);
    }
}

/// Looks `ptr` up among the live handles and takes it.
fn enter<'a>(ptr: *const kvtier_manager) -> Result<Entered<'a>, Status> {
    if ptr.is_null() {
        return Err(fail(
            Status::KVTIER_NULL_POINTER,
            "the manager handle is NULL",
        ));
    }
    let set = live();
    if !set.contains(&(ptr as usize)) {
        return Err(fail_plain(Status::KVTIER_INVALID_HANDLE));
    }
    // SAFETY: `ptr` is in LIVE, so it came from `Box::into_raw` in `register` and has not been
    // freed: `destroy` removes it from LIVE (under this lock) before freeing it, and cannot
    // free it while the `busy` flag taken below is held.
    let handle = unsafe { &*ptr };
    if handle
        .busy
        .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        return Err(fail_plain(Status::KVTIER_BUSY));
    }
    drop(set);
    let entered = Entered { handle };
    if entered.handle.poisoned.load(Ordering::Acquire) {
        return Err(fail_plain(Status::KVTIER_POISONED));
    }
    Ok(entered)
}

/// Destroys a live handle.
pub(crate) fn destroy(ptr: *mut kvtier_manager) -> Result<(), Status> {
    if ptr.is_null() {
        return Err(fail(
            Status::KVTIER_NULL_POINTER,
            "the manager handle is NULL",
        ));
    }
    let mut set = live();
    if !set.contains(&(ptr as usize)) {
        return Err(fail_plain(Status::KVTIER_INVALID_HANDLE));
    }
    // SAFETY: as in `enter`: a pointer in LIVE points to a handle that is not freed.
    let handle = unsafe { &*ptr };
    if handle
        .busy
        .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        return Err(fail_plain(Status::KVTIER_BUSY));
    }
    set.remove(&(ptr as usize));
    drop(set);
    // SAFETY: `ptr` came from `Box::into_raw`; it is out of LIVE, so no new call can reach it,
    // and the busy flag we hold means no call is inside it: we own it.
    drop(unsafe { Box::from_raw(ptr) });
    Ok(())
}

/// Runs `f` with panics caught: `KVTIER_OK`, the error's status, or `KVTIER_PANIC`.
pub(crate) fn call(f: impl FnOnce() -> Result<(), Status>) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => Status::KVTIER_OK.code(),
        Ok(Err(s)) => s.code(),
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .copied()
                .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
                .unwrap_or("a panic without a message");
            fail(
                Status::KVTIER_PANIC,
                format_args!("kvtier panicked (a bug): {what}"),
            )
            .code()
        }
    }
}

/// Runs `f` on the state of the live handle `ptr`, exclusively, with panics caught.
pub(crate) fn with_state(
    ptr: *const kvtier_manager,
    f: impl FnOnce(&mut State) -> Result<(), Status>,
) -> c_int {
    call(|| {
        let mut entered = enter(ptr)?;
        f(entered.state())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::kvtier_config;

    fn last_error() -> String {
        // SAFETY: the thread's detail buffer is NUL-terminated and lives as long as the thread.
        let detail = unsafe { core::ffi::CStr::from_ptr(crate::status::last_error_ptr()) };
        detail.to_string_lossy().into_owned()
    }

    fn new_handle() -> *mut kvtier_manager {
        register(State::new(&kvtier_config::defaults(4)).unwrap())
    }

    #[test]
    fn a_panic_is_caught_and_poisons_the_handle() {
        let h = new_handle();
        let rc = with_state(h, |_| panic!("injected"));
        assert_eq!(rc, Status::KVTIER_PANIC.code());
        assert_eq!(last_error(), "kvtier panicked (a bug): injected");
        // Poisoned: every call but destroy is refused, and the busy flag was released.
        assert_eq!(with_state(h, |_| Ok(())), Status::KVTIER_POISONED.code());
        assert_eq!(destroy(h), Ok(()));
        assert_eq!(
            with_state(h, |_| Ok(())),
            Status::KVTIER_INVALID_HANDLE.code()
        );
    }

    #[test]
    fn a_panic_with_a_formatted_message_is_reported() {
        let n = 7;
        assert_eq!(call(|| panic!("value {n}")), Status::KVTIER_PANIC.code());
        assert_eq!(last_error(), "kvtier panicked (a bug): value 7");
    }

    #[test]
    fn a_busy_handle_refuses_calls_and_destroy() {
        let h = new_handle();
        let rc = with_state(h, |_| {
            // A second entry while the first is inside (what another thread would see).
            assert_eq!(with_state(h, |_| Ok(())), Status::KVTIER_BUSY.code());
            assert_eq!(destroy(h), Err(Status::KVTIER_BUSY));
            Ok(())
        });
        assert_eq!(rc, Status::KVTIER_OK.code());
        assert_eq!(destroy(h), Ok(()));
        assert_eq!(destroy(h), Err(Status::KVTIER_INVALID_HANDLE));
    }

    #[test]
    fn a_pointer_never_registered_is_not_dereferenced() {
        // A dangling, misaligned address: looked up, never read.
        let bogus = 0x10 as *const kvtier_manager;
        assert_eq!(
            with_state(bogus, |_| Ok(())),
            Status::KVTIER_INVALID_HANDLE.code()
        );
        assert_eq!(
            with_state(core::ptr::null(), |_| Ok(())),
            Status::KVTIER_NULL_POINTER.code()
        );
    }
}
