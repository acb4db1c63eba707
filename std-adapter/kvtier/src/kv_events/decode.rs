//! [`decode()`]: the msgpack bytes of a vLLM `KVEventBatch` back into an [`EventBatch`],
//! accepting and rejecting what vLLM 0.33.0's subscriber (msgspec's typed decoder) does:
//!
//! - the batch is an array of at least 2 items `[ts, events, data_parallel_rank, …]`: a
//!   missing rank is `None`, items past the third are read and ignored;
//! - `ts` is a float or an integer; every integer field takes any msgpack integer (negative
//!   ones and up to 2^64−1 included, see [`Int`]), never a float, a bool or nil;
//! - an event is a map with string keys in any order: its first `type` key names the kind,
//!   any later `type` must repeat it; a field given twice keeps its last value (each one
//!   type-checked); unknown keys are skipped unread (their values need only be msgpack);
//!   a required field (`nil` allowed where vLLM types it optional) must be present;
//! - `extra_keys` is an array of arrays (or nils) of any values: strings must be UTF-8,
//!   float32s read as float64s, map keys must be hashable and repeated ones collapse as a
//!   Python dict does, and a timestamp extension is read as Python's `datetime`: in years
//!   1–9999, rounded to microseconds;
//! - nothing follows the batch, and nothing nests deeper than [`MAX_DEPTH`].
//!
//! Nothing is allocated on a length's word alone: a list reserves at most one item per byte
//! left (and at most `PREALLOC_MAX`), then grows with the items read, so a hostile payload
//! costs memory proportional to its own length (the decoded batch is at most a few tens of
//! times larger: an integer of one byte is a 16-byte [`Int`]).

use std::fmt;

use super::event::{BlockHash, BlockRemoved, BlockStored, EventBatch, Int, KvEvent};
use fields::{EventFields, FIELDS, Tag};

/// The deepest nesting of arrays and maps read, the batch's own array included. msgspec's
/// bound is the Python interpreter's recursion limit (1000 by default) less the caller's own
/// stack, so it depends on who decodes; this is close to it and never smaller in practice.
pub const MAX_DEPTH: usize = 1000;

/// The most items reserved for a list before they are read: an item of the decoded batch
/// can be larger than the byte or few that encode it.
const PREALLOC_MAX: usize = 1024;

/// Why a payload is not a `KVEventBatch`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecodeError {
    /// The bytes are not msgpack (what, at which byte offset).
    Malformed {
        /// The byte offset of the problem.
        offset: usize,
        /// What is wrong: cut short, a reserved byte, text not UTF-8, nested too deep.
        problem: &'static str,
    },
    /// Bytes follow the batch (how many).
    Trailing(usize),
    /// The batch is not an array of at least 2 items.
    Batch,
    /// An event (its index) is not a map.
    Event(usize),
    /// A required field of event `event` is missing.
    Missing {
        /// The event's index in the batch.
        event: usize,
        /// The field.
        field: &'static str,
    },
    /// A field of event `event` (`None`: of the batch) is not of its type.
    Field {
        /// The event's index in the batch.
        event: Option<usize>,
        /// The field (`key` for a map key of the event).
        field: &'static str,
        /// What vLLM's type takes.
        expected: &'static str,
        /// What the payload holds.
        found: &'static str,
    },
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Malformed { offset, problem } => {
                write!(f, "not a msgpack value: {problem} at byte {offset}")
            }
            DecodeError::Trailing(n) => write!(f, "{n} bytes after the batch"),
            DecodeError::Batch => {
                f.write_str("a KVEventBatch is an array [ts, events, data_parallel_rank]")
            }
            DecodeError::Event(i) => write!(f, "event {i} is not a map"),
            DecodeError::Missing { event, field } => {
                write!(f, "event {event}: the required `{field}` is missing")
            }
            DecodeError::Field {
                event,
                field,
                expected,
                found,
            } => {
                match event {
                    Some(i) => write!(f, "event {i}: ")?,
                    None => f.write_str("the batch: ")?,
                }
                write!(f, "`{field}` takes {expected}, not {found}")
            }
        }
    }
}

impl std::error::Error for DecodeError {}

/// Decodes one payload (the third frame of a KV-events message).
///
/// # Errors
/// [`DecodeError`] when `bytes` is not exactly one `KVEventBatch`.
pub fn decode(bytes: &[u8]) -> Result<EventBatch, DecodeError> {
    let mut r = Reader {
        buf: bytes,
        pos: 0,
        depth: 0,
    };
    let batch = r.batch()?;
    if r.pos < bytes.len() {
        return Err(DecodeError::Trailing(bytes.len() - r.pos));
    }
    Ok(batch)
}

/// One msgpack item's head: scalars whole, containers by their length.
#[derive(Clone, Copy, Debug)]
enum Head<'a> {
    Nil,
    Bool(bool),
    Int(Int),
    F32(f32),
    F64(f64),
    Str(&'a [u8]),
    Bin(&'a [u8]),
    Array(usize),
    Map(usize),
    Ext(i8, &'a [u8]),
}

impl Head<'_> {
    /// The kind's name, msgspec's words.
    fn name(self) -> &'static str {
        match self {
            Head::Nil => "null",
            Head::Bool(_) => "bool",
            Head::Int(_) => "int",
            Head::F32(_) | Head::F64(_) => "float",
            Head::Str(_) => "str",
            Head::Bin(_) => "bytes",
            Head::Array(_) => "array",
            Head::Map(_) => "object",
            Head::Ext(..) => "ext",
        }
    }
}

/// Where an error is: the event's index (`None`: the batch) and the field.
#[derive(Clone, Copy)]
struct At {
    event: Option<usize>,
    field: &'static str,
}

impl At {
    fn wrong(self, expected: &'static str, found: Head<'_>) -> DecodeError {
        DecodeError::Field {
            event: self.event,
            field: self.field,
            expected,
            found: found.name(),
        }
    }
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    depth: usize,
}

const STR: &str = "str";
const STR_OR_NULL: &str = "str | null";
const INT: &str = "int";
const INT_OR_NULL: &str = "int | null";
const ARRAY: &str = "array";
const HASH: &str = "int | bytes";

impl<'a> Reader<'a> {
    fn malformed(&self, problem: &'static str) -> DecodeError {
        DecodeError::Malformed {
            offset: self.pos,
            problem,
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or(self.malformed("the input is cut short"))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn be<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let s = self.take(N)?;
        let mut a = [0; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn len(&mut self, width: usize) -> Result<usize, DecodeError> {
        let n = match width {
            1 => u32::from(self.be::<1>()?[0]),
            2 => u32::from(u16::from_be_bytes(self.be()?)),
            _ => u32::from_be_bytes(self.be()?),
        };
        usize::try_from(n).map_err(|_| self.malformed("a length past the address space"))
    }

    fn ext(&mut self, len: usize) -> Result<Head<'a>, DecodeError> {
        let [code] = self.be::<1>()?;
        let data = self.take(len)?;
        Ok(Head::Ext(i8::from_be_bytes([code]), data))
    }

    /// The next item's head; a container's items follow it.
    fn head(&mut self) -> Result<Head<'a>, DecodeError> {
        let [m] = self.be::<1>()?;
        Ok(match m {
            0x00..=0x7f => Head::Int(Int::from(m)),
            0x80..=0x8f => Head::Map(usize::from(m & 0x0f)),
            0x90..=0x9f => Head::Array(usize::from(m & 0x0f)),
            0xa0..=0xbf => {
                let s = self.take(usize::from(m & 0x1f))?;
                Head::Str(s)
            }
            0xc0 => Head::Nil,
            0xc1 => {
                self.pos -= 1;
                return Err(self.malformed("the reserved byte 0xc1"));
            }
            0xc2 => Head::Bool(false),
            0xc3 => Head::Bool(true),
            0xc4..=0xc6 => {
                let n = self.len(1 << (m - 0xc4))?;
                Head::Bin(self.take(n)?)
            }
            0xc7..=0xc9 => {
                let n = self.len(1 << (m - 0xc7))?;
                self.ext(n)?
            }
            0xca => Head::F32(f32::from_be_bytes(self.be()?)),
            0xcb => Head::F64(f64::from_be_bytes(self.be()?)),
            0xcc => Head::Int(Int::from(u8::from_be_bytes(self.be()?))),
            0xcd => Head::Int(Int::from(u16::from_be_bytes(self.be()?))),
            0xce => Head::Int(Int::from(u32::from_be_bytes(self.be()?))),
            0xcf => Head::Int(Int::from(u64::from_be_bytes(self.be()?))),
            0xd0 => Head::Int(Int::from(i8::from_be_bytes(self.be()?))),
            0xd1 => Head::Int(Int::from(i16::from_be_bytes(self.be()?))),
            0xd2 => Head::Int(Int::from(i32::from_be_bytes(self.be()?))),
            0xd3 => Head::Int(Int::from(i64::from_be_bytes(self.be()?))),
            0xd4..=0xd8 => self.ext(1 << (m - 0xd4))?,
            0xd9..=0xdb => {
                let n = self.len(1 << (m - 0xd9))?;
                Head::Str(self.take(n)?)
            }
            0xdc => Head::Array(self.len(2)?),
            0xdd => Head::Array(self.len(4)?),
            0xde => Head::Map(self.len(2)?),
            0xdf => Head::Map(self.len(4)?),
            0xe0..=0xff => Head::Int(Int::from(i8::from_be_bytes([m]))),
        })
    }

    /// Enters a container: past [`MAX_DEPTH`] it is an error.
    fn enter(&mut self) -> Result<(), DecodeError> {
        if self.depth >= MAX_DEPTH {
            return Err(self.malformed("nested deeper than the decoder's limit"));
        }
        self.depth += 1;
        Ok(())
    }

    /// Room reserved for `n` claimed items: at most one per byte left and [`PREALLOC_MAX`];
    /// past that a list grows only with items actually read.
    fn capacity(&self, n: usize) -> usize {
        n.min(self.buf.len() - self.pos).min(PREALLOC_MAX)
    }

    fn text(&self, s: &'a [u8], start: usize) -> Result<&'a str, DecodeError> {
        std::str::from_utf8(s).map_err(|_| DecodeError::Malformed {
            offset: start,
            problem: "a string that is not UTF-8",
        })
    }

    /// Skips the next item as msgspec skips an ignored one: it must be msgpack, its text is
    /// not checked.
    fn skip(&mut self) -> Result<(), DecodeError> {
        let n = match self.head()? {
            Head::Array(n) => n,
            Head::Map(n) => n.checked_mul(2).ok_or(self.malformed("a map too long"))?,
            _ => return Ok(()),
        };
        self.enter()?;
        for _ in 0..n {
            self.skip()?;
        }
        self.depth -= 1;
        Ok(())
    }

    fn batch(&mut self) -> Result<EventBatch, DecodeError> {
        let Head::Array(n) = self.head()? else {
            return Err(DecodeError::Batch);
        };
        if n < 2 {
            return Err(DecodeError::Batch);
        }
        self.enter()?;
        let at = |field| At { event: None, field };
        let ts = match self.head()? {
            Head::F64(v) => v,
            Head::F32(v) => f64::from(v),
            #[expect(
                clippy::cast_precision_loss,
                reason = "msgspec reads an integer as the nearest float too"
            )]
            Head::Int(v) => v as f64,
            h => return Err(at("ts").wrong("float", h)),
        };
        let events = match self.head()? {
            Head::Array(k) => {
                self.enter()?;
                let mut events = Vec::with_capacity(self.capacity(k));
                for i in 0..k {
                    events.push(self.event(i)?);
                }
                self.depth -= 1;
                events
            }
            h => return Err(at("events").wrong(ARRAY, h)),
        };
        let data_parallel_rank = if n > 2 {
            self.opt_int(at("data_parallel_rank"))?
        } else {
            None
        };
        for _ in 3..n {
            self.skip()?;
        }
        self.depth -= 1;
        Ok(EventBatch {
            ts,
            events,
            data_parallel_rank,
        })
    }

    /// A map key of event `event`: a string, its raw bytes (an unknown key's text is not
    /// checked).
    fn key(&mut self, event: usize) -> Result<&'a [u8], DecodeError> {
        match self.head()? {
            Head::Str(s) => Ok(s),
            h => Err(At {
                event: Some(event),
                field: "key",
            }
            .wrong(STR, h)),
        }
    }

    fn event(&mut self, index: usize) -> Result<KvEvent, DecodeError> {
        let Head::Map(n) = self.head()? else {
            return Err(DecodeError::Event(index));
        };
        self.enter()?;
        let at = |field| At {
            event: Some(index),
            field,
        };
        // The first `type` names the kind; then the fields are read from the map's start.
        let start = self.pos;
        let mut tag = None;
        for _ in 0..n {
            if self.key(index)? == b"type" && tag.is_none() {
                tag = Some(self.tag(at("type"))?);
            } else {
                self.skip()?;
            }
        }
        let tag = tag.ok_or(DecodeError::Missing {
            event: index,
            field: "type",
        })?;
        let mut fields = EventFields::default();
        self.pos = start;
        for _ in 0..n {
            let key = self.key(index)?;
            if key == b"type" {
                if self.tag(at("type"))? != tag {
                    return Err(DecodeError::Field {
                        event: Some(index),
                        field: "type",
                        expected: "the tag its first `type` gave",
                        found: "another tag",
                    });
                }
                continue;
            }
            self.field(tag, key, index, &mut fields)?;
        }
        self.depth -= 1;
        fields.finish(tag, index)
    }

    /// A `type` value: one of the three tags.
    fn tag(&mut self, at: At) -> Result<Tag, DecodeError> {
        let start = self.pos;
        match self.head()? {
            Head::Str(s) => match self.text(s, start)? {
                "BlockStored" => Ok(Tag::Stored),
                "BlockRemoved" => Ok(Tag::Removed),
                "AllBlocksCleared" => Ok(Tag::AllCleared),
                _ => Err(DecodeError::Field {
                    event: at.event,
                    field: at.field,
                    expected: "BlockStored, BlockRemoved or AllBlocksCleared",
                    found: "another name",
                }),
            },
            h => Err(at.wrong(STR, h)),
        }
    }

    /// Reads the value of `key` into `f` when `tag`'s struct has that field, else skips it.
    fn field(
        &mut self,
        tag: Tag,
        key: &[u8],
        index: usize,
        f: &mut EventFields,
    ) -> Result<(), DecodeError> {
        let Some(field) = FIELDS
            .iter()
            .find(|(name, tags)| name.as_bytes() == key && tags.contains(&tag))
            .map(|(name, _)| *name)
        else {
            return self.skip();
        };
        let at = At {
            event: Some(index),
            field,
        };
        match field {
            "block_hashes" => f.block_hashes = Some(self.hashes(at)?),
            "parent_block_hash" => f.parent_block_hash = Some(self.opt_hash(at)?),
            "token_ids" => f.token_ids = Some(self.ints(at)?),
            "block_size" => f.block_size = Some(self.int(at)?),
            "lora_id" => f.lora_id = Some(self.opt_int(at)?),
            "medium" => f.medium = Some(self.opt_str(at)?),
            "lora_name" => f.lora_name = Some(self.opt_str(at)?),
            "extra_keys" => f.extra_keys = self.extra_keys(at)?,
            "group_idx" => f.group_idx = self.opt_int(at)?,
            "kv_cache_spec_kind" => f.kv_cache_spec_kind = self.opt_str(at)?,
            "kv_cache_spec_sliding_window" => f.kv_cache_spec_sliding_window = self.opt_int(at)?,
            "locality" => f.locality = self.opt_str(at)?,
            "ownership" => f.ownership = self.opt_str(at)?,
            "session_id" => f.session_id = self.opt_str(at)?,
            _ => f.lookahead_token_ids = self.lookahead(at)?,
        }
        Ok(())
    }

    fn int(&mut self, at: At) -> Result<Int, DecodeError> {
        match self.head()? {
            Head::Int(v) => Ok(v),
            h => Err(at.wrong(INT, h)),
        }
    }

    fn opt_int(&mut self, at: At) -> Result<Option<Int>, DecodeError> {
        match self.head()? {
            Head::Nil => Ok(None),
            Head::Int(v) => Ok(Some(v)),
            h => Err(at.wrong(INT_OR_NULL, h)),
        }
    }

    fn opt_str(&mut self, at: At) -> Result<Option<String>, DecodeError> {
        let start = self.pos;
        match self.head()? {
            Head::Nil => Ok(None),
            Head::Str(s) => Ok(Some(self.text(s, start)?.to_owned())),
            h => Err(at.wrong(STR_OR_NULL, h)),
        }
    }

    fn opt_hash(&mut self, at: At) -> Result<Option<BlockHash>, DecodeError> {
        match self.head()? {
            Head::Nil => Ok(None),
            Head::Int(v) => Ok(Some(BlockHash::Int(v))),
            Head::Bin(b) => Ok(Some(BlockHash::Bytes(b.to_vec()))),
            h => Err(at.wrong("int | bytes | null", h)),
        }
    }

    /// An array's length, entered (the caller leaves it).
    fn array(&mut self, at: At, expected: &'static str) -> Result<usize, DecodeError> {
        match self.head()? {
            Head::Array(n) => {
                self.enter()?;
                Ok(n)
            }
            h => Err(at.wrong(expected, h)),
        }
    }

    fn hashes(&mut self, at: At) -> Result<Vec<BlockHash>, DecodeError> {
        let n = self.array(at, ARRAY)?;
        let mut out = Vec::with_capacity(self.capacity(n));
        for _ in 0..n {
            out.push(match self.head()? {
                Head::Int(v) => BlockHash::Int(v),
                Head::Bin(b) => BlockHash::Bytes(b.to_vec()),
                h => return Err(at.wrong(HASH, h)),
            });
        }
        self.depth -= 1;
        Ok(out)
    }

    fn ints(&mut self, at: At) -> Result<Vec<Int>, DecodeError> {
        let n = self.array(at, ARRAY)?;
        let mut out = Vec::with_capacity(self.capacity(n));
        for _ in 0..n {
            out.push(self.int(at)?);
        }
        self.depth -= 1;
        Ok(out)
    }

    fn lookahead(&mut self, at: At) -> Result<Option<Vec<Vec<Int>>>, DecodeError> {
        let n = match self.head()? {
            Head::Nil => return Ok(None),
            Head::Array(n) => n,
            h => return Err(at.wrong("array | null", h)),
        };
        self.enter()?;
        let mut out = Vec::with_capacity(self.capacity(n));
        for _ in 0..n {
            out.push(self.ints(at)?);
        }
        self.depth -= 1;
        Ok(Some(out))
    }
}

mod any;
mod fields;

#[cfg(test)]
mod tests;
