//! Checked views of the caller's pointers: NULL, alignment and byte-size overflow are reported
//! as statuses before anything is read or written.

use core::marker::PhantomData;
use core::mem::size_of;

use crate::status::{Status, fail};

/// Checks what `slice::from_raw_parts` needs that can be checked: non-NULL (unless `len` is
/// 0), aligned, and a byte size within `isize::MAX`.
fn check<T>(ptr: *const T, len: usize, name: &str, len_name: &str) -> Result<(), Status> {
    if len == 0 {
        return Ok(());
    }
    if ptr.is_null() {
        return Err(fail(
            Status::KVTIER_NULL_POINTER,
            format_args!("{name} is NULL but {len_name} is {len}"),
        ));
    }
    if !ptr.is_aligned() {
        return Err(fail(
            Status::KVTIER_INVALID_ARGUMENT,
            format_args!(
                "{name} is not aligned to {} bytes",
                core::mem::align_of::<T>()
            ),
        ));
    }
    let fits = len
        .checked_mul(size_of::<T>())
        .is_some_and(|b| isize::try_from(b).is_ok());
    if !fits {
        return Err(fail(
            Status::KVTIER_INVALID_ARGUMENT,
            format_args!("{len_name} ({len}) is too large for an array of {name}"),
        ));
    }
    Ok(())
}

/// The caller's input array `ptr[0..len]` (NULL is accepted when `len` is 0).
///
/// # Safety
/// When `len > 0` and `ptr` is non-NULL, `ptr` must point to `len` initialized values of `T`
/// that are not written to while the returned slice lives.
pub(crate) unsafe fn input<'a, T>(
    ptr: *const T,
    len: usize,
    name: &str,
    len_name: &str,
) -> Result<&'a [T], Status> {
    check(ptr, len, name, len_name)?;
    if len == 0 {
        return Ok(&[]);
    }
    // SAFETY: `check` proved `ptr` non-NULL, aligned and `len · size_of::<T>() ≤ isize::MAX`;
    // the caller guarantees `len` initialized, unaliased-by-writes values.
    Ok(unsafe { core::slice::from_raw_parts(ptr, len) })
}

/// An optional input array: NULL means "not given".
///
/// # Safety
/// As [`input`] when `ptr` is non-NULL.
pub(crate) unsafe fn optional_input<'a, T>(
    ptr: *const T,
    len: usize,
    name: &str,
    len_name: &str,
) -> Result<Option<&'a [T]>, Status> {
    if ptr.is_null() {
        return Ok(None);
    }
    // SAFETY: forwarded from the caller.
    unsafe { input(ptr, len, name, len_name) }.map(Some)
}

/// The caller's single input value `*ptr`.
///
/// # Safety
/// When non-NULL, `ptr` must point to an initialized `T` not written to while the reference
/// lives.
pub(crate) unsafe fn input_ref<'a, T>(ptr: *const T, name: &str) -> Result<&'a T, Status> {
    check(ptr, 1, name, "its length")?;
    // SAFETY: `check` proved `ptr` non-NULL and aligned; the caller guarantees the value.
    Ok(unsafe { &*ptr })
}

/// An output array of `cap` elements of the caller's, possibly uninitialized: written, never
/// read.
pub(crate) struct OutBuf<'a, T> {
    ptr: *mut T,
    cap: usize,
    _borrow: PhantomData<&'a mut [T]>,
}

impl<'a, T: Copy> OutBuf<'a, T> {
    /// Checks the buffer (NULL is accepted when `cap` is 0).
    ///
    /// # Safety
    /// When `cap > 0` and `ptr` is non-NULL, `ptr` must be valid for writes of `cap` values of
    /// `T`, not accessed by anyone else while the buffer lives.
    pub(crate) unsafe fn new(ptr: *mut T, cap: usize, name: &str) -> Result<Self, Status> {
        check(ptr.cast_const(), cap, name, "its capacity")?;
        Ok(OutBuf {
            ptr,
            cap,
            _borrow: PhantomData,
        })
    }

    /// Whether `n` values fit.
    pub(crate) fn fits(&self, n: usize) -> bool {
        n <= self.cap
    }

    /// Writes `src` to the front of the buffer. The caller checked [`fits`](Self::fits); a
    /// longer `src` is cut to the capacity.
    pub(crate) fn write(&mut self, src: &[T]) {
        let n = src.len().min(self.cap);
        if n == 0 {
            return;
        }
        // SAFETY: `new` checked `ptr` non-NULL (as `cap > 0`) and aligned, and its caller
        // guaranteed it valid for `cap ≥ n` writes not overlapping `src` (which we borrow
        // from our own memory).
        unsafe { core::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr, n) };
    }
}

/// A required output value of the caller's, possibly uninitialized: written, never read.
pub(crate) struct OutRef<'a, T> {
    ptr: *mut T,
    _borrow: PhantomData<&'a mut T>,
}

impl<T> OutRef<'_, T> {
    /// Checks the pointer: non-NULL and aligned.
    ///
    /// # Safety
    /// When non-NULL, `ptr` must be valid for a write of one `T`, not accessed by anyone else
    /// while the value lives.
    pub(crate) unsafe fn new(ptr: *mut T, name: &str) -> Result<Self, Status> {
        check(ptr.cast_const(), 1, name, "its length")?;
        Ok(OutRef {
            ptr,
            _borrow: PhantomData,
        })
    }

    /// Writes `v` (without reading or dropping the old value).
    pub(crate) fn set(&mut self, v: T) {
        // SAFETY: `new` checked `ptr` non-NULL and aligned, and its caller guaranteed it
        // valid for one write.
        unsafe { self.ptr.write(v) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_null_alignment_and_size() {
        let v = [1u64, 2, 3];
        // SAFETY: `v` holds 3 initialized values.
        let all = unsafe { input(v.as_ptr(), 3, "keys", "n_keys") };
        assert_eq!(all, Ok(&v[..]));
        // SAFETY: length 0: nothing is read.
        let empty = unsafe { input::<u64>(core::ptr::null(), 0, "keys", "n_keys") };
        assert_eq!(empty, Ok(&[][..]));
        // SAFETY: NULL with a length is rejected before any read.
        let null = unsafe { input::<u64>(core::ptr::null(), 2, "keys", "n_keys") };
        assert_eq!(null, Err(Status::KVTIER_NULL_POINTER));
        let misaligned = v.as_ptr().cast::<u8>().wrapping_add(1).cast::<u64>();
        // SAFETY: a misaligned pointer is rejected before any read.
        let odd = unsafe { input(misaligned, 1, "keys", "n_keys") };
        assert_eq!(odd, Err(Status::KVTIER_INVALID_ARGUMENT));
        // SAFETY: an oversized length is rejected before any read.
        let huge = unsafe { input(v.as_ptr(), usize::MAX / 4, "keys", "n_keys") };
        assert_eq!(huge, Err(Status::KVTIER_INVALID_ARGUMENT));
        // SAFETY: NULL means "not given": nothing is read.
        let absent = unsafe { optional_input::<u64>(core::ptr::null(), 5, "end_tokens", "n") };
        assert_eq!(absent, Ok(None));
    }

    #[test]
    fn out_buf_writes_only_what_fits() {
        let mut dst = [0u32; 2];
        // SAFETY: `dst` has room for 2 values.
        let mut out = unsafe { OutBuf::new(dst.as_mut_ptr(), 2, "slots") }.unwrap();
        assert!(out.fits(2) && !out.fits(3));
        out.write(&[7, 8, 9]);
        assert_eq!(dst, [7, 8]);
        // SAFETY: capacity 0: nothing is written.
        let mut empty = unsafe { OutBuf::<u32>::new(core::ptr::null_mut(), 0, "slots") }.unwrap();
        assert!(empty.fits(0) && !empty.fits(1));
        empty.write(&[]);
    }
}
