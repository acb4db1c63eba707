//! Per-request state in fixed slots: the pending hit, the load, a load abandoned by a reset,
//! and (eager mode) the store state; plus the insertion orders vLLM's dicts iterate in.

use alloc::vec::Vec;
use core::hash::BuildHasher;
use hashbrown::HashTable;

use super::layout::{Layout, MAX_GROUPS};
use crate::hashing::FixedState;
use crate::reserve::{AllocError, table, with_capacity};

/// No slot / no block.
pub(super) const NIL: u32 = u32::MAX;

/// A load (`LoadRequestState`): its event once issued, and its block pairs.
#[derive(Clone, Debug)]
pub(super) struct Load {
    pub(super) active: bool,
    pub(super) event: Option<u64>,
    pub(super) gpu: Vec<u32>,
    pub(super) cpu: Vec<u32>,
}

/// Eager store state (`StoreRequestState`).
#[derive(Clone, Debug)]
pub(super) struct Store {
    pub(super) active: bool,
    /// `block_ids`, per group: the positional groups' tables (the others' are not read and
    /// stay empty).
    pub(super) tables: Vec<Vec<u32>>,
    /// `num_stored_blocks`, per group.
    pub(super) cursors: [u32; MAX_GROUPS],
    /// In-flight store events naming this request (`len(store_events)`).
    pub(super) events: u32,
    /// The last event this request was counted in (so it is counted once per event).
    pub(super) last_event: Option<u64>,
    pub(super) finished: bool,
}

/// One request's slot.
#[derive(Clone, Debug)]
pub(super) struct Slot {
    pub(super) id: u64,
    pub(super) live: bool,
    /// Bumped when the slot is released, so store events can tell a reused slot apart.
    pub(super) generation: u32,
    /// The step that last validated this slot (duplicate detection).
    pub(super) stamp: u64,
    /// The pending CPU hit, when `has_hit`: its blocks that are not null (pinned), group
    /// after group in group order, each group's in position order.
    pub(super) has_hit: bool,
    pub(super) hit: Vec<u32>,
    /// Per group: the entries of its hit list.
    pub(super) hit_entries: [u32; MAX_GROUPS],
    /// Per group: the first held entry of its hit list (those before are null padding).
    pub(super) hit_from: [u32; MAX_GROUPS],
    pub(super) hit_computed: u64,
    pub(super) load: Load,
    pub(super) abandoned: Load,
    pub(super) store: Store,
}

impl Slot {
    fn idle(&self) -> bool {
        !self.has_hit && !self.load.active && !self.abandoned.active && !self.store.active
    }
}

/// One table per group, `b` blocks for each positional group.
fn store_tables(layout: &Layout, b: usize) -> Result<Vec<Vec<u32>>, AllocError> {
    let mut tables = with_capacity(layout.len())?;
    for k in layout.kinds() {
        tables.push(with_capacity(if k.is_positional() { b } else { 0 })?);
    }
    Ok(tables)
}

impl Store {
    /// Empties every table and cursor.
    pub(super) fn clear(&mut self) {
        self.tables.iter_mut().for_each(Vec::clear);
        self.cursors = [0; MAX_GROUPS];
    }
}

/// The request table.
#[derive(Clone, Debug)]
pub(super) struct Requests {
    hasher: FixedState,
    index: HashTable<u32>,
    pub(super) slots: Vec<Slot>,
    free: Vec<u32>,
    /// Slots with a pending hit, in `_pending_cpu_hits` insertion order.
    pub(super) hit_order: Vec<u32>,
    /// Slots with an unissued load, in `_reqs_to_load` insertion order.
    pub(super) load_order: Vec<u32>,
}

impl Requests {
    pub(super) fn new(
        max_requests: u32,
        max_blocks: u32,
        layout: &Layout,
        num_cpu_blocks: u32,
    ) -> Result<Self, AllocError> {
        let n = max_requests as usize;
        let b = max_blocks as usize;
        // A hit and a load hold at most `b` blocks per prefix-cacheable group, each a distinct
        // CPU block.
        let hit_b = (b.saturating_mul(layout.cacheable().count())).min(num_cpu_blocks as usize);
        let load = || -> Result<Load, AllocError> {
            Ok(Load {
                active: false,
                event: None,
                gpu: with_capacity(hit_b)?,
                cpu: with_capacity(hit_b)?,
            })
        };
        let mut slots = with_capacity(n)?;
        for _ in 0..n {
            slots.push(Slot {
                id: 0,
                live: false,
                generation: 0,
                stamp: u64::MAX,
                has_hit: false,
                hit: with_capacity(hit_b)?,
                hit_entries: [0; MAX_GROUPS],
                hit_from: [0; MAX_GROUPS],
                hit_computed: 0,
                load: load()?,
                abandoned: load()?,
                store: Store {
                    active: false,
                    tables: store_tables(layout, b)?,
                    cursors: [0; MAX_GROUPS],
                    events: 0,
                    last_event: None,
                    finished: false,
                },
            });
        }
        let mut free = with_capacity(n)?;
        free.extend((0..max_requests).rev());
        Ok(Requests {
            hasher: FixedState::default(),
            // Twice the live maximum: at most half full, so hashbrown clears tombstones in
            // place instead of growing.
            index: table(n.saturating_mul(2))?,
            slots,
            free,
            hit_order: with_capacity(n)?,
            load_order: with_capacity(n)?,
        })
    }

    /// The slot of `id`, if tracked.
    pub(super) fn find(&self, id: u64) -> Option<u32> {
        let h = self.hasher.hash_one(id);
        self.index
            .find(h, |&s| self.slots[s as usize].id == id)
            .copied()
    }

    /// True when `id` is tracked or a slot is free for it.
    pub(super) fn has_room_for(&self, id: u64) -> bool {
        self.find(id).is_some() || !self.free.is_empty()
    }

    /// The slot of `id`, taking a free one when it is not tracked.
    pub(super) fn find_or_insert(&mut self, id: u64) -> Option<u32> {
        if let Some(s) = self.find(id) {
            return Some(s);
        }
        let s = self.free.pop()?;
        let slot = &mut self.slots[s as usize];
        slot.id = id;
        slot.live = true;
        let h = self.hasher.hash_one(id);
        let (slots, hasher) = (&self.slots, &self.hasher);
        // Room for 2 · max_requests entries was reserved; at most max_requests are live.
        self.index
            .insert_unique(h, s, |&t| hasher.hash_one(slots[t as usize].id));
        Some(s)
    }

    /// Releases `s` when nothing is left in it.
    pub(super) fn release_if_idle(&mut self, s: u32) {
        let slot = &self.slots[s as usize];
        if !slot.live || !slot.idle() {
            return;
        }
        let id = slot.id;
        let h = self.hasher.hash_one(id);
        if let Ok(e) = self.index.find_entry(h, |&t| t == s) {
            e.remove();
        }
        let slot = &mut self.slots[s as usize];
        slot.live = false;
        slot.generation = slot.generation.wrapping_add(1);
        slot.store.last_event = None;
        self.free.push(s);
    }

    /// Removes `s` from an order list.
    pub(super) fn unlist(list: &mut Vec<u32>, s: u32) {
        if let Some(p) = list.iter().position(|&t| t == s) {
            list.remove(p);
        }
    }

    /// Live slots, in slot order.
    pub(super) fn live(&self) -> impl Iterator<Item = (u32, &Slot)> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.live)
            .map(|(i, s)| (super::len32(i), s))
    }

    /// Bytes of heap held.
    pub(super) fn heap_bytes(&self) -> usize {
        let v = |x: &Vec<u32>| x.capacity() * 4;
        let per: usize = self
            .slots
            .iter()
            .map(|s| {
                v(&s.hit)
                    + v(&s.load.gpu)
                    + v(&s.load.cpu)
                    + v(&s.abandoned.gpu)
                    + v(&s.abandoned.cpu)
                    + s.store.tables.iter().map(v).sum::<usize>()
                    + s.store.tables.capacity() * size_of::<Vec<u32>>()
            })
            .sum();
        per + self.slots.capacity() * size_of::<Slot>()
            + self.index.allocation_size()
            + (self.free.capacity() + self.hit_order.capacity() + self.load_order.capacity()) * 4
    }
}
