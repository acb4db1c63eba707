//! The `# key=value` header of a kvtrace.

/// The header keys kvtier reads; every other key is kept in [`Header::extra`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HeaderKey {
    /// `format`: must be `kvtrace v1`, on the first line.
    Format,
    /// `seed`: the generator's seed.
    Seed,
    /// `requests`: the number of requests (`L` records).
    Requests,
    /// `records`: the number of records.
    Records,
    /// `capacity`: the suggested pool size in blocks.
    Capacity,
    /// `block_tokens`: tokens per block (default 16).
    BlockTokens,
}

impl HeaderKey {
    /// Every known key, in the order a [`Header`] is written.
    pub const ALL: [HeaderKey; 6] = [
        HeaderKey::Format,
        HeaderKey::Seed,
        HeaderKey::Requests,
        HeaderKey::Records,
        HeaderKey::Capacity,
        HeaderKey::BlockTokens,
    ];

    /// The key as written in a trace.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            HeaderKey::Format => "format",
            HeaderKey::Seed => "seed",
            HeaderKey::Requests => "requests",
            HeaderKey::Records => "records",
            HeaderKey::Capacity => "capacity",
            HeaderKey::BlockTokens => "block_tokens",
        }
    }

    /// The known key of that name, if any.
    #[must_use]
    pub fn from_name(name: &str) -> Option<Self> {
        HeaderKey::ALL.into_iter().find(|k| k.name() == name)
    }

    /// What the key's value must be, for error messages.
    #[must_use]
    pub const fn expects(self) -> &'static str {
        match self {
            HeaderKey::Format => "`kvtrace v1`",
            HeaderKey::BlockTokens => "a decimal integer from 1 to 4294967295",
            HeaderKey::Seed | HeaderKey::Requests | HeaderKey::Records | HeaderKey::Capacity => {
                "a decimal u64"
            }
        }
    }
}

impl core::fmt::Display for HeaderKey {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

/// The value of the `format` header kvtier reads and writes.
pub const FORMAT_V1: &str = "kvtrace v1";

/// The default of `block_tokens` when the header does not give it.
pub const DEFAULT_BLOCK_TOKENS: u32 = 16;

/// A kvtrace header: the known keys parsed, the others kept in order.
///
/// ```
/// use kvtier_cli::trace::Header;
/// let h = Header::default();
/// assert_eq!(h.block_tokens, 16);
/// assert_eq!(h.capacity, None);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// `seed`.
    pub seed: Option<u64>,
    /// `requests`: when given, the reader checks it against the `L` records at the end.
    pub requests: Option<u64>,
    /// `records`: when given, the reader checks it against the records at the end.
    pub records: Option<u64>,
    /// `capacity`: the suggested pool size in blocks.
    pub capacity: Option<u64>,
    /// `block_tokens`: tokens per block, [`DEFAULT_BLOCK_TOKENS`] when absent.
    pub block_tokens: u32,
    /// Every other `key=value`, in file order (the generator's parameters, for example).
    pub extra: Vec<(String, String)>,
}

impl Default for Header {
    fn default() -> Self {
        Header {
            seed: None,
            requests: None,
            records: None,
            capacity: None,
            block_tokens: DEFAULT_BLOCK_TOKENS,
            extra: Vec::new(),
        }
    }
}

impl Header {
    /// The value of an unknown key, if present.
    #[must_use]
    pub fn get_extra(&self, key: &str) -> Option<&str> {
        self.extra
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// What a header line failed on; the reader turns it into a [`super::TraceErrorKind`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HeaderLineError {
    Malformed,
    Duplicate,
    BadValue(HeaderKey),
    UnsupportedFormat,
    ValueTooLong,
}

/// Splits `# key=value` into its key and value.
pub(crate) fn split_header_line(line: &str) -> Result<(&str, &str), HeaderLineError> {
    let body = line.strip_prefix("# ").ok_or(HeaderLineError::Malformed)?;
    // A carriage return could not be written back by `TraceWriter` (and a trailing one would
    // not survive a round trip): kvtrace lines end in `\n` alone.
    if body.contains('\r') {
        return Err(HeaderLineError::Malformed);
    }
    let (key, value) = body.split_once('=').ok_or(HeaderLineError::Malformed)?;
    if key.is_empty() || key.bytes().any(|b| b.is_ascii_whitespace()) {
        return Err(HeaderLineError::Malformed);
    }
    Ok((key, value))
}

/// Parses a decimal u64 strictly: ASCII digits only, at least one, no sign, no overflow.
pub(crate) fn parse_decimal(bytes: &[u8]) -> Option<u64> {
    if bytes.is_empty() || bytes.len() > 20 {
        return None;
    }
    let mut value = 0u64;
    for &b in bytes {
        let digit = b.wrapping_sub(b'0');
        if digit > 9 {
            return None;
        }
        value = value.checked_mul(10)?.checked_add(u64::from(digit))?;
    }
    Some(value)
}

/// Which known keys have been seen, to reject duplicates.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SeenKeys(u8);

impl SeenKeys {
    fn bit(key: HeaderKey) -> u8 {
        match key {
            HeaderKey::Format => 1,
            HeaderKey::Seed => 2,
            HeaderKey::Requests => 4,
            HeaderKey::Records => 8,
            HeaderKey::Capacity => 16,
            HeaderKey::BlockTokens => 32,
        }
    }

    /// Whether `key` was seen.
    pub(crate) fn contains(self, key: HeaderKey) -> bool {
        self.0 & Self::bit(key) != 0
    }

    /// Marks `key` seen.
    pub(crate) fn insert(&mut self, key: HeaderKey) {
        self.0 |= Self::bit(key);
    }
}

/// Applies one `key=value` (not the first line's `format`) to `header`; changes nothing on error.
pub(crate) fn apply_header_pair(
    header: &mut Header,
    seen: &mut SeenKeys,
    key: &str,
    value: &str,
) -> Result<(), HeaderLineError> {
    let Some(known) = HeaderKey::from_name(key) else {
        if header.extra.iter().any(|(k, _)| k == key) {
            return Err(HeaderLineError::Duplicate);
        }
        header.extra.push((key.to_owned(), value.to_owned()));
        return Ok(());
    };
    if seen.contains(known) {
        return Err(HeaderLineError::Duplicate);
    }
    let number = parse_decimal(value.as_bytes());
    match known {
        HeaderKey::Format => {
            // Only valid on the first line, which the reader handles; here it is a duplicate
            // or misplaced.
            return Err(if value == FORMAT_V1 {
                HeaderLineError::Duplicate
            } else {
                HeaderLineError::UnsupportedFormat
            });
        }
        HeaderKey::Seed => header.seed = Some(number.ok_or(HeaderLineError::BadValue(known))?),
        HeaderKey::Requests => {
            header.requests = Some(number.ok_or(HeaderLineError::BadValue(known))?);
        }
        HeaderKey::Records => {
            header.records = Some(number.ok_or(HeaderLineError::BadValue(known))?);
        }
        HeaderKey::Capacity => {
            header.capacity = Some(number.ok_or(HeaderLineError::BadValue(known))?);
        }
        HeaderKey::BlockTokens => {
            header.block_tokens = number
                .and_then(|n| u32::try_from(n).ok())
                .filter(|&n| n >= 1)
                .ok_or(HeaderLineError::BadValue(known))?;
        }
    }
    seen.insert(known);
    Ok(())
}
