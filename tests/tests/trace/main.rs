//! Traces: the kvtrace reader, the compact trace, the workload generator, Mooncake JSONL, and
//! the regressions the fuzz targets found.

mod compact_trace;
mod fuzz_regressions;
mod mooncake;
mod trace_generator;
mod trace_reader;
