//! kvtier-core on a Cortex-M4 (`thumbv7em-none-eabihf`, QEMU `mps2-an386`).
//!
//! Runs, with a fixed heap (`embedded-alloc`), the same code the host tests run (the shared
//! modules of `tests/src`, see the library):
//! 1. every manager scenario port (C1, C3, C4, C5, C7, C9, ARC);
//! 2. the allocator models against `SlotPool`/`FreeQueue` over a fixed pseudo-random sequence;
//! 3. the Llama-3-8B capacity hand check;
//! 4. a 1,024-chunk workload under LRU and ARC, with the heap it needed.
//!
//! Each result is one semihosting line; the host runner (`tests/tests/manager/cortex_m.rs`)
//! compares them with the same functions run on the host. The exit status is success only when
//! every check passed; a panic prints its message and exits with failure.
#![no_std]
#![no_main]

use core::mem::MaybeUninit;

use cortex_m_rt::entry;
use cortex_m_semihosting::hprintln;
use kvtier_core::manager::PolicyKind;
use kvtier_firmware::{PeakHeap, allocator_model, exit, scenarios};

/// The heap: enough for the scenarios with vLLM's default sizes (C1's event queue of 65,536
/// keys and C5's reuse tracker of 64,000 keys are the largest).
const HEAP_SIZE: usize = 3 * 1024 * 1024;

#[global_allocator]
static HEAP: PeakHeap = PeakHeap::empty();

#[entry]
fn main() -> ! {
    static mut HEAP_MEM: [MaybeUninit<u8>; HEAP_SIZE] = [MaybeUninit::uninit(); HEAP_SIZE];
    // SAFETY: `#[entry]` gives this function the only `&mut` to `HEAP_MEM`; the heap is
    // initialised once, before anything allocates, over memory nothing else uses.
    unsafe { HEAP.init(HEAP_MEM.as_mut_ptr() as usize, HEAP_SIZE) };

    hprintln!("kvtier firmware: heap {} bytes", HEAP_SIZE);
    for (name, run) in scenarios::ALL {
        let base = HEAP.reset_peak();
        run();
        hprintln!("scenario {} ok peak_heap={}", name, HEAP.peak() - base);
    }

    match allocator_model::run_fixed_sequence(7, 24, 4_000) {
        Ok(r) => hprintln!(
            "allocator_model steps={} slot_ok={} queue_ok={} checksum={:016x}",
            r.steps,
            r.slot_ok,
            r.queue_ok,
            r.checksum
        ),
        Err(e) => panic!("allocator model: {e}"),
    }

    scenarios::capacity_llama_3_8b();
    hprintln!("capacity llama-3-8b bytes_per_block=2097152 ok");

    for policy in [PolicyKind::Lru, PolicyKind::Arc] {
        let base = HEAP.reset_peak();
        let (r, manager_heap) = scenarios::workload(policy, 1024, 3_000);
        hprintln!(
            "workload {} chunks=1024 requests={} hit_blocks={} stored_blocks={} \
             evicted_blocks={} store_failures={} stopped_at_pending={} resident={} \
             digest={:016x} manager_heap={} peak_heap={}",
            policy,
            r.requests,
            r.hit_blocks,
            r.stored_blocks,
            r.evicted_blocks,
            r.store_failures,
            r.stopped_at_pending,
            r.resident,
            r.digest,
            manager_heap,
            HEAP.peak() - base
        );
    }

    hprintln!("kvtier firmware: all checks passed");
    exit(true)
}
