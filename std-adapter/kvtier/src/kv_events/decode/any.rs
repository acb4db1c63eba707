//! `extra_keys`' values: any msgpack value as msgspec reads it into a Python object (and
//! would write it back), so that kvtier holds the value vLLM holds.

use std::collections::HashMap;
use std::collections::hash_map::Entry;

use rmpv::Value;

use super::{At, DecodeError, Head, Int, Reader};

/// Python's `datetime` range, in seconds from the epoch: 0001-01-01 to 9999-12-31T23:59:59.
const DATETIME_MIN: i64 = -62_135_596_800;
const DATETIME_MAX: i64 = 253_402_300_799;

impl Reader<'_> {
    /// `extra_keys`: nil, or an array of (an array of any values, or nil).
    pub(super) fn extra_keys(&mut self, at: At) -> Result<Option<Value>, DecodeError> {
        let n = match self.head()? {
            Head::Nil => return Ok(None),
            Head::Array(n) => n,
            h => return Err(at.wrong("array | null", h)),
        };
        self.enter()?;
        let mut out = Vec::with_capacity(self.capacity(n));
        for _ in 0..n {
            out.push(match self.head()? {
                Head::Nil => Value::Nil,
                Head::Array(k) => self.any_items(k, at)?,
                h => return Err(at.wrong("array | null", h)),
            });
        }
        self.depth -= 1;
        Ok(Some(Value::Array(out)))
    }

    /// The `k` items of an array whose head was read, as any values.
    fn any_items(&mut self, k: usize, at: At) -> Result<Value, DecodeError> {
        self.enter()?;
        let mut items = Vec::with_capacity(self.capacity(k));
        for _ in 0..k {
            items.push(self.any(at)?);
        }
        self.depth -= 1;
        Ok(Value::Array(items))
    }

    /// Any value, as msgspec reads one into a Python object and would write it back.
    fn any(&mut self, at: At) -> Result<Value, DecodeError> {
        let start = self.pos;
        Ok(match self.head()? {
            Head::Nil => Value::Nil,
            Head::Bool(b) => Value::Boolean(b),
            Head::Int(v) => int_value(v),
            Head::F32(v) => Value::F64(f64::from(v)),
            Head::F64(v) => Value::F64(v),
            Head::Str(s) => Value::from(self.text(s, start)?),
            Head::Bin(b) => Value::Binary(b.to_vec()),
            Head::Array(k) => self.any_items(k, at)?,
            Head::Map(k) => {
                self.enter()?;
                let mut pairs: Vec<(Value, Value)> = Vec::with_capacity(self.capacity(k));
                // A Python dict: a repeated key keeps its first place and its last value.
                let mut places: HashMap<KeyId, usize> = HashMap::new();
                let mut nans = 0;
                for _ in 0..k {
                    let key = self.any(at)?;
                    let id = key_id(&key, &mut nans).ok_or(DecodeError::Field {
                        event: at.event,
                        field: at.field,
                        expected: "a hashable map key",
                        found: "a map or an extension",
                    })?;
                    let value = self.any(at)?;
                    match places.entry(id) {
                        Entry::Occupied(e) => pairs[*e.get()].1 = value,
                        Entry::Vacant(e) => {
                            e.insert(pairs.len());
                            pairs.push((key, value));
                        }
                    }
                }
                self.depth -= 1;
                Value::Map(pairs)
            }
            Head::Ext(-1, data) => timestamp(data).ok_or(DecodeError::Field {
                event: at.event,
                field: at.field,
                expected: "a timestamp within Python's datetime range",
                found: "an invalid timestamp",
            })?,
            Head::Ext(code, data) => Value::Ext(code, data.to_vec()),
        })
    }
}

fn int_value(v: Int) -> Value {
    match u64::try_from(v) {
        Ok(u) => Value::from(u),
        Err(_) => Value::from(i64::try_from(v).unwrap_or(i64::MIN)),
    }
}

/// A timestamp extension as the `datetime` msgspec reads and writes back: validated, rounded
/// to microseconds, in the narrowest of the three forms.
fn timestamp(data: &[u8]) -> Option<Value> {
    let (secs, nanos) = match data.len() {
        4 => (i64::from(u32::from_be_bytes(data.try_into().ok()?)), 0),
        8 => {
            let v = u64::from_be_bytes(data.try_into().ok()?);
            let secs = i64::try_from(v & ((1 << 34) - 1)).ok()?;
            (secs, u32::try_from(v >> 34).ok()?)
        }
        12 => {
            let nanos = u32::from_be_bytes(data[..4].try_into().ok()?);
            (i64::from_be_bytes(data[4..].try_into().ok()?), nanos)
        }
        _ => return None,
    };
    if nanos >= 1_000_000_000 || !(DATETIME_MIN..=DATETIME_MAX).contains(&secs) {
        return None;
    }
    // To the nearest microsecond, halves up; a carry may pass the range's end.
    let micros = (nanos + 500) / 1000;
    let (secs, nanos) = if micros == 1_000_000 {
        (secs + 1, 0)
    } else {
        (secs, micros * 1000)
    };
    if secs > DATETIME_MAX {
        return None;
    }
    let bytes = match (u32::try_from(secs), u64::try_from(secs)) {
        (Ok(s), _) if nanos == 0 => s.to_be_bytes().to_vec(),
        (_, Ok(s)) if s < 1 << 34 => ((u64::from(nanos) << 34) | s).to_be_bytes().to_vec(),
        _ => {
            let mut b = nanos.to_be_bytes().to_vec();
            b.extend_from_slice(&secs.to_be_bytes());
            b
        }
    };
    Some(Value::Ext(-1, bytes))
}

/// A map key as Python's `==` and `hash` see the object msgspec makes of it: numbers by
/// value (`1`, `1.0` and `True` are one key; every NaN is its own), text and bytes apart,
/// an array as the tuple of its items.
#[derive(Debug, PartialEq, Eq, Hash)]
enum KeyId {
    Number(Int),
    Float(u64),
    Nan(usize),
    Nil,
    Str(Vec<u8>),
    Bin(Vec<u8>),
    Timestamp(Vec<u8>),
    Tuple(Vec<KeyId>),
}

/// The [`KeyId`] of `v`, `None` when Python cannot hash it (a map is a dict, an extension
/// other than a timestamp an `Ext`); `nans` numbers the NaNs seen.
fn key_id(v: &Value, nans: &mut usize) -> Option<KeyId> {
    Some(match v {
        Value::Nil => KeyId::Nil,
        Value::Boolean(b) => KeyId::Number(Int::from(*b)),
        Value::Integer(i) => KeyId::Number(
            i.as_i64()
                .map(Int::from)
                .or_else(|| i.as_u64().map(Int::from))?,
        ),
        Value::F32(_) | Value::F64(_) => {
            let f = v.as_f64()?;
            if f.is_nan() {
                *nans += 1;
                KeyId::Nan(*nans)
            } else if f.fract() == 0.0 && f.abs() < 1e30 {
                #[expect(
                    clippy::cast_possible_truncation,
                    reason = "an integral float below 1e30 fits an i128 exactly"
                )]
                KeyId::Number(f as Int)
            } else {
                KeyId::Float(f.to_bits())
            }
        }
        Value::String(s) => KeyId::Str(s.as_bytes().to_vec()),
        Value::Binary(b) => KeyId::Bin(b.clone()),
        Value::Ext(-1, b) => KeyId::Timestamp(b.clone()),
        Value::Array(items) => KeyId::Tuple(
            items
                .iter()
                .map(|i| key_id(i, nans))
                .collect::<Option<_>>()?,
        ),
        Value::Map(_) | Value::Ext(..) => return None,
    })
}
