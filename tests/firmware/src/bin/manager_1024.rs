//! The smallest image worth measuring: one 1,024-chunk LRU manager running the shared workload
//! in a 96 KiB heap, nothing else. `size` of this image is the flash and RAM a manager of
//! 1,024 chunks costs on a Cortex-M4 (see docs/embedded.md).
#![no_std]
#![no_main]

use core::mem::MaybeUninit;

use cortex_m_rt::entry;
use cortex_m_semihosting::hprintln;
use kvtier_core::manager::PolicyKind;
use kvtier_firmware::{PeakHeap, exit, scenarios};

/// 96 KiB: the LRU workload's peak is about 91,000 bytes.
const HEAP_SIZE: usize = 96 * 1024;

#[global_allocator]
static HEAP: PeakHeap = PeakHeap::empty();

#[entry]
fn main() -> ! {
    static mut HEAP_MEM: [MaybeUninit<u8>; HEAP_SIZE] = [MaybeUninit::uninit(); HEAP_SIZE];
    // SAFETY: `#[entry]` gives this function the only `&mut` to `HEAP_MEM`; the heap is
    // initialised once, before anything allocates, over memory nothing else uses.
    unsafe { HEAP.init(HEAP_MEM.as_mut_ptr() as usize, HEAP_SIZE) };
    let (r, manager_heap) = scenarios::workload(PolicyKind::Lru, 1024, 3_000);
    hprintln!(
        "manager_1024 lru digest={:016x} resident={} manager_heap={} peak_heap={} heap={}",
        r.digest,
        r.resident,
        manager_heap,
        HEAP.peak(),
        HEAP_SIZE
    );
    exit(true)
}
