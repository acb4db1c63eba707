//! The core's simple CPU offloader: vLLM 0.33.0's scheduler tests, ported, and the
//! model-based proptests against `kvtier_tests::simple_model`.

mod simple_model;
mod simple_scenarios;
mod simple_scenarios_lifecycle;
