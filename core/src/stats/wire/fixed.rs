//! The encodings of the catalogue's histogram bound lists (in field 3.4.3, the bounds after the
//! bound count), computed at compile time: the encoder copies them instead of writing each
//! bound, and the decoder compares the input with them instead of reading each bound and
//! checking the order.

use super::MAX_VARINT;
use crate::stats::catalogue::{CATALOGUE, MetricDef};
use crate::stats::histogram::MAX_BOUNDS;

/// Families in the catalogue.
const FAMILIES: usize = CATALOGUE.len();

/// The longest encoding of a bound list: [`MAX_BOUNDS`] varints.
const MAX_BYTES: usize = MAX_BOUNDS * MAX_VARINT;

/// One bound list and its encoding.
#[derive(Clone, Copy)]
pub(super) struct Bounds {
    bounds: &'static [u64],
    bytes: [u8; MAX_BYTES],
    len: usize,
}

impl Bounds {
    /// The bounds.
    #[cfg(test)]
    pub(super) const fn bounds(&self) -> &'static [u64] {
        self.bounds
    }

    /// Their encoding: each bound, as a varint.
    pub(super) fn bytes(&self) -> &[u8] {
        self.bytes.get(..self.len).unwrap_or(&[])
    }
}

#[expect(clippy::cast_possible_truncation, reason = "masked to 7 bits first")]
const fn push_varint(out: &mut [u8; MAX_BYTES], mut at: usize, mut v: u64) -> usize {
    while v >= 0x80 {
        out[at] = (v as u8 & 0x7f) | 0x80;
        v >>= 7;
        at += 1;
    }
    out[at] = v as u8;
    at + 1
}

const fn encode(bounds: &'static [u64]) -> Bounds {
    let mut bytes = [0u8; MAX_BYTES];
    let mut len = 0;
    let mut i = 0;
    while i < bounds.len() {
        len = push_varint(&mut bytes, len, bounds[i]);
        i += 1;
    }
    Bounds { bounds, bytes, len }
}

const fn same(a: &[u64], b: &[u64]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// True when family `i` is a histogram and the first family with its bound list.
const fn first_with_its_bounds(defs: &[MetricDef; FAMILIES], i: usize) -> bool {
    if defs[i].bounds.is_empty() {
        return false;
    }
    let mut j = 0;
    while j < i {
        if same(defs[j].bounds, defs[i].bounds) {
            return false;
        }
        j += 1;
    }
    true
}

const fn distinct_count(defs: &[MetricDef; FAMILIES]) -> usize {
    let mut n = 0;
    let mut i = 0;
    while i < FAMILIES {
        if first_with_its_bounds(defs, i) {
            n += 1;
        }
        i += 1;
    }
    n
}

const DISTINCT: usize = distinct_count(&CATALOGUE);

const fn lists(defs: &'static [MetricDef; FAMILIES]) -> [Bounds; DISTINCT] {
    let mut lists = [Bounds {
        bounds: &[],
        bytes: [0; MAX_BYTES],
        len: 0,
    }; DISTINCT];
    let mut next = 0;
    let mut i = 0;
    while i < FAMILIES {
        if first_with_its_bounds(defs, i) {
            lists[next] = encode(defs[i].bounds);
            next += 1;
        }
        i += 1;
    }
    lists
}

/// The catalogue's distinct bound lists.
static LISTS: [Bounds; DISTINCT] = lists(&CATALOGUE);

/// The encoding of `bounds` when it is one of the catalogue's lists.
#[inline]
pub(super) fn known_bounds(bounds: &[u64]) -> Option<&'static Bounds> {
    let first = bounds.first()?;
    LISTS
        .iter()
        .find(|l| l.bounds.first() == Some(first) && l.bounds == bounds)
}

/// The length of the catalogue list of `count` bounds whose encoding `rest` starts with.
#[inline(always)]
pub(super) fn known_prefix(rest: &[u8], count: usize) -> Option<usize> {
    let first = rest.first()?;
    LISTS
        .iter()
        .find(|l| {
            l.bounds.len() == count && l.bytes.first() == Some(first) && rest.starts_with(l.bytes())
        })
        .map(|l| l.len)
}

#[cfg(test)]
mod tests {
    use super::super::{Reader, varint_len};
    use super::*;

    #[test]
    fn every_histogram_family_has_its_list_encoded() {
        for def in CATALOGUE.iter().filter(|d| !d.bounds.is_empty()) {
            let list = known_bounds(def.bounds).expect("a catalogue list");
            assert_eq!(list.bounds(), def.bounds, "{}", def.name);
            let bytes = list.bytes();
            let expected: usize = def.bounds.iter().map(|b| varint_len(*b)).sum();
            assert_eq!(bytes.len(), expected, "{}", def.name);
            let mut r = Reader { buf: bytes, pos: 0 };
            for b in def.bounds {
                assert_eq!(r.varint(), Ok(*b));
            }
            assert_eq!(r.pos, bytes.len());
            // Found from the input, with anything after it; not with another count or a byte
            // missing.
            let n = def.bounds.len();
            let input = [bytes, &[7, 7]].concat();
            assert_eq!(known_prefix(&input, n), Some(bytes.len()), "{}", def.name);
            assert_eq!(known_prefix(&input, n + 1), None);
            assert_eq!(known_prefix(&bytes[..bytes.len() - 1], n), None);
            assert_eq!(known_prefix(&bytes[1..], n), None);
        }
        assert_eq!(known_bounds(&[1, 2, 3]).map(Bounds::bounds), None);
        assert_eq!(known_bounds(&[]).map(Bounds::bounds), None);
        assert_eq!(known_prefix(&[], 0), None);
        let histograms = CATALOGUE.iter().filter(|d| !d.bounds.is_empty()).count();
        assert!(
            LISTS.len() < histograms,
            "lists shared by families are kept once"
        );
    }
}
