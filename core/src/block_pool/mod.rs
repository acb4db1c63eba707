//! vLLM's GPU-style block pool: null block 0, prefix-hash map, ref counts.
