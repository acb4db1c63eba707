//! The model's worker-output, finish, reset and drain paths (`manager.py`'s
//! `update_connector_output`, `request_finished*`, `reset`, `get_stats`).

#![allow(
    clippy::cast_possible_truncation,
    reason = "test model: block counts are small"
)]

use std::collections::BTreeMap;

use kvtier_core::BlockKey;
use kvtier_core::simple::{Finished, SimpleEvent, StoredMeta};

use super::{Gpu, LoadSt, ModelStats, SimpleModel, Transfer, get, pop};

impl SimpleModel {
    /// `update_connector_output`: loads in `recv` order, then `(event, count)` reports.
    pub fn output(&mut self, gpu: &mut Gpu, recv: &[u64], stores: &[(u64, u32)]) {
        for &r in recv {
            let n = self.cleanup_load(gpu, r);
            self.interval_load += n;
        }
        for &(e, c) in stores {
            let total = self.counts.get(&e).copied().unwrap_or(0).saturating_add(c);
            if total >= self.world {
                self.counts.remove(&e);
                self.process(gpu, e);
            } else {
                self.counts.insert(e, total);
            }
        }
    }

    fn process(&mut self, gpu: &mut Gpu, e: u64) {
        let Some(t) = self.events_to_blocks.remove(&e) else {
            if let Some(t) = self.abandoned.remove(&e) {
                self.release(gpu, &t);
            }
            return;
        };
        if !self.lazy {
            for g in &t.gpu {
                self.in_flight.remove(g);
            }
        }
        for (i, (&g, &c)) in t.gpu.iter().zip(&t.cpu).enumerate() {
            let h = gpu
                .block_hash(g)
                .expect("stored GPU blocks keep their hash");
            self.cpu.insert(c, h.key);
            let secondaries: Vec<_> = gpu.secondary_hashes(g).collect();
            for &k in &secondaries {
                self.cpu.insert(c, k);
            }
            if self.events_on {
                let medium = self.medium();
                self.events.push(SimpleEvent::Stored {
                    key: h.key,
                    block_size: self.blocks[h.key.group as usize] as u32,
                    meta: t.meta.get(i).copied().flatten(),
                    medium,
                });
                let bounds = t.bounds.get(i).map_or(&[][..], Vec::as_slice);
                let req = t.meta.get(i).copied().flatten().map(|m| m.req);
                for k in secondaries {
                    let meta = req.and_then(|req| {
                        let &(_, parent_hash, token_start) =
                            bounds.iter().find(|(key, _, _)| *key == k)?;
                        Some(StoredMeta {
                            req,
                            parent_hash,
                            token_start,
                        })
                    });
                    self.events.push(SimpleEvent::Stored {
                        key: k,
                        block_size: if meta.is_some() { self.hash as u32 } else { 0 },
                        meta,
                        medium,
                    });
                }
            }
        }
        self.cpu.free_blocks(&t.cpu);
        gpu.free_blocks(&t.gpu).expect("the scheduler's own pins");
        if !self.lazy {
            for r in self.event_reqs.remove(&e).unwrap_or_default() {
                let Some(st) = get(&mut self.reqs_to_store, r) else {
                    continue;
                };
                st.events.remove(&e);
                if st.finished && st.events.is_empty() {
                    pop(&mut self.reqs_to_store, r);
                }
            }
        }
    }

    fn release(&mut self, gpu: &mut Gpu, t: &Transfer) {
        self.cpu.free_blocks(&t.cpu);
        gpu.free_blocks(&t.gpu).expect("the scheduler's own pins");
    }

    fn cleanup_load(&mut self, gpu: &mut Gpu, r: u64) -> u64 {
        let st: Option<LoadSt> =
            pop(&mut self.reqs_to_load, r).or_else(|| pop(&mut self.abandoned_loads, r));
        let Some(st) = st else {
            return 0;
        };
        self.cpu.free_blocks(&st.cpu);
        gpu.free_blocks(&st.gpu).expect("the scheduler's own pins");
        if st.event.is_some() {
            st.gpu.len() as u64
        } else {
            0
        }
    }

    /// `request_finished`.
    pub fn finished(&mut self, gpu: &mut Gpu, r: u64) {
        if let Some(p) = self.pending_hits.iter().position(|(i, _, _)| *i == r) {
            let (_, groups, _) = self.pending_hits.remove(p);
            self.cpu.free_blocks(&super::pins(&groups));
        }
        if let Some(l) = get(&mut self.reqs_to_load, r)
            && l.event.is_none()
        {
            self.cleanup_load(gpu, r);
        }
        if !self.lazy
            && let Some(st) = get(&mut self.reqs_to_store, r)
        {
            if st.events.is_empty() {
                pop(&mut self.reqs_to_store, r);
            } else {
                st.finished = true;
            }
        }
    }

    /// `request_finished_all_groups`: the confirmed blocks not yet stored, and with
    /// fine-grained hits the prompt's partial full-attention tail, queued as a flush.
    pub fn finished_all(&mut self, gpu: &mut Gpu, f: &Finished<'_>) {
        if let Some(st) = get(&mut self.reqs_to_store, f.req) {
            let stored = st.stored.clone();
            let (mut sel, mut meta, mut bounds, _) =
                self.select(gpu, f.req, f.block_ids, &stored, &f.progress);
            if let Some(tail) = self.partial_tail(gpu, f)
                && !sel.contains(&tail)
                && sel.len() < self.cpu.free.len()
            {
                sel.push(tail);
                meta.push(None);
                bounds.push(Vec::new());
            }
            if !sel.is_empty() {
                let cpu = self.get_new(sel.len());
                self.in_flight.extend(&sel);
                gpu.touch(&sel).expect("in range");
                self.flushes.push(Transfer {
                    gpu: sel,
                    cpu,
                    meta,
                    bounds,
                });
            }
        }
        self.finished(gpu, f.req);
    }

    /// `_find_fa_partial_tail_source`.
    fn partial_tail(&self, gpu: &Gpu, f: &Finished<'_>) -> Option<u32> {
        if !self.fine {
            return None;
        }
        let fa = self
            .kinds
            .iter()
            .position(|&k| k == kvtier_core::simple::GroupKind::FullAttention)?;
        let boundary = f.num_prompt_tokens / self.hash * self.hash;
        let fa_block = self.blocks[fa];
        if boundary == 0
            || boundary > f.progress.num_computed_tokens
            || boundary.is_multiple_of(fa_block)
        {
            return None;
        }
        let b = *f.block_ids.get(fa)?.get((boundary / fa_block) as usize)?;
        if b == 0 || self.in_flight.contains(&b) {
            return None;
        }
        let h = *f
            .progress
            .block_hashes
            .get((boundary / self.hash - 1) as usize)?;
        let key = BlockKey::new(h, fa as u32);
        let holds = gpu.block_hash(b).map(|x| x.key) == Some(key)
            || gpu.secondary_hashes(b).any(|k| k == key);
        (holds && self.cpu.get_one(&key).is_none()).then_some(b)
    }

    /// `reset`.
    pub fn reset(&mut self, gpu: &mut Gpu) -> bool {
        for (_, groups, _) in std::mem::take(&mut self.pending_hits) {
            self.cpu.free_blocks(&super::pins(&groups));
        }
        let live = std::mem::take(&mut self.events_to_blocks);
        self.abandoned.extend(live);
        for t in std::mem::take(&mut self.flushes) {
            self.release(gpu, &t);
        }
        self.in_flight.clear();
        for (r, st) in std::mem::take(&mut self.reqs_to_load) {
            if st.event.is_none() {
                self.cpu.free_blocks(&st.cpu);
                gpu.free_blocks(&st.gpu).expect("the scheduler's own pins");
            } else if let Some(old) = get(&mut self.abandoned_loads, r) {
                *old = st;
            } else {
                self.abandoned_loads.push((r, st));
            }
        }
        self.reqs_to_store.clear();
        self.event_reqs.clear();
        let abandoned = &self.abandoned;
        self.counts.retain(|e, _| abandoned.contains_key(e));
        self.cursor = None;
        for (c, s) in self.current.iter_mut().zip(self.snapshot) {
            *c = c.saturating_sub(s);
        }
        self.snapshot = [0; 7];
        if !self.abandoned.is_empty() || !self.abandoned_loads.is_empty() {
            return false;
        }
        if self.num_cpu as usize - self.cpu.free.len() != 1 {
            return false;
        }
        self.cpu.map = BTreeMap::new();
        self.cpu.hash.iter_mut().for_each(|h| *h = None);
        self.cpu.secondary.iter_mut().for_each(Vec::clear);
        if self.events_on {
            self.events.push(SimpleEvent::AllCleared);
        }
        true
    }

    /// `get_stats`.
    pub fn drain(&mut self) -> ModelStats {
        let outcomes = (0..7)
            .map(|i| {
                let d = self.current[i] - self.snapshot[i];
                (d > 0).then_some(d)
            })
            .collect();
        self.snapshot = self.current;
        let load_blocks = (self.interval_load > 0).then_some(self.interval_load);
        self.interval_load = 0;
        let pending = self
            .events_to_blocks
            .values()
            .chain(&self.flushes)
            .chain(self.abandoned.values())
            .map(|t| t.cpu.len() as i64)
            .sum();
        ModelStats {
            outcomes,
            load_blocks,
            used: i64::from(self.num_cpu) - self.cpu.free.len() as i64,
            pending,
        }
    }

    /// Hand-offs classified since construction or the last reset (`published`).
    pub fn published(&self) -> u64 {
        self.current.iter().sum()
    }

    /// Blocks free on the CPU and not pinned: the invariant "no block both free and pinned"
    /// reads this as an empty list.
    pub fn free_and_pinned(&self) -> Vec<u32> {
        self.cpu
            .free
            .iter()
            .copied()
            .filter(|&b| self.cpu.refs[b as usize] > 0)
            .collect()
    }
}
