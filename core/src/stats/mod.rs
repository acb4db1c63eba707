//! Statistics that leave a manager or a pool.
//!
//! | module | holds |
//! |---|---|
//! | [`histogram`] | [`Histogram`]: integer bucket counts over fixed bounds |
//! | [`cpu_tier_info`] | [`CpuTierInfo`]: the CPU tier's facts, the labels of `vllm:kv_offload_config_info` |
//! | [`catalogue`] | vLLM 0.33.0's metric families: names, kinds, help, labels, bounds, units |
//! | [`payload`] | [`Payload`]: the self-describing, integer-exact stats payload and `aggregate` |
//! | [`reduce`] | [`Payload::reduce`]: the flat `key → f64` summary of vLLM's log line |
//! | [`wire`] | the canonical, versioned binary encoding of a payload |
//! | [`simple_offload`] | the simple CPU offloader's stats source (save outcomes, loads, gauges) |

pub mod catalogue;
pub mod cpu_tier_info;
pub mod histogram;
pub mod payload;
pub mod reduce;
pub mod simple_offload;
pub mod wire;

pub use catalogue::{MetricDef, MetricKind, Unit};
pub use cpu_tier_info::CpuTierInfo;
pub use histogram::{Histogram, HistogramError};
pub use payload::{
    AggregateError, Gauge, InfoError, InfoSeries, InfoValue, LabelError, Labels, Payload, Series,
    Text, UpdateError, Value,
};
