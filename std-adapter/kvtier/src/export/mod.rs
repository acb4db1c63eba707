//! Prometheus export of stats payloads with the `prometheus` crate, on a registry the caller
//! owns (never the crate's global default registry).
//!
//! [`OffloadExporter::register`] adds one pull-style collector to the caller's
//! [`Registry`]. [`OffloadExporter::observe`] feeds it one drained payload of one engine:
//!
//! 1. the whole payload is checked against the catalogue first (unknown name, kind, label
//!    count, histogram bounds, the engine index); on any error nothing is applied;
//! 2. counters add the payload's increment to a per-engine total (saturating `u64`; totals
//!    only grow, so an exported counter never goes backwards, also across a manager's
//!    `reset_cache`), gauges keep the latest value, histograms merge bucket counts exactly;
//! 3. each info series becomes a `vllm:kv_offload_config_info` series of value 1 with the
//!    declared labels (a declared label a series does not fill is `""`, undeclared labels are
//!    dropped, `None` is `"None"`), kept from then on as vLLM keeps its gauge children.
//!
//! Every family the catalogue marks [`zero_at_start`](catalogue::MetricDef::zero_at_start)
//! (the offloading connector's, and `vllm:num_requests_running`) has its series from the moment
//! an engine exists, at zero, so a dashboard panel has a series to draw before the first
//! observation; the others appear when first observed. An engine running the simple CPU
//! offloader has no offloading-connector family at all in vLLM:
//! [`ExporterConfig::offloading_connector_series`] leaves them out.
//!
//! At scrape time the collector copies the per-engine totals under the lock and builds the
//! metric families outside it. The names are the ones a vLLM server exposes, with the engine
//! labels `model_name` and `engine`: counters get `_total`
//! (`vllm:kv_offload_stores_skipped_total`, also in `# HELP` and `# TYPE`), histograms
//! `_bucket`/`_count`/`_sum` with the catalogue's bounds in exported units (nanoseconds →
//! seconds). `vllm:cache_config_info` carries `engine` and the cache-config attributes, as in
//! vLLM (no `model_name`). [`encode_text`] writes the registry as `prometheus_client` writes
//! it ([`text`]); [`render`] is the text of one payload (what `kvtier replay --metrics` prints).
//! There is no `_created` series: the totals are not tied to a clock.
//!
//! ```
//! use kvtier::export::{ExporterConfig, OffloadExporter, encode_text};
//! use kvtier_core::stats::{Payload, catalogue};
//! use prometheus::Registry;
//!
//! let registry = Registry::new();
//! let exporter = OffloadExporter::register(&registry, ExporterConfig::new("m", 1))?;
//! let mut p = Payload::new();
//! p.increase_counter(catalogue::STORES_SKIPPED, &[], 3)?;
//! exporter.observe(&p, 0)?;
//! exporter.observe(&p, 0)?;
//! let text = encode_text(&registry)?;
//! assert!(text.contains("# TYPE vllm:kv_offload_stores_skipped_total counter\n"));
//! assert!(text.contains("vllm:kv_offload_stores_skipped_total{engine=\"0\",model_name=\"m\"} 6.0\n"));
//! // Shown from the start, at zero.
//! assert!(text.contains("vllm:kv_offload_load_bytes_total{engine=\"0\",model_name=\"m\"} 0.0\n"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod cache_config;
mod families;
mod log_line;
pub mod text;

pub use cache_config::{CacheConfigInfo, UnknownAttribute};
pub use log_line::{log_line, python_float_str};
pub use text::{encode_families, format_float};

use std::collections::{BTreeSet, HashMap};
use std::fmt;

use kvtier_core::stats::catalogue::{
    self, CACHE_CONFIG_INFO, CACHE_CONFIG_INFO_LABELS, CONFIG_INFO, CPU_CONFIG_INFO_LABELS,
    DEPRECATED_SIZE, DEPRECATED_TOTAL_BYTES, DEPRECATED_TOTAL_TIME, MetricDef, MetricKind,
    SeriesMismatch,
};
use kvtier_core::stats::{AggregateError, Gauge, Histogram, Payload, Series};
use prometheus::Registry;
use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;

use crate::sync::{Arc, Mutex, lock};

/// The `Content-Type` of the text exposition (`text/plain; version=0.0.4`).
pub const CONTENT_TYPE: &str = prometheus::TEXT_FORMAT;

/// The most distinct `vllm:kv_offload_config_info` series one engine keeps.
pub const MAX_INFO_SERIES_PER_ENGINE: usize = 64;

/// The engine labels of one engine: `model_name` and `engine` (its index, as text).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Engine {
    /// The served model name.
    pub model_name: String,
    /// The engine label (vLLM uses the engine index).
    pub engine: String,
}

impl Engine {
    /// An engine with these labels.
    #[must_use]
    pub fn new(model_name: impl Into<String>, engine: impl Into<String>) -> Self {
        Engine {
            model_name: model_name.into(),
            engine: engine.into(),
        }
    }
}

/// How an [`OffloadExporter`] is built.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ExporterConfig {
    /// The engines, in index order (`observe(…, i)` refers to `engines[i]`). More can be added
    /// with [`OffloadExporter::add_engine`].
    pub engines: Vec<Engine>,
    /// The label names the offloading spec declares for `vllm:kv_offload_config_info` (the
    /// CPU spec's four by default).
    pub config_info_labels: Vec<String>,
    /// Also expose the deprecated `transfer_type` families (`vllm:kv_offload_total_bytes`,
    /// `_total_time`, `_size`) mirrored from the unlabeled load/store series, present from the
    /// start at 0 for every engine, as vLLM does for the CPU offloading spec (default true).
    pub deprecated_transfer_series: bool,
    /// Show the offloading connector's families (`vllm:kv_offload_*`) from the start at zero,
    /// as vLLM does for the `OffloadingConnector` (default true). False for an engine that
    /// runs the `SimpleCPUOffloadConnector`: vLLM registers none of those families there, so
    /// a dashboard's KV offloading row has no data rather than zeros. The deprecated
    /// `transfer_type` families are then left out too.
    pub offloading_connector_series: bool,
}

impl ExporterConfig {
    /// `num_engines` engines of `model_name`, labelled `engine="0"`, `"1"`, …; the CPU spec's
    /// info labels; the offloading connector's families and the deprecated transfer series on.
    #[must_use]
    pub fn new(model_name: &str, num_engines: u32) -> Self {
        ExporterConfig {
            engines: (0..num_engines)
                .map(|i| Engine::new(model_name, i.to_string()))
                .collect(),
            config_info_labels: CPU_CONFIG_INFO_LABELS
                .iter()
                .map(|s| (*s).to_owned())
                .collect(),
            deprecated_transfer_series: true,
            offloading_connector_series: true,
        }
    }
}

/// Why an exporter could not be built or extended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExporterError {
    /// Two engines have the same labels (their series would collide).
    DuplicateEngine(Engine),
    /// A declared info label is not a valid Prometheus label name, or repeats an engine label.
    InvalidLabel(String),
    /// The registry refused the collector (e.g. the same families are registered already).
    Register(String),
}

impl fmt::Display for ExporterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExporterError::DuplicateEngine(e) => write!(
                f,
                "engine model_name={:?} engine={:?} is declared twice",
                e.model_name, e.engine
            ),
            ExporterError::InvalidLabel(l) => {
                write!(f, "{l:?} cannot be an info label name")
            }
            ExporterError::Register(m) => write!(f, "the registry refused the exporter: {m}"),
        }
    }
}

impl std::error::Error for ExporterError {}

/// Why a payload was not observed (nothing of it was applied).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ObserveError {
    /// No engine has this index.
    UnknownEngine(usize),
    /// A series does not fit its catalogue family.
    Series(SeriesMismatch),
    /// The engine's totals would exceed a payload's series limit.
    TooManySeries,
    /// The engine would keep more than [`MAX_INFO_SERIES_PER_ENGINE`] info series.
    TooManyInfoSeries,
}

impl fmt::Display for ObserveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ObserveError::UnknownEngine(i) => write!(f, "no engine has index {i}"),
            ObserveError::Series(e) => write!(f, "{e}"),
            ObserveError::TooManySeries => {
                write!(
                    f,
                    "the engine's totals would exceed the series limit of a payload"
                )
            }
            ObserveError::TooManyInfoSeries => write!(
                f,
                "an engine keeps at most {MAX_INFO_SERIES_PER_ENGINE} config info series"
            ),
        }
    }
}

impl std::error::Error for ObserveError {}

/// Why the registry could not be encoded: a name the text format cannot carry.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EncodeError {
    /// A family name is not a valid Prometheus metric name.
    MetricName(String),
    /// A label name is not a valid Prometheus label name.
    LabelName {
        /// The label.
        label: String,
        /// The family that carries it.
        family: String,
    },
}

impl fmt::Display for EncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("encoding the metrics failed: ")?;
        match self {
            EncodeError::MetricName(name) => write!(f, "{name:?} is not a metric name"),
            EncodeError::LabelName { label, family } => {
                write!(f, "{label:?} of {family} is not a label name")
            }
        }
    }
}

impl std::error::Error for EncodeError {}

/// What the exporter holds for one engine.
#[derive(Clone, Debug, Default)]
struct EngineState {
    /// Counters summed, gauges latest, histograms merged (info left aside).
    totals: Payload,
    /// Every `config_info` label-value tuple seen, in declared-label order.
    info: BTreeSet<Vec<String>>,
    /// The `vllm:cache_config_info` label values, in catalogue order.
    cache_config: Option<Vec<String>>,
}

impl EngineState {
    /// A new engine: every unlabelled `zero_at_start` family at zero (the deprecated
    /// `transfer_type` families mirror these, so they are at zero too), the offloading
    /// connector's only when `offloading` says so.
    fn new(offloading: bool) -> Self {
        let mut totals = Payload::new();
        let wanted = |d: &&MetricDef| {
            d.zero_at_start
                && d.labels.is_empty()
                && (offloading || !d.name.starts_with(OFFLOADING_CONNECTOR_PREFIX))
        };
        for def in catalogue::all().filter(wanted) {
            // A fresh payload has room for every catalogue family, and the catalogue's
            // bounds are valid, so none of these can fail.
            let _ = match def.kind {
                MetricKind::Counter => totals.increase_counter(def.name, &[], 0),
                MetricKind::Gauge => totals.set_gauge(def.name, &[], Gauge::ZERO),
                MetricKind::Histogram => match Histogram::new(def.bounds) {
                    Ok(h) => totals.merge_histogram(def.name, &[], &h),
                    Err(_) => Ok(()),
                },
            };
        }
        EngineState {
            totals,
            ..EngineState::default()
        }
    }
}

#[derive(Debug, Default)]
struct State {
    engines: Vec<Engine>,
    states: Vec<EngineState>,
}

#[derive(Debug)]
struct Inner {
    descs: Vec<Desc>,
    config_info_labels: Vec<String>,
    deprecated: bool,
    /// [`ExporterConfig::offloading_connector_series`].
    offloading: bool,
    state: Mutex<State>,
}

/// The Prometheus exporter of kvtier's stats payloads (see the [module docs](self)).
///
/// Cloning gives another handle to the same exporter (an `Arc`).
#[derive(Clone, Debug)]
pub struct OffloadExporter {
    inner: Arc<Inner>,
}

/// The collector registered in the caller's registry: a handle to the same state.
#[derive(Debug)]
struct ExporterCollector(Arc<Inner>);

fn is_label_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !s.starts_with("__")
}

/// The label names a family is exposed with.
fn label_names(name: &str, extra: &[&str], info: &[String]) -> Vec<String> {
    if name == CACHE_CONFIG_INFO {
        return CACHE_CONFIG_INFO_LABELS
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
    }
    let mut v = vec!["model_name".to_owned(), "engine".to_owned()];
    if name == CONFIG_INFO {
        v.extend(info.iter().cloned());
    } else {
        v.extend(extra.iter().map(|s| (*s).to_owned()));
    }
    v
}

/// The exposed name: counters end in `_total` (once).
pub(crate) fn exposed_name(name: &str, kind: MetricKind) -> String {
    match kind {
        MetricKind::Counter if !name.ends_with("_total") => format!("{name}_total"),
        _ => name.to_owned(),
    }
}

/// The help text; `vllm:cache_config_info` says its figures are per engine.
pub(crate) fn help_text(name: &str, help: &str) -> String {
    if name == CACHE_CONFIG_INFO {
        format!(
            "{help} kv_cache_size_tokens and kv_cache_max_concurrency are per-engine values, \
             not summed across engines."
        )
    } else {
        help.to_owned()
    }
}

/// The name prefix of the offloading connector's families.
const OFFLOADING_CONNECTOR_PREFIX: &str = "vllm:kv_offload_";

fn is_deprecated(name: &str) -> bool {
    matches!(
        name,
        DEPRECATED_TOTAL_BYTES | DEPRECATED_TOTAL_TIME | DEPRECATED_SIZE
    )
}

fn check(s: &Series) -> Result<(), ObserveError> {
    catalogue::check_series(s)
        .map(|_| ())
        .map_err(ObserveError::Series)
}

impl OffloadExporter {
    /// Builds the exporter and registers its collector in `registry`.
    ///
    /// # Errors
    /// [`ExporterError`] for duplicate engines, an invalid info label name, or a registry
    /// that already holds these families.
    pub fn register(registry: &Registry, config: ExporterConfig) -> Result<Self, ExporterError> {
        let mut seen = BTreeSet::new();
        for e in &config.engines {
            if !seen.insert(e) {
                return Err(ExporterError::DuplicateEngine(e.clone()));
            }
        }
        let mut info_seen = BTreeSet::new();
        for l in &config.config_info_labels {
            if !is_label_name(l) || l == "model_name" || l == "engine" || !info_seen.insert(l) {
                return Err(ExporterError::InvalidLabel(l.clone()));
            }
        }
        let mut descs = Vec::new();
        for def in catalogue::all() {
            let deprecated =
                config.deprecated_transfer_series && config.offloading_connector_series;
            if is_deprecated(def.name) && !deprecated {
                continue;
            }
            let desc = Desc::new(
                exposed_name(def.name, def.kind),
                help_text(def.name, def.help),
                label_names(def.name, def.labels, &config.config_info_labels),
                HashMap::new(),
            )
            .map_err(|e| ExporterError::Register(e.to_string()))?;
            descs.push(desc);
        }
        let offloading = config.offloading_connector_series;
        let states = vec![EngineState::new(offloading); config.engines.len()];
        let inner = Arc::new(Inner {
            descs,
            config_info_labels: config.config_info_labels,
            deprecated: config.deprecated_transfer_series && offloading,
            offloading,
            state: Mutex::new(State {
                engines: config.engines,
                states,
            }),
        });
        registry
            .register(Box::new(ExporterCollector(Arc::clone(&inner))))
            .map_err(|e| ExporterError::Register(e.to_string()))?;
        Ok(OffloadExporter { inner })
    }

    /// Adds an engine and returns its index.
    ///
    /// # Errors
    /// [`ExporterError::DuplicateEngine`] when an engine with the same labels exists.
    pub fn add_engine(&self, engine: Engine) -> Result<usize, ExporterError> {
        let mut st = lock(&self.inner.state);
        if st.engines.contains(&engine) {
            return Err(ExporterError::DuplicateEngine(engine));
        }
        st.engines.push(engine);
        st.states.push(EngineState::new(self.inner.offloading));
        Ok(st.states.len() - 1)
    }

    /// The engines, in index order.
    #[must_use]
    pub fn engines(&self) -> Vec<Engine> {
        lock(&self.inner.state).engines.clone()
    }

    /// Applies one drained payload of engine `engine` (see the [module docs](self)).
    ///
    /// # Errors
    /// [`ObserveError`] when the engine is unknown or a series does not match the catalogue;
    /// nothing is applied then.
    pub fn observe(&self, payload: &Payload, engine: usize) -> Result<(), ObserveError> {
        payload.series().iter().try_for_each(check)?;
        let tuples: Vec<Vec<String>> = payload
            .info()
            .unwrap_or(&[])
            .iter()
            .map(|series| {
                self.inner
                    .config_info_labels
                    .iter()
                    .map(|k| series.get(k).map(ToString::to_string).unwrap_or_default())
                    .collect()
            })
            .collect();
        let mut st = lock(&self.inner.state);
        let state = st
            .states
            .get_mut(engine)
            .ok_or(ObserveError::UnknownEngine(engine))?;
        let new_info = tuples.iter().filter(|t| !state.info.contains(*t)).count();
        if state.info.len() + new_info > MAX_INFO_SERIES_PER_ENGINE {
            return Err(ObserveError::TooManyInfoSeries);
        }
        state.totals.aggregate(payload).map_err(|e| match e {
            // Both are excluded by the catalogue check above (one kind and one set of bounds
            // per name), so only the series limit can be hit.
            AggregateError::KindConflict { name, .. } | AggregateError::BoundsMismatch { name } => {
                ObserveError::Series(SeriesMismatch::BoundsMismatch(name.into_owned()))
            }
            AggregateError::TooManySeries => ObserveError::TooManySeries,
        })?;
        state.info.extend(tuples);
        Ok(())
    }

    /// Sets engine `engine`'s `vllm:cache_config_info` labels (value 1).
    ///
    /// # Errors
    /// [`ObserveError::UnknownEngine`].
    pub fn set_cache_config(
        &self,
        engine: usize,
        info: &CacheConfigInfo,
    ) -> Result<(), ObserveError> {
        let mut st = lock(&self.inner.state);
        let label = st
            .engines
            .get(engine)
            .map(|e| e.engine.clone())
            .ok_or(ObserveError::UnknownEngine(engine))?;
        let state = st
            .states
            .get_mut(engine)
            .ok_or(ObserveError::UnknownEngine(engine))?;
        state.cache_config = Some(info.label_values(&label));
        Ok(())
    }

    /// Engine `engine`'s totals so far: counters summed over every observed payload, gauges
    /// the latest, histograms merged (without info).
    #[must_use]
    pub fn totals(&self, engine: usize) -> Option<Payload> {
        let st = lock(&self.inner.state);
        st.states.get(engine).map(|s| s.totals.clone())
    }

    /// The metric families, as a scrape would gather them from this exporter alone.
    #[must_use]
    pub fn families(&self) -> Vec<MetricFamily> {
        collect(&self.inner)
    }
}

fn collect(inner: &Inner) -> Vec<MetricFamily> {
    // Copy the plain totals under the lock; build the families outside it.
    let (engines, states) = {
        let st = lock(&inner.state);
        (st.engines.clone(), st.states.clone())
    };
    families::build(
        &engines,
        &states,
        &inner.config_info_labels,
        inner.deprecated,
    )
}

impl Collector for ExporterCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.0.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        collect(&self.0)
    }
}

/// Gathers `registry` and encodes it in the text exposition format, as `prometheus_client`
/// writes it (see [`text`]).
///
/// # Errors
/// [`EncodeError`] when a family or label name of some collector in `registry` is not a valid
/// Prometheus name.
pub fn encode_text(registry: &Registry) -> Result<String, EncodeError> {
    encode_families(&registry.gather())
}

/// The text a scrape of a new exporter built from `config` shows once it has observed
/// `payload` as engine 0: what `kvtier replay --metrics` prints, and what `kvtier serve` serves
/// for the same totals.
///
/// # Errors
/// [`RenderError`] when `config` is rejected, `payload` does not fit the catalogue, or
/// `config` has no engine.
pub fn render(payload: &Payload, config: ExporterConfig) -> Result<String, RenderError> {
    let registry = Registry::new();
    let exporter = OffloadExporter::register(&registry, config).map_err(RenderError::Exporter)?;
    exporter.observe(payload, 0).map_err(RenderError::Observe)?;
    encode_text(&registry).map_err(RenderError::Encode)
}

/// Why [`render`] gave no text: the step that failed, with its error.
#[derive(Debug)]
#[non_exhaustive]
pub enum RenderError {
    /// The exporter could not be built from the config.
    Exporter(ExporterError),
    /// The payload does not fit the catalogue (or the config has no engine).
    Observe(ObserveError),
    /// The registry could not be written as text.
    Encode(EncodeError),
}

impl fmt::Display for RenderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RenderError::Exporter(e) => e.fmt(f),
            RenderError::Observe(e) => e.fmt(f),
            RenderError::Encode(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for RenderError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RenderError::Exporter(e) => Some(e),
            RenderError::Observe(e) => Some(e),
            RenderError::Encode(e) => Some(e),
        }
    }
}
