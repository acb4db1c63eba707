//! What the firmware images share: the host tests' modules (included by path, so both run the
//! same code), a heap that records its peak, the panic handler and the semihosting exit.
#![no_std]

extern crate alloc;

use core::alloc::{GlobalAlloc, Layout};
use core::sync::atomic::{AtomicUsize, Ordering};

use cortex_m_semihosting::{debug, hprintln};
use embedded_alloc::LlffHeap;

#[path = "../../src/allocator_model.rs"]
pub mod allocator_model;

#[path = "../../src/scenarios.rs"]
pub mod scenarios;

#[path = "../../src/store.rs"]
pub mod store;

/// `embedded-alloc`'s linked-list first-fit heap, plus the peak of its `used()` bytes.
pub struct PeakHeap {
    heap: LlffHeap,
    peak: AtomicUsize,
}

impl PeakHeap {
    /// An uninitialised heap (see [`PeakHeap::init`]).
    #[must_use]
    pub const fn empty() -> Self {
        PeakHeap {
            heap: LlffHeap::empty(),
            peak: AtomicUsize::new(0),
        }
    }

    /// Gives the heap `size` bytes at `start`.
    ///
    /// # Safety
    /// Once, before anything allocates, over memory nothing else uses (as
    /// `LlffHeap::init`).
    pub unsafe fn init(&self, start: usize, size: usize) {
        // SAFETY: forwarded from the caller.
        unsafe { self.heap.init(start, size) }
    }

    /// Bytes in use now.
    pub fn used(&self) -> usize {
        self.heap.used()
    }

    /// The most bytes in use since the last [`reset_peak`](Self::reset_peak).
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }

    /// Starts a new peak measurement at the current use, which it returns.
    pub fn reset_peak(&self) -> usize {
        let now = self.heap.used();
        self.peak.store(now, Ordering::Relaxed);
        now
    }
}

// SAFETY: every call is forwarded unchanged to `LlffHeap`, a correct `GlobalAlloc`; the peak
// bookkeeping touches no allocated memory.
unsafe impl GlobalAlloc for PeakHeap {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees for `layout`.
        let p = unsafe { self.heap.alloc(layout) };
        self.peak.fetch_max(self.heap.used(), Ordering::Relaxed);
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded: `ptr` came from this allocator with this `layout`.
        unsafe { self.heap.dealloc(ptr, layout) }
    }
}

/// Ends the run through semihosting: QEMU exits with 0 for `true`, 1 for `false`.
pub fn exit(success: bool) -> ! {
    debug::exit(if success {
        debug::EXIT_SUCCESS
    } else {
        debug::EXIT_FAILURE
    });
    loop {
        cortex_m::asm::wfi();
    }
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
    hprintln!("kvtier firmware: FAILED: {}", info);
    exit(false)
}
