//! Encoding: [`encode`], [`encode_to_vec`] and [`encoded_len`].

use alloc::vec::Vec;

use super::{EncodeError, VERSION, fixed, varint_len, zigzag};
use crate::stats::MetricKind;
use crate::stats::payload::{InfoSeries, InfoValue, Payload, Series, Value};

fn text_len(s: &str) -> usize {
    varint_len(s.len() as u64) + s.len()
}

fn value_len(v: &Value) -> usize {
    match v {
        Value::Counter(c) => varint_len(*c),
        Value::Gauge(g) => varint_len(zigzag(g.numerator())) + varint_len(g.denominator()),
        Value::Histogram(h) => {
            varint_len(h.bounds().len() as u64)
                + h.bounds().iter().map(|b| varint_len(*b)).sum::<usize>()
                + h.bucket_counts()
                    .iter()
                    .map(|c| varint_len(*c))
                    .sum::<usize>()
                + varint_len(h.sum())
        }
    }
}

/// The families of a payload: runs of series with the same name.
fn families(series: &[Series]) -> impl Iterator<Item = &[Series]> {
    // Catalogue names are mostly the same `'static` text: equal addresses settle it.
    series.chunk_by(|a, b| {
        let (a, b) = (a.name().as_bytes(), b.name().as_bytes());
        // Names of one length mostly differ in their last bytes.
        a.len() == b.len() && (core::ptr::eq(a, b) || (a.last() == b.last() && a == b))
    })
}

/// The exact number of bytes [`encode`] writes for `payload`.
#[must_use]
pub fn encoded_len(payload: &Payload) -> usize {
    let mut n = 1 + varint_len(payload.len() as u64) + 1;
    for fam in families(payload.series()) {
        if let Some(first) = fam.first() {
            n += text_len(first.name()) + 1 + varint_len(fam.len() as u64);
        }
        for s in fam {
            n += varint_len(s.labels().len() as u64);
            n += s.labels().iter().map(text_len).sum::<usize>();
            n += value_len(s.value());
        }
    }
    if let Some(info) = payload.info() {
        n += varint_len(info.len() as u64);
        for series in info {
            n += varint_len(series.len() as u64);
            for (k, v) in series.iter() {
                n += text_len(k) + 1;
                n += match v {
                    InfoValue::Int(i) => varint_len(zigzag(*i)),
                    InfoValue::Text(t) => text_len(t),
                    InfoValue::None | InfoValue::Bool(_) => 0,
                };
            }
        }
    }
    n
}

pub(super) struct Writer<'a> {
    pub(super) buf: &'a mut [u8],
    pub(super) pos: usize,
}

/// The buffer ran out (the caller turns this into [`EncodeError::BufferTooSmall`]).
pub(super) struct Full;

impl Writer<'_> {
    #[inline]
    fn byte(&mut self, b: u8) -> Result<(), Full> {
        let slot = self.buf.get_mut(self.pos).ok_or(Full)?;
        *slot = b;
        self.pos += 1;
        Ok(())
    }

    #[inline]
    #[expect(clippy::cast_possible_truncation, reason = "below 0x80")]
    pub(super) fn varint(&mut self, v: u64) -> Result<(), Full> {
        if v < 0x80 {
            return self.byte(v as u8);
        }
        self.long_varint(v)
    }

    #[expect(clippy::cast_possible_truncation, reason = "masked to 7 bits first")]
    fn long_varint(&mut self, mut v: u64) -> Result<(), Full> {
        while v >= 0x80 {
            self.byte((v as u8 & 0x7f) | 0x80)?;
            v >>= 7;
        }
        self.byte(v as u8)
    }

    /// Each of `values` as a varint; a run of eight below 0x80 is one eight-byte write.
    fn varints(&mut self, mut values: &[u64]) -> Result<(), Full> {
        while let Some((eight, rest)) = values.split_first_chunk::<8>() {
            if eight.iter().fold(0, |acc, v| acc | v) >= 0x80 {
                break;
            }
            // Each value is one byte: value `i` goes to byte `i`.
            let packed = eight.iter().rev().fold(0u64, |acc, v| (acc << 8) | v);
            self.bytes(&packed.to_le_bytes())?;
            values = rest;
        }
        for v in values {
            self.varint(*v)?;
        }
        Ok(())
    }

    #[inline]
    fn bytes(&mut self, b: &[u8]) -> Result<(), Full> {
        let end = self.pos.checked_add(b.len()).ok_or(Full)?;
        self.buf
            .get_mut(self.pos..end)
            .ok_or(Full)?
            .copy_from_slice(b);
        self.pos = end;
        Ok(())
    }

    fn text(&mut self, s: &str) -> Result<(), Full> {
        self.varint(s.len() as u64)?;
        self.bytes(s.as_bytes())
    }
}

const fn kind_byte(k: MetricKind) -> u8 {
    match k {
        MetricKind::Counter => 0,
        MetricKind::Gauge => 1,
        MetricKind::Histogram => 2,
    }
}

fn write_payload(w: &mut Writer<'_>, payload: &Payload) -> Result<(), Full> {
    w.byte(VERSION)?;
    w.varint(payload.len() as u64)?;
    for fam in families(payload.series()) {
        let Some(first) = fam.first() else { continue };
        w.text(first.name())?;
        w.byte(kind_byte(first.kind()))?;
        w.varint(fam.len() as u64)?;
        for s in fam {
            write_series(w, s)?;
        }
    }
    match payload.info() {
        None => w.byte(0),
        Some(info) => write_info(w, info),
    }
}

/// One series: its labels and value (fields 3.4.1–3.4.3).
fn write_series(w: &mut Writer<'_>, s: &Series) -> Result<(), Full> {
    w.varint(s.labels().len() as u64)?;
    for l in s.labels().iter() {
        w.text(l)?;
    }
    match s.value() {
        Value::Counter(c) => w.varint(*c),
        Value::Gauge(g) => {
            w.varint(zigzag(g.numerator()))?;
            w.varint(g.denominator())
        }
        Value::Histogram(h) => {
            w.varint(h.bounds().len() as u64)?;
            match fixed::known_bounds(h.bounds()) {
                Some(list) => w.bytes(list.bytes())?,
                None => {
                    for b in h.bounds() {
                        w.varint(*b)?;
                    }
                }
            }
            w.varints(h.bucket_counts())?;
            w.varint(h.sum())
        }
    }
}

/// The info section after its flag (fields 4 and 5).
fn write_info(w: &mut Writer<'_>, info: &[InfoSeries]) -> Result<(), Full> {
    w.byte(1)?;
    w.varint(info.len() as u64)?;
    for series in info {
        w.varint(series.len() as u64)?;
        for (k, v) in series.iter() {
            w.text(k)?;
            match v {
                InfoValue::None => w.byte(0)?,
                InfoValue::Bool(false) => w.byte(1)?,
                InfoValue::Bool(true) => w.byte(2)?,
                InfoValue::Int(i) => {
                    w.byte(3)?;
                    w.varint(zigzag(*i))?;
                }
                InfoValue::Text(t) => {
                    w.byte(4)?;
                    w.text(t)?;
                }
            }
        }
    }
    Ok(())
}

/// Encodes `payload` into the front of `buf` and returns the number of bytes written.
///
/// # Errors
/// [`EncodeError::BufferTooSmall`] when `buf` is shorter than [`encoded_len`]; the bytes of `buf`
/// are unspecified then.
pub fn encode(payload: &Payload, buf: &mut [u8]) -> Result<usize, EncodeError> {
    let available = buf.len();
    let mut w = Writer { buf, pos: 0 };
    match write_payload(&mut w, payload) {
        Ok(()) => Ok(w.pos),
        Err(Full) => Err(EncodeError::BufferTooSmall {
            needed: encoded_len(payload),
            available,
        }),
    }
}

/// Encodes `payload` into a new vector of exactly [`encoded_len`] bytes.
#[must_use]
pub fn encode_to_vec(payload: &Payload) -> Vec<u8> {
    let mut out = alloc::vec![0u8; encoded_len(payload)];
    // The buffer has exactly the needed length, so this cannot fail; keep what was written.
    let n = encode(payload, &mut out).unwrap_or(0);
    out.truncate(n);
    out
}
