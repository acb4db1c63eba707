//! The built-in, deterministic generator of LLM-server-like kvtrace traffic.

use std::collections::VecDeque;

use super::cdf::{Cdf, probability_threshold};
use super::config::{GeneratorConfig, GeneratorError};
use super::rng::{SplitMix64, mix64};
use crate::trace::{Header, OwnedRecord, Record};

/// A request between its `L` and its `C`.
#[derive(Debug)]
struct Request {
    rid: u64,
    blocks: Vec<u64>,
}

/// Where the pipeline stands within a step (`L`, then maybe `S`, then maybe `C`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Next: the `L` of a new request (or the drain, when all have arrived).
    Arrive,
    /// Next: the `S` of the oldest loading request, if more than the loading depth are loading.
    Start,
    /// Next: the `C` of the oldest storing request, if more than the storing depth are storing.
    Complete,
    /// All requests arrived: start every loading request, oldest first.
    DrainStart,
    /// Then complete every storing request, oldest first.
    DrainComplete,
}

/// A deterministic stream of kvtrace records made from a [`GeneratorConfig`].
///
/// Each step brings one new request (`L`), then starts the oldest loading request (`S`) when
/// more than `inflight / 2` are loading, then completes the oldest storing request (`C`) when
/// more than `inflight - inflight / 2` are storing; at the end every loading request is
/// started, then every storing request completed. So between steps exactly `inflight` requests
/// are open once the pipeline is full (`inflight + 1` for a moment), request ids ascend from 0,
/// and the trace is always valid. This is the structure of the sample traces (`small-a`,
/// `small-b`: 32 in flight, 16 loading and 16 storing).
///
/// Shared prefix `p` (ranked by Zipf popularity) has hashes derived from the seed, `p` and the
/// block index by the SplitMix64 finaliser, so prefixes take no memory; every other block hash
/// is a fresh SplitMix64 draw. Memory is bounded by the parameters, not by `requests`: about
/// `(recent_convs + inflight + 2) · max_blocks` hashes (see [`Generator::held_hashes`]), one
/// threshold per prefix and one per count of each block range.
///
/// The Zipf and log-uniform thresholds are computed once with `f64::powf` and `f64::ln`;
/// every decision after that is an integer comparison. The stream depends only on the config (no clock, no global state, no dependency's
/// RNG), so `kvtier replay` with no trace replays the same workload on every run.
///
/// ```
/// use kvtier_cli::trace::Record;
/// use kvtier_cli::workload::{Generator, GeneratorConfig};
/// let mut g = Generator::new(GeneratorConfig::new(1, 3))?;
/// let mut letters = String::new();
/// while let Some(r) = g.next_record() {
///     letters.push(r.kind().letter());
/// }
/// assert_eq!(letters, "LLLSSSCCC"); // 3 requests fit in the 32 in-flight slots
/// # Ok::<(), kvtier_cli::workload::GeneratorError>(())
/// ```
#[derive(Debug)]
pub struct Generator {
    config: GeneratorConfig,
    header: Header,
    rng: SplitMix64,
    prefix_salt: u64,
    /// Prefix popularity.
    zipf: Cdf,
    prefix_blocks: Cdf,
    suffix_blocks: Cdf,
    turn_blocks: Cdf,
    followup_threshold: u64,
    next_rid: u64,
    loading: VecDeque<Request>,
    storing: VecDeque<Request>,
    load_depth: usize,
    store_depth: usize,
    /// The recent conversations' blocks, oldest first.
    convs: VecDeque<Vec<u64>>,
    /// Block buffers to reuse.
    spare: Vec<Vec<u64>>,
    phase: Phase,
}

impl Generator {
    /// Validates `config` and returns the generator at its first record.
    ///
    /// # Errors
    /// [`GeneratorError`] for a parameter out of range.
    pub fn new(config: GeneratorConfig) -> Result<Self, GeneratorError> {
        config.validate()?;
        let inflight =
            usize::try_from(config.inflight).map_err(|_| GeneratorError::InflightOutOfRange)?;
        let load_depth = inflight / 2;
        Ok(Generator {
            header: config.header(),
            rng: SplitMix64::new(config.seed),
            prefix_salt: mix64(config.seed ^ 0x7072_6566_6978_6573),
            zipf: Cdf::zipf(config.prefixes, config.zipf_s),
            prefix_blocks: Cdf::log_uniform(config.prefix_blocks),
            suffix_blocks: Cdf::log_uniform(config.suffix_blocks),
            turn_blocks: Cdf::log_uniform(config.turn_blocks),
            followup_threshold: probability_threshold(config.followup),
            next_rid: 0,
            loading: VecDeque::new(),
            storing: VecDeque::new(),
            load_depth,
            store_depth: inflight - load_depth,
            convs: VecDeque::new(),
            spare: Vec::new(),
            phase: Phase::Arrive,
            config,
        })
    }

    /// The header of the trace (the config's parameters).
    #[must_use]
    pub const fn header(&self) -> &Header {
        &self.header
    }

    /// The config.
    #[must_use]
    pub const fn config(&self) -> &GeneratorConfig {
        &self.config
    }

    /// The requests open now (loaded and not completed).
    #[must_use]
    pub fn open_requests(&self) -> usize {
        self.loading.len() + self.storing.len()
    }

    /// The block hashes the generator has room for in its buffers (in flight, recent
    /// conversations, spare): what its memory grows with. Bounded by about
    /// `2 · (recent_convs + inflight + 2) · max_blocks` (a `Vec` may double its capacity),
    /// whatever the number of requests.
    #[must_use]
    pub fn held_hashes(&self) -> usize {
        let in_flight = self
            .loading
            .iter()
            .chain(&self.storing)
            .map(|r| r.blocks.capacity());
        let kept = self.convs.iter().chain(&self.spare).map(Vec::capacity);
        in_flight.chain(kept).sum()
    }

    /// An iterator of owned records (allocates one `Vec` per `L`; [`Generator::next_record`]
    /// does not).
    #[must_use]
    pub fn into_owned_records(self) -> OwnedRecords {
        OwnedRecords(self)
    }

    /// The next record, lending an `L`'s hashes; `None` after the last `C`.
    pub fn next_record(&mut self) -> Option<Record<'_>> {
        loop {
            match self.phase {
                Phase::Arrive => {
                    if self.next_rid >= self.config.requests {
                        self.phase = Phase::DrainStart;
                        continue;
                    }
                    let rid = self.next_rid;
                    self.next_rid += 1;
                    let blocks = self.make_blocks();
                    self.loading.push_back(Request { rid, blocks });
                    self.phase = Phase::Start;
                    let request = self.loading.back()?;
                    return Some(Record::Load {
                        rid: request.rid,
                        hashes: &request.blocks,
                    });
                }
                Phase::Start => {
                    self.phase = Phase::Complete;
                    if self.loading.len() > self.load_depth {
                        return self.start_oldest();
                    }
                }
                Phase::Complete => {
                    self.phase = Phase::Arrive;
                    if self.storing.len() > self.store_depth {
                        return self.complete_oldest();
                    }
                }
                Phase::DrainStart => {
                    if self.loading.is_empty() {
                        self.phase = Phase::DrainComplete;
                        continue;
                    }
                    return self.start_oldest();
                }
                Phase::DrainComplete => return self.complete_oldest(),
            }
        }
    }

    fn start_oldest(&mut self) -> Option<Record<'static>> {
        let request = self.loading.pop_front()?;
        let rid = request.rid;
        self.storing.push_back(request);
        Some(Record::Start { rid })
    }

    fn complete_oldest(&mut self) -> Option<Record<'static>> {
        let request = self.storing.pop_front()?;
        let rid = request.rid;
        self.remember(request.blocks);
        Some(Record::Complete { rid })
    }

    /// Adds a completed request's blocks to the recent conversations.
    fn remember(&mut self, blocks: Vec<u64>) {
        if self.config.recent_convs == 0 {
            self.spare.push(blocks);
            return;
        }
        if self.convs.len() >= self.config.recent_convs as usize
            && let Some(old) = self.convs.pop_front()
        {
            self.spare.push(old);
        }
        self.convs.push_back(blocks);
    }

    /// The blocks of a new request.
    fn make_blocks(&mut self) -> Vec<u64> {
        let mut blocks = self.spare.pop().unwrap_or_default();
        blocks.clear();
        let max = self.config.max_blocks as usize;
        if !self.convs.is_empty() && self.rng.next_53() < self.followup_threshold {
            let index = self.rng.below(self.convs.len() as u64);
            let turn = to_usize(self.turn_blocks.sample(&mut self.rng));
            if let Some(conv) = usize::try_from(index).ok().and_then(|i| self.convs.get(i))
                && conv.len() + turn <= max
            {
                blocks.extend_from_slice(conv);
                for _ in 0..turn {
                    blocks.push(self.rng.next_u64());
                }
                return blocks;
            }
        }
        let prefix = self.zipf.sample(&mut self.rng);
        let prefix_len = self.prefix_len(prefix).min(max);
        for i in 0..prefix_len {
            blocks.push(self.prefix_hash(prefix, i as u64));
        }
        let suffix = to_usize(self.suffix_blocks.sample(&mut self.rng));
        let suffix = suffix.min(max - prefix_len);
        for _ in 0..suffix {
            blocks.push(self.rng.next_u64());
        }
        blocks
    }

    /// The length of prefix `p`: a log-uniform draw fixed by the seed and `p`.
    fn prefix_len(&self, prefix: u64) -> usize {
        let u = mix64(self.prefix_salt ^ mix64(prefix)) >> 11;
        to_usize(self.prefix_blocks.at(u))
    }

    /// Block `i` of prefix `p`.
    fn prefix_hash(&self, prefix: u64, i: u64) -> u64 {
        mix64(
            self.prefix_salt
                .wrapping_add(mix64(prefix.wrapping_mul(1 << 32) ^ i)),
        )
    }
}

/// A block count as `usize` (counts are at most 65,536).
fn to_usize(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// The generator's records as owned values: see [`Generator::into_owned_records`].
#[derive(Debug)]
pub struct OwnedRecords(Generator);

impl Iterator for OwnedRecords {
    type Item = OwnedRecord;

    fn next(&mut self) -> Option<OwnedRecord> {
        self.0.next_record().map(|r| r.to_owned_record())
    }
}
