//! The CPU offload manager (vLLM 0.33.0 `CPUOffloadingManager`).
