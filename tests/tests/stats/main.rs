//! Stats payloads, their wire encoding and their export: vLLM's scenarios, property tests
//! against the reference model, the Prometheus exporter and the collector.

mod collector;
mod export;
mod stats_props;
mod stats_scenarios;
mod stats_strategies;
mod wire_props;
