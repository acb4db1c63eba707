//! `kvtier sweep` and its curves: rows equal to single replays, the one-pass LRU stack and
//! the sampled curves, and the simple offloader's sweep.

mod curve_sampled;
mod curve_stack;
mod sweep;
mod sweep_methods;
mod sweep_simple;
