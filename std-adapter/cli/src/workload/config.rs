//! The built-in workload's parameters ([`GeneratorConfig`]) and their validation.

use crate::trace::{Header, MAX_BLOCKS_PER_RECORD};

/// An inclusive range of block counts, written `min:max` (as in the sample trace headers).
///
/// ```
/// use kvtier_cli::workload::BlockRange;
/// let r: BlockRange = "4:64".parse()?;
/// assert_eq!(r, BlockRange::new(4, 64));
/// assert_eq!(r.to_string(), "4:64");
/// assert!("8:2".parse::<BlockRange>().is_ok()); // parsed; GeneratorConfig::validate rejects it
/// assert!("4-64".parse::<BlockRange>().is_err());
/// # Ok::<(), kvtier_cli::workload::BlockRangeParseError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlockRange {
    /// The smallest count.
    pub min: u32,
    /// The largest count (inclusive).
    pub max: u32,
}

impl BlockRange {
    /// The range `min..=max`.
    #[must_use]
    pub const fn new(min: u32, max: u32) -> Self {
        BlockRange { min, max }
    }
}

impl core::fmt::Display for BlockRange {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}:{}", self.min, self.max)
    }
}

/// A block range that is not `min:max` with two decimal u32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlockRangeParseError;

impl core::fmt::Display for BlockRangeParseError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("expected a block range `min:max` of two decimal integers")
    }
}

impl core::error::Error for BlockRangeParseError {}

impl core::str::FromStr for BlockRange {
    type Err = BlockRangeParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (min, max) = s.split_once(':').ok_or(BlockRangeParseError)?;
        let number = |t: &str| {
            if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
                return Err(BlockRangeParseError);
            }
            t.parse::<u32>().map_err(|_| BlockRangeParseError)
        };
        Ok(BlockRange::new(number(min)?, number(max)?))
    }
}

/// A range parameter of [`GeneratorConfig`], named in [`GeneratorError::BadRange`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RangeParam {
    /// [`GeneratorConfig::prefix_blocks`].
    PrefixBlocks,
    /// [`GeneratorConfig::suffix_blocks`].
    SuffixBlocks,
    /// [`GeneratorConfig::turn_blocks`].
    TurnBlocks,
}

impl core::fmt::Display for RangeParam {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            RangeParam::PrefixBlocks => "prefix_blocks",
            RangeParam::SuffixBlocks => "suffix_blocks",
            RangeParam::TurnBlocks => "turn_blocks",
        })
    }
}

/// The most shared prefixes (the Zipf table holds one `u64` per prefix).
pub const MAX_PREFIXES: u32 = 1 << 20;

/// The most recent conversations and the most requests in flight.
pub const MAX_RECENT_OR_INFLIGHT: u32 = 1 << 20;

/// The most block hashes the generator may hold at once (recent conversations plus requests in
/// flight, each up to `max_blocks`): 2^27 hashes, 1 GiB.
pub const MAX_HELD_HASHES: u64 = 1 << 27;

/// The largest `zipf_s`.
pub const MAX_ZIPF_S: f64 = 64.0;

/// A [`GeneratorConfig`] that cannot run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GeneratorError {
    /// `requests` is above `u64::MAX / 3` (the record count would overflow).
    TooManyRequests,
    /// `prefixes` is 0 or above [`MAX_PREFIXES`].
    PrefixesOutOfRange,
    /// `zipf_s` is not a number from 0 to [`MAX_ZIPF_S`].
    ZipfOutOfRange,
    /// `followup` is not a probability from 0 to 1.
    FollowupOutOfRange,
    /// A block range has `min > max`, `max` above [`MAX_BLOCKS_PER_RECORD`], or (for
    /// `prefix_blocks`) `min = 0`.
    BadRange {
        /// The range.
        param: RangeParam,
    },
    /// `max_blocks` is 0 or above [`MAX_BLOCKS_PER_RECORD`].
    MaxBlocksOutOfRange,
    /// `recent_convs` is above [`MAX_RECENT_OR_INFLIGHT`].
    RecentConvsOutOfRange,
    /// `inflight` is above [`MAX_RECENT_OR_INFLIGHT`].
    InflightOutOfRange,
    /// `block_tokens` is 0.
    ZeroBlockTokens,
    /// `(recent_convs + inflight + 1) · max_blocks` is above [`MAX_HELD_HASHES`].
    TooMuchMemory,
}

impl core::fmt::Display for GeneratorError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            GeneratorError::TooManyRequests => f.write_str("requests must be at most u64::MAX / 3"),
            GeneratorError::PrefixesOutOfRange => {
                write!(f, "prefixes must be from 1 to {MAX_PREFIXES}")
            }
            GeneratorError::ZipfOutOfRange => {
                write!(f, "zipf_s must be a number from 0 to {MAX_ZIPF_S}")
            }
            GeneratorError::FollowupOutOfRange => {
                f.write_str("followup must be a probability from 0 to 1")
            }
            GeneratorError::BadRange { param } => write!(
                f,
                "{param} must be `min:max` with min <= max <= {MAX_BLOCKS_PER_RECORD} \
                 (and min >= 1 for prefix_blocks)"
            ),
            GeneratorError::MaxBlocksOutOfRange => {
                write!(f, "max_blocks must be from 1 to {MAX_BLOCKS_PER_RECORD}")
            }
            GeneratorError::RecentConvsOutOfRange => {
                write!(f, "recent_convs must be at most {MAX_RECENT_OR_INFLIGHT}")
            }
            GeneratorError::InflightOutOfRange => {
                write!(f, "inflight must be at most {MAX_RECENT_OR_INFLIGHT}")
            }
            GeneratorError::ZeroBlockTokens => f.write_str("block_tokens must be at least 1"),
            GeneratorError::TooMuchMemory => write!(
                f,
                "(recent_convs + inflight + 1) * max_blocks must be at most {MAX_HELD_HASHES} hashes"
            ),
        }
    }
}

impl core::error::Error for GeneratorError {}

/// The parameters of the built-in workload: `new(seed, requests)` sets the rest to the values
/// of the sample trace `small-a.kvtrace`; change any public field, then
/// [`Generator::new`](super::Generator::new) validates them all.
///
/// The workload: each request either follows up a recent conversation (probability
/// `followup`: the conversation's blocks plus a new turn of `turn_blocks` blocks) or starts a
/// new one (a shared prefix of `prefix_blocks` blocks, chosen among `prefixes` with Zipf
/// popularity of exponent `zipf_s`, then a unique suffix of `suffix_blocks` blocks). Block
/// counts are drawn log-uniformly from their ranges (`P(k) ∝ ln((k + 1) / k)`: short more
/// often than long), as in the sample traces; each prefix's length is drawn once. A request
/// never exceeds `max_blocks` (a follow-up that would is replaced by a new conversation; a new
/// one is cut). A request joins the `recent_convs` most recent conversations when it completes.
/// Requests move through a pipeline of `inflight` slots: half loading (`L` seen, waiting for
/// `S`), half storing (`S` seen, waiting for `C`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GeneratorConfig {
    /// The seed: same seed and parameters, same trace.
    pub seed: u64,
    /// The number of requests (each gives three records).
    pub requests: u64,
    /// The number of shared prefixes (default 100).
    pub prefixes: u32,
    /// The Zipf exponent of prefix popularity (default 1.0; 0 is uniform).
    pub zipf_s: f64,
    /// The length of each shared prefix, in blocks (default 4:64).
    pub prefix_blocks: BlockRange,
    /// The unique suffix of a new conversation, in blocks (default 1:32).
    pub suffix_blocks: BlockRange,
    /// The probability that a request follows up a recent conversation (default 0.3).
    pub followup: f64,
    /// The new turn of a follow-up, in blocks (default 1:16).
    pub turn_blocks: BlockRange,
    /// How many recently completed conversations a follow-up chooses from (default 512).
    pub recent_convs: u32,
    /// The most blocks of one request (default 256).
    pub max_blocks: u32,
    /// The requests in flight between steps (default 32): `inflight / 2` loading, the rest
    /// storing; 0 gives `L S C` of one request at a time.
    pub inflight: u32,
    /// The suggested pool size written to the header's `capacity` (default 1024).
    pub capacity: u64,
    /// Tokens per block, written to the header (default 16).
    pub block_tokens: u32,
}

impl GeneratorConfig {
    /// `requests` requests from `seed`, every other parameter at its default.
    #[must_use]
    pub const fn new(seed: u64, requests: u64) -> Self {
        GeneratorConfig {
            seed,
            requests,
            prefixes: 100,
            zipf_s: 1.0,
            prefix_blocks: BlockRange::new(4, 64),
            suffix_blocks: BlockRange::new(1, 32),
            followup: 0.3,
            turn_blocks: BlockRange::new(1, 16),
            recent_convs: 512,
            max_blocks: 256,
            inflight: 32,
            capacity: 1024,
            block_tokens: 16,
        }
    }

    /// Checks every parameter.
    ///
    /// # Errors
    /// The first [`GeneratorError`] found.
    pub fn validate(&self) -> Result<(), GeneratorError> {
        let max_n = MAX_BLOCKS_PER_RECORD;
        if self.requests > u64::MAX / 3 {
            return Err(GeneratorError::TooManyRequests);
        }
        if self.prefixes == 0 || self.prefixes > MAX_PREFIXES {
            return Err(GeneratorError::PrefixesOutOfRange);
        }
        if !(0.0..=MAX_ZIPF_S).contains(&self.zipf_s) {
            return Err(GeneratorError::ZipfOutOfRange);
        }
        if !(0.0..=1.0).contains(&self.followup) {
            return Err(GeneratorError::FollowupOutOfRange);
        }
        for (param, range, min_floor) in [
            (RangeParam::PrefixBlocks, self.prefix_blocks, 1),
            (RangeParam::SuffixBlocks, self.suffix_blocks, 0),
            (RangeParam::TurnBlocks, self.turn_blocks, 0),
        ] {
            if range.min < min_floor || range.min > range.max || u64::from(range.max) > max_n {
                return Err(GeneratorError::BadRange { param });
            }
        }
        if self.max_blocks == 0 || u64::from(self.max_blocks) > max_n {
            return Err(GeneratorError::MaxBlocksOutOfRange);
        }
        if self.recent_convs > MAX_RECENT_OR_INFLIGHT {
            return Err(GeneratorError::RecentConvsOutOfRange);
        }
        if self.inflight > MAX_RECENT_OR_INFLIGHT {
            return Err(GeneratorError::InflightOutOfRange);
        }
        if self.block_tokens == 0 {
            return Err(GeneratorError::ZeroBlockTokens);
        }
        let held = (u64::from(self.recent_convs) + u64::from(self.inflight) + 1)
            * u64::from(self.max_blocks);
        if held > MAX_HELD_HASHES {
            return Err(GeneratorError::TooMuchMemory);
        }
        Ok(())
    }

    /// The header of the trace this config makes: `seed`, `requests`, `records`, `capacity`,
    /// `block_tokens`, and the other parameters (plus `generator=kvtier`) as extra keys.
    #[must_use]
    pub fn header(&self) -> Header {
        let extra = [
            ("generator", "kvtier".to_owned()),
            ("prefixes", self.prefixes.to_string()),
            ("zipf_s", self.zipf_s.to_string()),
            ("prefix_blocks", self.prefix_blocks.to_string()),
            ("suffix_blocks", self.suffix_blocks.to_string()),
            ("followup", self.followup.to_string()),
            ("turn_blocks", self.turn_blocks.to_string()),
            ("recent_convs", self.recent_convs.to_string()),
            ("max_blocks", self.max_blocks.to_string()),
            ("inflight", self.inflight.to_string()),
        ];
        Header {
            seed: Some(self.seed),
            requests: Some(self.requests),
            records: Some(self.requests.saturating_mul(3)),
            capacity: Some(self.capacity),
            block_tokens: self.block_tokens,
            extra: extra.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
        }
    }
}
