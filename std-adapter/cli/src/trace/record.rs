//! The three kvtrace records, borrowed ([`Record`]) and owned ([`OwnedRecord`]).

/// Which of the three records a line holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RecordKind {
    /// `L`: a request arrives with its block hashes.
    Load,
    /// `S`: a request's loads finished; its store phase begins.
    Start,
    /// `C`: a request's store transfers completed.
    Complete,
}

impl RecordKind {
    /// The record's letter in a kvtrace file: `L`, `S` or `C`.
    #[must_use]
    pub const fn letter(self) -> char {
        match self {
            RecordKind::Load => 'L',
            RecordKind::Start => 'S',
            RecordKind::Complete => 'C',
        }
    }
}

/// One record, lending its block hashes from the reader's (or generator's) reused buffer.
///
/// ```
/// use kvtier_cli::trace::{Record, RecordKind};
/// let r = Record::Load { rid: 3, hashes: &[0xab, 0xcd] };
/// assert_eq!(r.rid(), 3);
/// assert_eq!(r.kind(), RecordKind::Load);
/// assert_eq!(r.to_string(), "L 3 2 00000000000000ab 00000000000000cd");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Record<'a> {
    /// `L rid n h1 … hn`: request `rid` arrives with its `n ≥ 1` block hashes, first to last.
    Load {
        /// The request id.
        rid: u64,
        /// The request's block hashes, from the first block to the last.
        hashes: &'a [u64],
    },
    /// `S rid`: request `rid`'s loads finished and its prefill ran; its store phase begins.
    Start {
        /// The request id.
        rid: u64,
    },
    /// `C rid`: request `rid`'s store transfers completed.
    Complete {
        /// The request id.
        rid: u64,
    },
}

impl Record<'_> {
    /// The request the record is about.
    #[must_use]
    pub const fn rid(&self) -> u64 {
        match *self {
            Record::Load { rid, .. } | Record::Start { rid } | Record::Complete { rid } => rid,
        }
    }

    /// Which record this is.
    #[must_use]
    pub const fn kind(&self) -> RecordKind {
        match self {
            Record::Load { .. } => RecordKind::Load,
            Record::Start { .. } => RecordKind::Start,
            Record::Complete { .. } => RecordKind::Complete,
        }
    }

    /// A copy that owns its hashes (allocates for `L`).
    #[must_use]
    pub fn to_owned_record(&self) -> OwnedRecord {
        match *self {
            Record::Load { rid, hashes } => OwnedRecord::Load {
                rid,
                hashes: hashes.to_vec(),
            },
            Record::Start { rid } => OwnedRecord::Start { rid },
            Record::Complete { rid } => OwnedRecord::Complete { rid },
        }
    }
}

/// Formats the record as its kvtrace line, without the line end.
impl core::fmt::Display for Record<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            Record::Load { rid, hashes } => {
                write!(f, "L {rid} {}", hashes.len())?;
                for &h in hashes {
                    write!(f, " {h:016x}")?;
                }
                Ok(())
            }
            Record::Start { rid } => write!(f, "S {rid}"),
            Record::Complete { rid } => write!(f, "C {rid}"),
        }
    }
}

/// One record that owns its hashes: what [`Record::to_owned_record`] returns and what the
/// generator's owning iterator yields.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum OwnedRecord {
    /// `L rid n h1 … hn`.
    Load {
        /// The request id.
        rid: u64,
        /// The request's block hashes, from the first block to the last.
        hashes: Vec<u64>,
    },
    /// `S rid`.
    Start {
        /// The request id.
        rid: u64,
    },
    /// `C rid`.
    Complete {
        /// The request id.
        rid: u64,
    },
}

impl OwnedRecord {
    /// The borrowed form.
    #[must_use]
    pub fn as_record(&self) -> Record<'_> {
        match self {
            OwnedRecord::Load { rid, hashes } => Record::Load { rid: *rid, hashes },
            OwnedRecord::Start { rid } => Record::Start { rid: *rid },
            OwnedRecord::Complete { rid } => Record::Complete { rid: *rid },
        }
    }
}
