//! Fixed-capacity slot allocators over `u32` indices, sized once and never growing.
//!
//! * [`SlotPool`]: fresh ids ascending, then a LIFO stack of freed ids — the CPU tier's order.
//! * [`FreeQueue`]: an intrusive doubly linked list with O(1) removal from the middle — the GPU
//!   block pool's free-block order.
//!
//! Both are O(1) per block and allocate nothing after construction.

mod free_queue;
mod slot_pool;

pub use free_queue::{FreeQueue, PopError, PushError, QueueAllocError, QueueIter, RemoveError};
pub use slot_pool::{SlotError, SlotPool};
