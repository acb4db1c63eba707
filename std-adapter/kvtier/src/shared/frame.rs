//! Stats frames: a payload's [`wire`] bytes behind a `u32` little-endian length, as other
//! processes write them to a pipe or socket for the [`StatsCollector`](super::StatsCollector).

use std::fmt;
use std::io::{self, Read, Write};

use kvtier_core::stats::{Payload, wire};

/// Why a frame could not be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// The stream failed.
    Io(io::ErrorKind),
    /// The length prefix is larger than any payload encoding ([`wire::MAX_ENCODED_LEN`]).
    TooLong(u32),
    /// The stream ended inside a frame.
    Truncated,
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::Io(k) => write!(f, "reading a stats frame failed: {k}"),
            FrameError::TooLong(n) => write!(
                f,
                "a stats frame of {n} bytes is longer than any payload ({} bytes)",
                wire::MAX_ENCODED_LEN
            ),
            FrameError::Truncated => f.write_str("the stream ended inside a stats frame"),
        }
    }
}

impl std::error::Error for FrameError {}

/// Writes `payload` as one frame: its encoded length (`u32`, little-endian), then its
/// [`wire`] encoding.
///
/// # Errors
/// The writer's error.
pub fn write_frame(w: &mut impl Write, payload: &Payload) -> io::Result<()> {
    let bytes = wire::encode_to_vec(payload);
    let len = u32::try_from(bytes.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "payload too large"))?;
    w.write_all(&len.to_le_bytes())?;
    w.write_all(&bytes)
}

/// Reads one frame's bytes into `buf`; `Ok(false)` at a clean end of stream.
///
/// # Errors
/// [`FrameError`] on a failing stream, an oversized length or a frame cut short.
pub fn read_frame(r: &mut impl Read, buf: &mut Vec<u8>) -> Result<bool, FrameError> {
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < len.len() {
        match r.read(len.get_mut(got..).unwrap_or(&mut [])) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => return Err(FrameError::Truncated),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(FrameError::Io(e.kind())),
        }
    }
    let n = u32::from_le_bytes(len);
    let size = usize::try_from(n).map_err(|_| FrameError::TooLong(n))?;
    if size > wire::MAX_ENCODED_LEN {
        return Err(FrameError::TooLong(n));
    }
    buf.clear();
    buf.resize(size, 0);
    r.read_exact(buf).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => FrameError::Truncated,
        k => FrameError::Io(k),
    })?;
    Ok(true)
}
