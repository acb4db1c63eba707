//! Capacity arithmetic: KV layouts, page sizes, blocks from a memory budget, the CPU tier's size.
