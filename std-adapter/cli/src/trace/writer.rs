//! Writing a kvtrace: a [`Header`] and records.

use std::io::Write;

use super::MAX_BLOCKS_PER_RECORD;
use super::header::{FORMAT_V1, Header, HeaderKey};
use super::hex::format_hash;
use super::record::Record;

/// An error of [`TraceWriter`].
#[derive(Debug)]
pub enum WriteError {
    /// The underlying writer failed.
    Io(std::io::Error),
    /// A header entry of [`Header::extra`] (its index given) cannot be written as
    /// `# key=value`: its key is empty, a known key, or holds `=` or whitespace, or its value
    /// holds a line end.
    BadHeaderEntry {
        /// The index in [`Header::extra`].
        index: usize,
    },
    /// Two entries of [`Header::extra`] have the same key (the later one's index given).
    DuplicateHeaderEntry {
        /// The index in [`Header::extra`].
        index: usize,
    },
    /// An `L` record with no hashes or more than [`MAX_BLOCKS_PER_RECORD`]: the reader would
    /// reject it.
    BadBlockCount {
        /// The request id.
        rid: u64,
        /// The number of hashes.
        n: usize,
    },
}

impl core::fmt::Display for WriteError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            WriteError::Io(e) => write!(f, "write error: {e}"),
            WriteError::BadHeaderEntry { index } => write!(
                f,
                "header entry {index} cannot be written as `# key=value` (empty or known key, \
                 `=` or whitespace in the key, or a line end in the value)"
            ),
            WriteError::DuplicateHeaderEntry { index } => {
                write!(f, "header entry {index} repeats an earlier key")
            }
            WriteError::BadBlockCount { rid, n } => write!(
                f,
                "request {rid} has {n} blocks; a record needs 1 to {MAX_BLOCKS_PER_RECORD}"
            ),
        }
    }
}

impl core::error::Error for WriteError {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            WriteError::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<std::io::Error> for WriteError {
    fn from(e: std::io::Error) -> Self {
        WriteError::Io(e)
    }
}

/// Writes a kvtrace v1: the header on construction, then one line per record.
///
/// The header is written as `# format=kvtrace v1`, then the known keys that are set (`seed`,
/// `requests`, `records`, `capacity`, and always `block_tokens`), then [`Header::extra`] in
/// order, so [`super::TraceReader`] reads back an equal [`Header`]. Records are written as given;
/// their order is not checked (a trace made by [`Generator`](crate::workload::Generator) is
/// always valid). Each line is one `write_all`: wrap a file in a [`std::io::BufWriter`].
///
/// ```
/// use kvtier_cli::trace::{Header, Record, TraceWriter};
/// let mut out = Vec::new();
/// let mut w = TraceWriter::new(&mut out, &Header::default())?;
/// w.write_record(&Record::Load { rid: 1, hashes: &[0xabc] })?;
/// w.write_record(&Record::Start { rid: 1 })?;
/// w.finish()?;
/// assert_eq!(
///     String::from_utf8(out).unwrap(),
///     "# format=kvtrace v1\n# block_tokens=16\nL 1 1 0000000000000abc\nS 1\n"
/// );
/// # Ok::<(), kvtier_cli::trace::WriteError>(())
/// ```
#[derive(Debug)]
pub struct TraceWriter<W: Write> {
    out: W,
    line: Vec<u8>,
}

impl<W: Write> TraceWriter<W> {
    /// Checks `header`, writes it and returns the writer.
    ///
    /// # Errors
    /// [`WriteError::BadHeaderEntry`] or [`WriteError::DuplicateHeaderEntry`] (nothing written)
    /// for an extra entry that would not read back; [`WriteError::Io`] when writing fails.
    pub fn new(mut out: W, header: &Header) -> Result<Self, WriteError> {
        for (index, (key, value)) in header.extra.iter().enumerate() {
            let bad_key = key.is_empty()
                || HeaderKey::from_name(key).is_some()
                || key.bytes().any(|b| b == b'=' || b.is_ascii_whitespace());
            if bad_key || value.bytes().any(|b| b == b'\n' || b == b'\r') {
                return Err(WriteError::BadHeaderEntry { index });
            }
            if header.extra[..index].iter().any(|(k, _)| k == key) {
                return Err(WriteError::DuplicateHeaderEntry { index });
            }
        }
        let mut text = format!("# format={FORMAT_V1}\n");
        let known = [
            (HeaderKey::Seed, header.seed),
            (HeaderKey::Requests, header.requests),
            (HeaderKey::Records, header.records),
            (HeaderKey::Capacity, header.capacity),
            (HeaderKey::BlockTokens, Some(u64::from(header.block_tokens))),
        ];
        for (key, value) in known {
            if let Some(value) = value {
                text.push_str(&format!("# {key}={value}\n"));
            }
        }
        for (key, value) in &header.extra {
            text.push_str(&format!("# {key}={value}\n"));
        }
        out.write_all(text.as_bytes())?;
        Ok(TraceWriter {
            out,
            line: Vec::new(),
        })
    }

    /// Writes one record line.
    ///
    /// # Errors
    /// [`WriteError::BadBlockCount`] (nothing written) for an `L` with no hashes or too many;
    /// [`WriteError::Io`] when writing fails.
    pub fn write_record(&mut self, record: &Record<'_>) -> Result<(), WriteError> {
        self.line.clear();
        match *record {
            Record::Load { rid, hashes } => {
                let n = hashes.len();
                if n == 0 || n as u64 > MAX_BLOCKS_PER_RECORD {
                    return Err(WriteError::BadBlockCount { rid, n });
                }
                self.line.extend_from_slice(b"L ");
                push_decimal(&mut self.line, rid);
                self.line.push(b' ');
                push_decimal(&mut self.line, n as u64);
                for &h in hashes {
                    self.line.push(b' ');
                    self.line.extend_from_slice(&format_hash(h));
                }
            }
            Record::Start { rid } => {
                self.line.extend_from_slice(b"S ");
                push_decimal(&mut self.line, rid);
            }
            Record::Complete { rid } => {
                self.line.extend_from_slice(b"C ");
                push_decimal(&mut self.line, rid);
            }
        }
        self.line.push(b'\n');
        self.out.write_all(&self.line)?;
        Ok(())
    }

    /// Flushes and returns the underlying writer.
    ///
    /// # Errors
    /// [`WriteError::Io`] when flushing fails.
    pub fn finish(mut self) -> Result<W, WriteError> {
        self.out.flush()?;
        Ok(self.out)
    }
}

/// Appends `value` in decimal.
fn push_decimal(out: &mut Vec<u8>, value: u64) {
    let mut digits = [0u8; 20];
    let mut rest = value;
    let mut start = digits.len();
    for slot in digits.iter_mut().rev() {
        *slot = b'0' + u8::try_from(rest % 10).unwrap_or_default();
        rest /= 10;
        start -= 1;
        if rest == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[start..]);
}
