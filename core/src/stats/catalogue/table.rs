//! The family table ([`CATALOGUE`], sorted by name) and [`lookup`].

use super::MetricDef;
use super::MetricKind;
use super::Unit;
use super::index::StrIndex;
use super::names::*;

/// Whether a family is shown from the start ([`MetricDef::zero_at_start`]).
#[derive(Clone, Copy)]
enum Start {
    /// At zero from the start.
    Zero,
    /// Only once observed.
    Observed,
}

const fn def(
    name: &'static str,
    kind: MetricKind,
    unit: Unit,
    labels: &'static [&'static str],
    bounds: &'static [u64],
    start: Start,
    help: &'static str,
) -> MetricDef {
    MetricDef {
        name,
        kind,
        help,
        labels,
        bounds,
        unit,
        zero_at_start: matches!(start, Start::Zero),
    }
}

use MetricKind::{Counter, Gauge, Histogram};
use Start::{Observed, Zero};

const OUTCOME: &[&str] = &["outcome"];
const TRANSFER_TYPE: &[&str] = &["transfer_type"];
const SOURCE: &[&str] = &["source"];

/// Every family kvtier knows, sorted by name (byte order).
pub static CATALOGUE: [MetricDef; 31] = DEFS;

const fn names_of(defs: &[MetricDef; 31]) -> [&'static str; 31] {
    let mut out = [""; 31];
    let mut i = 0;
    while i < 31 {
        out[i] = defs[i].name;
        i += 1;
    }
    out
}

static NAMES: [&str; 31] = names_of(&DEFS);

/// The catalogue's names, hashed: a lookup costs one hash and one comparison.
static INDEX: StrIndex<128> = StrIndex::new(&NAMES);

#[rustfmt::skip]
const DEFS: [MetricDef; 31] = [
    def(CACHE_CONFIG_INFO, Gauge, Unit::Info, &CACHE_CONFIG_INFO_LABELS, &[], Observed,
        "Cache configuration of the engine as labels; the value is always 1."),
    def(EXTERNAL_PREFIX_CACHE_HITS, Counter, Unit::Tokens, &[], &[], Observed,
        "Tokens served from the KV connector's external prefix cache."),
    def(EXTERNAL_PREFIX_CACHE_QUERIES, Counter, Unit::Tokens, &[], &[], Observed,
        "Tokens looked up in the KV connector's external prefix cache."),
    def(KV_CACHE_USAGE_PERC, Gauge, Unit::Fraction, &[], &[], Observed,
        "Share of GPU KV blocks in use, the null block excluded (1 means full)."),
    def(ALLOCATION_FAILURE, Counter, Unit::Count, &[], &[], Zero,
        "Store preparations that could not find room in the offload tier."),
    def(CONFIG_INFO, Gauge, Unit::Info, &CPU_CONFIG_INFO_LABELS, &[], Observed,
        "Static facts of each offload tier of this engine as labels; the value is always 1."),
    def(CPU_ALLOCATION_SIZE, Histogram, Unit::Chunks, &[], &ALLOCATION_SIZE_BOUNDS, Zero,
        "CPU chunks requested by each store preparation that had candidates."),
    def(CPU_CACHE_READ_USAGE_PERC, Gauge, Unit::Fraction, &[], &[], Zero,
        "Share of CPU chunks held by loads still in flight."),
    def(CPU_CACHE_USAGE_PERC, Gauge, Unit::Fraction, &[], &[], Zero,
        "Share of CPU chunks held by transfers in flight (0 idle, 1 saturated); not the fill level."),
    def(CPU_CACHE_WRITE_USAGE_PERC, Gauge, Unit::Fraction, &[], &[], Zero,
        "Share of CPU chunks held by stores not yet completed."),
    def(LOAD_BYTES, Counter, Unit::Bytes, &[], &[], Zero,
        "Bytes copied from the offload tier into GPU memory, summed over ranks."),
    def(LOAD_SIZE, Histogram, Unit::Bytes, &[], &TRANSFER_SIZE_BOUNDS, Zero,
        "Size of each load transfer in bytes."),
    def(LOAD_TIME, Counter, Unit::Nanoseconds, &[], &[], Zero,
        "Seconds spent copying from the offload tier into GPU memory, summed over ranks."),
    def(LOOKUP_ASYNC_DELAY_SECONDS, Histogram, Unit::Nanoseconds, &[], &LOOKUP_ASYNC_DELAY_BOUNDS, Zero,
        "Seconds from a request's first deferred lookup to the lookup that resolves it, or to its finish."),
    def(LOOKUP_SYNC_DELAY_SECONDS, Histogram, Unit::Nanoseconds, &[], &LOOKUP_SYNC_DELAY_BOUNDS, Zero,
        "Seconds spent in one lookup call."),
    def(DEPRECATED_SIZE, Histogram, Unit::Bytes, TRANSFER_TYPE, &TRANSFER_SIZE_BOUNDS, Zero,
        "Deprecated: size of each transfer in bytes, by direction."),
    def(STORE_BYTES, Counter, Unit::Bytes, &[], &[], Zero,
        "Bytes copied from GPU memory into the offload tier, summed over ranks."),
    def(STORE_SIZE, Histogram, Unit::Bytes, &[], &TRANSFER_SIZE_BOUNDS, Zero,
        "Size of each store transfer in bytes."),
    def(STORE_TIME, Counter, Unit::Nanoseconds, &[], &[], Zero,
        "Seconds spent copying from GPU memory into the offload tier, summed over ranks."),
    def(STORES_SKIPPED, Counter, Unit::Count, &[], &[], Zero,
        "Store candidates turned away because they had not been offered often enough yet."),
    def(DEPRECATED_TOTAL_BYTES, Counter, Unit::Bytes, TRANSFER_TYPE, &[], Zero,
        "Deprecated: bytes moved by the offload connector, by direction."),
    def(DEPRECATED_TOTAL_TIME, Counter, Unit::Nanoseconds, TRANSFER_TYPE, &[], Zero,
        "Deprecated: seconds spent in offload transfers, by direction."),
    def(NUM_REQUESTS_RUNNING, Gauge, Unit::Count, &[], &[], Zero,
        "Requests the engine is running."),
    def(PREFIX_CACHE_HITS, Counter, Unit::Tokens, &[], &[], Observed,
        "Tokens found in the local prefix cache."),
    def(PREFIX_CACHE_QUERIES, Counter, Unit::Tokens, &[], &[], Observed,
        "Tokens looked up in the local prefix cache."),
    def(PROMPT_TOKENS_CACHED_BY_SOURCE, Counter, Unit::Tokens, SOURCE, &[], Observed,
        "Prompt tokens served from a cache, by the tier that held them."),
    def(SIMPLE_INFO, Gauge, Unit::Info, &SIMPLE_INFO_LABELS, &[], Observed,
        "Deployment facts of the simple CPU offloader as labels; the value is always 1."),
    def(SIMPLE_LOAD_BLOCKS, Counter, Unit::Blocks, &[], &[], Observed,
        "KV blocks copied back into GPU memory, counted when each load finishes."),
    def(SIMPLE_PENDING_STORE_BLOCKS, Gauge, Unit::Blocks, &[], &[], Observed,
        "Blocks in stores that are queued, issued or left over from a reset; steady growth means a stuck transfer."),
    def(SIMPLE_SAVE_OUTCOMES, Counter, Unit::Count, OUTCOME, &[], Observed,
        "What became of each block handed over for an eager store, by outcome."),
    def(SIMPLE_USED_BLOCKS, Gauge, Unit::Blocks, &[], &[], Observed,
        "Offload pool blocks not free: pinned by transfers or pending hits, plus the null block."),
];

/// Finds a family by its exact name.
#[must_use]
pub fn lookup(name: &str) -> Option<&'static MetricDef> {
    position_bytes(name.as_bytes()).and_then(|i| CATALOGUE.get(i))
}

/// The position in [`CATALOGUE`] of the family named `name`, from raw bytes (the wire decoder
/// finds names before validating UTF-8). Positions follow the byte order of the names, so
/// comparing two positions compares the names.
#[inline]
pub(crate) fn position_bytes(name: &[u8]) -> Option<usize> {
    INDEX.find(name)
}

/// Every family, in name order.
pub fn all() -> impl Iterator<Item = &'static MetricDef> {
    CATALOGUE.iter()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalogue_is_sorted_and_complete() {
        let names: alloc::vec::Vec<&str> = all().map(|d| d.name).collect();
        assert!(names.windows(2).all(|w| w[0] < w[1]), "{names:?}");
        assert_eq!(names.len(), 31);
        for (i, d) in all().enumerate() {
            assert_eq!(lookup(d.name), Some(d));
            assert_eq!(position_bytes(d.name.as_bytes()), Some(i));
            assert_eq!(lookup(&d.name[..d.name.len() - 1]), None);
            assert_eq!(
                d.kind == MetricKind::Histogram,
                !d.bounds.is_empty(),
                "{}",
                d.name
            );
            assert!(d.bounds.windows(2).all(|w| w[0] < w[1]));
        }
    }

    #[test]
    fn offloading_families_and_running_requests_are_shown_from_the_start() {
        let zero: alloc::vec::Vec<&str> =
            all().filter(|d| d.zero_at_start).map(|d| d.name).collect();
        assert_eq!(zero.len(), 18, "{zero:?}");
        assert!(
            zero.iter()
                .all(|n| n.starts_with("vllm:kv_offload_") || *n == NUM_REQUESTS_RUNNING),
            "{zero:?}"
        );
        assert!(!zero.contains(&CONFIG_INFO));
        assert!(zero.contains(&NUM_REQUESTS_RUNNING));
    }

    #[test]
    fn seconds_families_are_nanoseconds() {
        for d in all() {
            let seconds = d.name.ends_with("_seconds") || d.name.ends_with("_time");
            assert_eq!(seconds, d.unit == Unit::Nanoseconds, "{}", d.name);
        }
        assert_eq!(lookup(LOAD_TIME).unwrap().export_divisor(), 1_000_000_000);
    }
}
