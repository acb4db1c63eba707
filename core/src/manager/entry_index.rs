//! [`EntryIndex`]: a request's key → entry index, as small and quick as a per-request map can
//! be. Open addressing with linear probing over `u32` cells (entry index + 1; 0 is empty),
//! at most half full, emptied when its request ends.
//!
//! A request offers each key once or a few times and its map is emptied when it ends, so the
//! index needs no deletion and no tombstones; in exchange for that narrow job it costs a
//! fraction of a general hash table's insert (which is most of what a request does with it).

use alloc::vec::Vec;

/// The smallest table (cells); tables grow by doubling.
const MIN_CELLS: usize = 16;

#[derive(Clone, Debug, Default)]
pub(crate) struct EntryIndex {
    cells: Vec<u32>,
}

impl EntryIndex {
    /// The entry `eq` accepts among those hashed to `h`, or, if none, records `new` under `h`
    /// and returns `None`. `new` is the index of the entry the caller is about to add (so
    /// entries `0..new` exist); `rehash(j)` gives entry `j`'s hash when the table grows.
    #[inline(always)]
    pub(crate) fn find_or_insert(
        &mut self,
        h: u64,
        new: u32,
        eq: impl Fn(u32) -> bool,
        rehash: impl Fn(u32) -> u64,
    ) -> Option<u32> {
        if (new as usize + 1) * 2 > self.cells.len() {
            self.grow(new, rehash);
        }
        let mask = self.cells.len() - 1;
        #[expect(clippy::cast_possible_truncation, reason = "masked to the table")]
        let mut at = h as usize & mask;
        loop {
            match self.cells[at] {
                0 => {
                    self.cells[at] = new + 1;
                    return None;
                }
                c if eq(c - 1) => return Some(c - 1),
                _ => at = (at + 1) & mask,
            }
        }
    }

    /// Doubles the table (or makes the first one) and re-inserts entries `0..len`.
    #[cold]
    #[inline(never)]
    fn grow(&mut self, len: u32, rehash: impl Fn(u32) -> u64) {
        let cells = (self.cells.len() * 2).max(MIN_CELLS);
        self.cells.clear();
        self.cells.resize(cells, 0);
        let mask = cells - 1;
        for j in 0..len {
            #[expect(clippy::cast_possible_truncation, reason = "masked to the table")]
            let mut at = rehash(j) as usize & mask;
            while self.cells[at] != 0 {
                at = (at + 1) & mask;
            }
            self.cells[at] = j + 1;
        }
    }

    /// Forgets the `len` entries it holds (`rehash(j)` gives entry `j`'s hash): a sparse
    /// table empties the entries' own cells, a dense one is zeroed whole.
    /// The table keeps its size, so a reused index allocates nothing; clearing costs what the
    /// entries do, not what the largest request before them did.
    pub(crate) fn clear(&mut self, len: u32, rehash: impl Fn(u32) -> u64) {
        let sparse = self.cells.len() > 8 * len as usize;
        if !(sparse && self.clear_entries(len, rehash)) {
            self.cells.fill(0);
        }
    }

    /// Empties the cells of entries `0..len`; false (some cells left) if an entry is not where
    /// its hash says, which only a key whose hash changed can cause.
    fn clear_entries(&mut self, len: u32, rehash: impl Fn(u32) -> u64) -> bool {
        let mask = self.cells.len() - 1;
        for j in 0..len {
            #[expect(clippy::cast_possible_truncation, reason = "masked to the table")]
            let mut at = rehash(j) as usize & mask;
            // Each entry sits at or after its hash's cell, within one lap of the table.
            let mut steps = 0;
            while self.cells[at] != j + 1 {
                steps += 1;
                if steps > mask {
                    return false;
                }
                at = (at + 1) & mask;
            }
            self.cells[at] = 0;
        }
        true
    }

    /// Bytes of heap held.
    pub(crate) fn allocation_size(&self) -> usize {
        self.cells.capacity() * 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[expect(clippy::cast_possible_truncation, reason = "100 keys")]
    fn finds_what_it_recorded_through_growth_and_collisions() {
        let mut idx = EntryIndex::default();
        // Keys 0..100 hashed to a few values, so probes collide and wrap.
        let hash = |k: u64| (k % 7) * 1_000_003;
        let mut keys: Vec<u64> = Vec::new();
        // As a request's table is used: `k` is looked up as the entry after `keys`.
        let find = |idx: &mut EntryIndex, keys: &[u64], k: u64| {
            idx.find_or_insert(
                hash(k),
                keys.len() as u32,
                |j| keys[j as usize] == k,
                |j| hash(keys[j as usize]),
            )
        };
        for k in 0..100u64 {
            assert_eq!(find(&mut idx, &keys, k), None, "key {k} is new");
            keys.push(k);
        }
        assert_eq!(idx.cells.len(), 256);
        for k in (0..100u64).rev() {
            assert_eq!(find(&mut idx, &keys, k), Some(k as u32));
        }
        idx.clear(100, |j| hash(keys[j as usize]));
        assert_eq!(idx.allocation_size(), 256 * 4);
        assert!(idx.cells.iter().all(|&c| c == 0));
        // A sparse table is emptied entry by entry.
        for (j, k) in [(0u32, 3u64), (1, 10)] {
            assert_eq!(idx.find_or_insert(hash(k), j, |_| false, |_| 0), None);
        }
        idx.clear(2, |j| hash([3, 10][j as usize]));
        assert!(idx.cells.iter().all(|&c| c == 0));
        // A hash that changed since the insert still leaves the table empty.
        for (j, k) in [(0u32, 3u64), (1, 10)] {
            assert_eq!(idx.find_or_insert(hash(k), j, |_| false, |_| 0), None);
        }
        idx.clear(2, |j| hash(u64::from(j) + 1));
        assert!(idx.cells.iter().all(|&c| c == 0));
        assert_eq!(idx.find_or_insert(5, 0, |_| true, |_| 5), None);
    }

    #[test]
    fn a_large_table_is_kept_and_emptied_at_clear() {
        let mut idx = EntryIndex::default();
        for j in 0..600u32 {
            assert_eq!(
                idx.find_or_insert(u64::from(j), j, |_| false, u64::from),
                None
            );
        }
        assert_eq!(idx.cells.len(), 2048);
        idx.clear(600, u64::from);
        assert_eq!(idx.allocation_size(), 2048 * 4);
        assert!(idx.cells.iter().all(|&c| c == 0));
        // Three entries in 2,048 cells: emptied one by one.
        for j in 0..3u32 {
            assert_eq!(
                idx.find_or_insert(u64::from(j) * 7, j, |_| false, |_| 0),
                None
            );
        }
        idx.clear(3, |j| u64::from(j) * 7);
        assert!(idx.cells.iter().all(|&c| c == 0));
    }
}
