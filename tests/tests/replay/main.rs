//! `kvtier replay` and the replayer: vLLM 0.33.0's results on the sample traces, the command
//! end to end, its typed errors, and the engine model's GPU front (dense, hybrid, simple).

mod errors_cli;
mod gpu_front;
mod gpu_front_hybrid;
mod gpu_front_simple;
mod replay_cli;
mod replay_expected;
mod replayer;
