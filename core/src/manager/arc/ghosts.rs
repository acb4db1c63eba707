//! ARC's ghost lists B1 and B2 on one node table, their keys in the chunks' key table past the
//! slots.

use crate::key::OffloadKey;
use crate::manager::key_table::KeyTable;
use crate::manager::links::{Links, List, NIL};
use crate::reserve::AllocError;

/// The two ghost lists, by the parity of their ids.
pub(super) const B1: u32 = 0;
pub(super) const B2: u32 = 1;

/// The ghost lists: keys recently evicted from T1 (B1) and T2 (B2), each at most `capacity`
/// long, on `2 · capacity` nodes whose keys follow the slots' in the key table. B1's nodes
/// are even and B2's odd, so a ghost's node says its list: no per-ghost list byte and no id
/// allocator beyond each list's count of nodes ever used and its list of freed ones.
#[derive(Clone, Debug)]
pub(super) struct Ghosts {
    /// B1, B2 and each one's freed nodes, threaded through one node table.
    pub(super) links: Links,
    pub(super) lists: [List; 2],
    free: [List; 2],
    /// How many of each list's nodes have ever been used (its next fresh node is
    /// `2 · fresh[list] + list`).
    fresh: [u32; 2],
    /// Also the number of slots, so node `g`'s key is the key table's id `capacity + g`.
    pub(super) capacity: u32,
}

impl Ghosts {
    pub(super) fn new(capacity: u32) -> Result<Self, AllocError> {
        // The configuration keeps 3 · capacity below 2^32.
        let n = capacity.checked_mul(2).ok_or(AllocError)?;
        Ok(Ghosts {
            links: Links::new(n)?,
            lists: [List::EMPTY; 2],
            free: [List::EMPTY; 2],
            fresh: [0; 2],
            capacity,
        })
    }

    /// The bytes [`Ghosts::new`] allocates for `capacity` ghosts per list.
    pub(super) fn bytes(capacity: u64) -> u64 {
        Links::<()>::bytes(capacity.saturating_mul(2))
    }

    /// The ghost node holding `key`, if any.
    #[inline]
    pub(super) fn find<K: OffloadKey>(&self, table: &KeyTable<K>, key: &K) -> Option<u32> {
        let base = self.capacity;
        table.find_in(key, |i| i >= base).map(|i| i - base)
    }

    /// The list ghost `node` is in.
    #[inline]
    pub(super) const fn list_of(node: u32) -> u32 {
        node & 1
    }

    #[inline]
    pub(super) fn remove<K: OffloadKey>(&mut self, table: &mut KeyTable<K>, key: &K) {
        let base = self.capacity;
        if let Some(id) = table.remove_key_in(key, |i| i >= base) {
            self.release(id - base);
        }
    }

    /// Takes `node` (its key just forgotten) out of its list into its list's free nodes.
    #[inline]
    pub(super) fn release(&mut self, node: u32) {
        let l = Self::list_of(node) as usize;
        self.links.unlink(&mut self.lists[l], node);
        self.links.push_back(&mut self.free[l], node);
    }

    /// Appends the key of resident `slot` at the MRU end of `list`, dropping that list's LRU
    /// entry first when it is full — the same result as vLLM's append-then-trim. The slot's
    /// index entry becomes the ghost's (with no ghost room, as no slot is resident either, the
    /// entry is dropped).
    pub(super) fn push<K: OffloadKey>(&mut self, table: &mut KeyTable<K>, list: u32, slot: u32) {
        if self.capacity == 0 {
            table.remove(slot);
            return;
        }
        let l = list as usize;
        let node = if self.lists[l].len >= self.capacity {
            // Full: the LRU ghost is dropped and its node holds the new one (same list).
            let head = self.lists[l].head;
            table.remove(self.capacity + head);
            self.links.unlink(&mut self.lists[l], head);
            head
        } else {
            self.take_node(list)
        };
        let moved = table.relabel(slot, self.capacity + node);
        debug_assert!(moved, "a resident victim's key is in the index");
        self.links.push_back(&mut self.lists[l], node);
    }

    /// A node for a new ghost of `list`, from its freed nodes or never used.
    #[inline]
    pub(super) fn take_node(&mut self, list: u32) -> u32 {
        let l = list as usize;
        match self.free[l].head {
            NIL => {
                // Fewer than `capacity` of this list's nodes are in use and none is free, so
                // this one is below 2 · capacity.
                let node = 2 * self.fresh[l] + list;
                self.fresh[l] += 1;
                node
            }
            freed => {
                self.links.unlink(&mut self.free[l], freed);
                freed
            }
        }
    }

    /// Empties both lists (the key table forgets their keys with the chunks).
    pub(super) fn clear(&mut self) {
        self.lists = [List::EMPTY; 2];
        self.free = [List::EMPTY; 2];
        self.fresh = [0; 2];
    }

    pub(super) fn heap_bytes(&self) -> usize {
        self.links.heap_bytes()
    }
}
