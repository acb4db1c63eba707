//! The provided offload key: a 64-bit block hash and a KV-cache group index.
//!
//! vLLM encodes an offload key as `hash_bytes ‖ u32_be(group)`. kvtier's manager is generic over
//! its key (`K: Copy + Eq + Hash`); [`BlockKey`] is the compact key for callers that already
//! reduce block hashes to 64 bits (as vLLM does with `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`:
//! the big-endian hash bytes modulo 2^64).

use core::fmt;

/// A block hash (64 bits) plus the KV-cache group it belongs to.
///
/// Hashing feeds one 64-bit word (the hash with the group folded in), so a lookup costs one
/// mixing round: the block hash is already uniformly distributed.
///
/// The key is 12 bytes, aligned to 4 (`repr(C, packed(4))`): the manager's key tables hold
/// one per resident chunk and two per ARC ghost, and the 4 bytes of padding a 16-byte key
/// would carry were a tenth of ARC's metadata. Its fields are read and written by value; a
/// reference to `hash` would be unaligned, which Rust refuses to make.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
#[repr(C, packed(4))]
pub struct BlockKey {
    /// The block's hash (for example the low 64 bits of vLLM's chained block hash).
    pub hash: u64,
    /// The KV-cache group index.
    pub group: u32,
}

impl BlockKey {
    /// A key for `hash` in group `group`.
    #[must_use]
    pub const fn new(hash: u64, group: u32) -> Self {
        BlockKey { hash, group }
    }

    /// Reduces vLLM's key bytes (`hash_bytes ‖ u32_be(group)`) to a [`BlockKey`]: the hash part
    /// read big-endian modulo 2^64, the last four bytes as the group.
    ///
    /// Returns `None` when `bytes` is shorter than 4 bytes (there is no group index).
    #[must_use]
    pub fn from_vllm_bytes(bytes: &[u8]) -> Option<Self> {
        let split = bytes.len().checked_sub(4)?;
        let (hash_bytes, group_bytes) = bytes.split_at(split);
        let mut g = [0u8; 4];
        g.copy_from_slice(group_bytes);
        let hash = hash_bytes
            .iter()
            .fold(0u64, |acc, &b| (acc << 8) | u64::from(b));
        Some(BlockKey {
            hash,
            group: u32::from_be_bytes(g),
        })
    }
}

impl core::hash::Hash for BlockKey {
    #[inline]
    fn hash<H: core::hash::Hasher>(&self, state: &mut H) {
        // Equal keys give equal words; distinct groups of one hash differ in the top bits.
        state.write_u64(self.hash ^ u64::from(self.group).rotate_right(7));
    }
}

impl fmt::Display for BlockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}/{}", { self.hash }, { self.group })
    }
}

/// What the manager needs of a key: cheap to copy, hashable, totally ordered, and able to say
/// which KV-cache group it belongs to.
///
/// The order is used only to break ties between keys of equal LRU rank (two keys of one request
/// at the same end-token position, which happens when a request has several KV-cache groups).
/// vLLM breaks those ties by comparing the raw key bytes (`hash_bytes ‖ u32_be(group)`); a key
/// type reproduces vLLM exactly when its `Ord` agrees with that byte order, as [`BlockKey`]'s
/// does for 8-byte hashes.
pub trait OffloadKey: Copy + Eq + Ord + core::hash::Hash + fmt::Debug {
    /// The KV-cache group index of this key.
    fn group(&self) -> u32;
}

impl OffloadKey for BlockKey {
    #[inline]
    fn group(&self) -> u32 {
        self.group
    }
}

/// A bare 64-bit hash is a key of group 0.
impl OffloadKey for u64 {
    #[inline]
    fn group(&self) -> u32 {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_key_is_twelve_bytes_without_padding() {
        assert_eq!(core::mem::size_of::<BlockKey>(), 12);
        assert_eq!(core::mem::align_of::<BlockKey>(), 4);
        // Field order is still the order: hash first, then group.
        assert!(BlockKey::new(1, 0) > BlockKey::new(0, 9));
        assert!(BlockKey::new(1, 2) < BlockKey::new(1, 3));
    }

    #[test]
    fn from_vllm_bytes_reads_big_endian_modulo_2_64() {
        // 9 hash bytes: the leading 0xff falls off modulo 2^64.
        let bytes = [0xff, 0, 0, 0, 0, 0, 0, 0x01, 0x02, 0, 0, 0, 7];
        assert_eq!(
            BlockKey::from_vllm_bytes(&bytes),
            Some(BlockKey::new(0x0102, 7))
        );
        assert_eq!(
            BlockKey::from_vllm_bytes(&[0, 0, 0, 1]),
            Some(BlockKey::new(0, 1))
        );
        assert_eq!(BlockKey::from_vllm_bytes(&[1, 2, 3]), None);
        assert_eq!(
            alloc::format!("{}", BlockKey::new(0xab, 2)),
            "00000000000000ab/2"
        );
    }
}
