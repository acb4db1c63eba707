//! The CPU hit search: vLLM's coordinators over the layout's spec groups (one spec group per
//! distinct kind and block size, full attention first), each kind's own search at its block
//! size or, with fine-grained hits, at the hash block size, and vLLM's loop that cuts the
//! candidate until no group cuts it (a single pass for one full-attention and one other spec
//! group).

use alloc::vec::Vec;

use super::SimpleScheduler;
use super::gpu::LookupRequest;
use super::layout::{GroupKind, MAX_GROUPS, SpecGroup};
use crate::BlockKey;
use crate::block_pool::BlockPool;

/// A CPU hit: its length in tokens, and per group where its hit list starts holding blocks
/// (the entries before are vLLM's null padding) and how many entries it has. The held blocks
/// are in the scheduler's `found` lists, group by group.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Hit {
    /// Tokens of the hit.
    pub(super) tokens: u64,
    /// Per group: its first held entry.
    pub(super) from: [u64; MAX_GROUPS],
    /// Per group: entries of its hit list (`cdiv(tokens, group block size)`).
    pub(super) entries: [u64; MAX_GROUPS],
}

/// `cdiv(window − 1, block_size)`: the contiguous blocks a sliding-window hit needs.
fn window_blocks(window: u32, block_size: u64) -> u64 {
    u64::from(window).saturating_sub(1).div_ceil(block_size)
}

/// One lookup's view of the request's remaining hashes and the CPU pool, and the lists the
/// spec groups' answers are recorded in.
struct Search<'a> {
    cpu: &'a BlockPool<BlockKey>,
    remaining: &'a [u64],
    found: &'a mut [Vec<u32>],
    hash: u64,
    align: u64,
    fine: bool,
}

impl Search<'_> {
    /// Every member of `spec` holds the block of remaining hash `idx`: their blocks, by group.
    fn held(&self, spec: SpecGroup, idx: u64) -> Option<[u32; MAX_GROUPS]> {
        let h = *usize::try_from(idx)
            .ok()
            .and_then(|i| self.remaining.get(i))?;
        let mut out = [0; MAX_GROUPS];
        for g in spec.groups() {
            out[g as usize] = self.cpu.get_one_block(&BlockKey::new(h, g))?;
        }
        Some(out)
    }

    /// Appends `blocks` to the members' lists (past a list's reserve the entry is dropped: the
    /// hit is then longer than `max_blocks_per_request` and refused).
    fn put(&mut self, spec: SpecGroup, blocks: &[u32; MAX_GROUPS]) {
        for g in spec.groups() {
            let list = &mut self.found[g as usize];
            if list.len() < list.capacity() {
                list.push(blocks[g as usize]);
            }
        }
    }

    fn each(&mut self, spec: SpecGroup, f: impl Fn(&mut Vec<u32>)) {
        for g in spec.groups() {
            f(&mut self.found[g as usize]);
        }
    }

    /// One spec group's answer at or below `max` tokens: (tokens, first held entry), its
    /// held blocks recorded; with `drop`, EAGLE's last block (or hash block) dropped.
    fn find(&mut self, spec: SpecGroup, max: u64, drop: bool) -> (u64, u64) {
        self.each(spec, Vec::clear);
        let gb = u64::from(spec.block);
        // The view at the group's block size: block `i` is keyed by hash `(i + 1)·s − 1`.
        let s = gb / self.hash;
        let key = |i: u64| (i + 1) * s - 1;
        let view = self.remaining.len() as u64 / s;
        let max_blocks = (max / gb).min(view);
        let align = self.align;
        let aligned = |blocks: u64| blocks.saturating_mul(gb).is_multiple_of(align);
        match spec.kind {
            GroupKind::FullAttention | GroupKind::Scratch => {
                let mut n = 0;
                while n < max_blocks {
                    let Some(b) = self.held(spec, key(n)) else {
                        break;
                    };
                    self.put(spec, &b);
                    n += 1;
                }
                let mut hit = n.saturating_mul(gb);
                if self.fine && gb > self.hash {
                    // The first block not held whole: its longest held hash boundary.
                    let first = n * s;
                    let last = (first + s - 1)
                        .min(max / self.hash)
                        .min(self.remaining.len() as u64);
                    for fi in (first..last).rev() {
                        if let Some(b) = self.held(spec, fi) {
                            self.put(spec, &b);
                            hit = (fi + 1).saturating_mul(self.hash);
                            break;
                        }
                    }
                }
                if drop && hit > 0 {
                    hit -= self.align.min(gb);
                }
                (hit - hit % self.align, 0)
            }
            GroupKind::SlidingWindow { window } => {
                let need = window_blocks(window, gb) + u64::from(drop);
                let mut run = 0;
                let mut found = None;
                for i in (0..max_blocks).rev() {
                    // The first block of a run must leave an aligned hit (after the drop).
                    if run == 0 && !aligned(if drop { i } else { i + 1 }) {
                        continue;
                    }
                    let Some(b) = self.held(spec, key(i)) else {
                        run = 0;
                        self.each(spec, Vec::clear);
                        continue;
                    };
                    self.put(spec, &b);
                    run += 1;
                    if run >= need {
                        found = Some(i);
                        break;
                    }
                }
                self.each(spec, |l| l.reverse());
                // Entries: `from` null ones, then the held run.
                let (from, mut len) = match found {
                    Some(i) => (i, i + run),
                    None => (0, run),
                };
                let pop = |len: &mut u64, this: &mut Self| {
                    *len -= 1;
                    if *len >= from {
                        this.each(spec, |l| {
                            l.pop();
                        });
                    }
                };
                if found.is_none() {
                    while len > 0 && !aligned(len) {
                        pop(&mut len, self);
                    }
                }
                if drop && len > 0 {
                    pop(&mut len, self);
                    while len > 0 && !aligned(len) {
                        pop(&mut len, self);
                    }
                }
                (len.saturating_mul(gb), from.min(len))
            }
            GroupKind::ChunkedLocal { chunk } => {
                // The configuration makes the block the alignment.
                let chunk = u64::from(chunk);
                let from = (max / chunk * chunk / gb).min(max_blocks);
                let mut len = from;
                while len < max_blocks {
                    let Some(b) = self.held(spec, key(len)) else {
                        break;
                    };
                    self.put(spec, &b);
                    len += 1;
                }
                (len.saturating_mul(gb), from)
            }
            GroupKind::Mamba if self.fine && gb > self.hash => {
                // The last state at any hash boundary.
                let units = (max / self.hash).min(self.remaining.len() as u64);
                for fi in (0..units).rev() {
                    if let Some(b) = self.held(spec, fi) {
                        self.put(spec, &b);
                        return ((fi + 1).saturating_mul(self.hash), fi / s);
                    }
                }
                (0, 0)
            }
            GroupKind::Mamba => {
                for i in (0..max_blocks).rev() {
                    if !aligned(i + 1) {
                        continue;
                    }
                    if let Some(b) = self.held(spec, key(i)) {
                        self.put(spec, &b);
                        return ((i + 1).saturating_mul(gb), i);
                    }
                }
                (0, 0)
            }
        }
    }
}

impl SimpleScheduler {
    /// The request hashes past the computed ones a lookup can read: those of the longest hit
    /// (`num_tokens − 1 − num_computed_tokens` tokens), and in a hybrid layout with EAGLE's
    /// drop, those of the one unit (at most a group block) its groups match past a candidate
    /// before dropping it. A caller that hands
    /// [`get_num_new_matched_tokens`](Self::get_num_new_matched_tokens) the request's hashes
    /// cut after that many past `num_computed_tokens / hash_block_size` gets the answer the
    /// whole list gets. Without the margin an EAGLE group of a prompt that ends on a hash
    /// block could not see its last block, and would drop the one before.
    #[must_use]
    pub fn lookup_hash_count(&self, num_tokens: u64, num_computed_tokens: u64) -> u64 {
        let max_hit_len = num_tokens
            .saturating_sub(1)
            .saturating_sub(num_computed_tokens);
        let layout = self.config.layout;
        let margin = if layout.is_hybrid() && self.v.specs.as_slice().iter().any(|s| s.eagle) {
            self.v
                .specs
                .as_slice()
                .iter()
                .map(|s| u64::from(s.block))
                .max()
                .unwrap_or(0)
        } else {
            0
        };
        max_hit_len.saturating_add(margin) / u64::from(self.v.hash_block_size)
    }

    /// vLLM's `find_longest_cache_hit` for `req` after `num_computed_tokens`, with
    /// `get_num_new_matched_tokens`'s guards (prefix cache skipped, computed tokens not
    /// aligned to the scheduler's block or to a chunked-local group's chunk, nothing left,
    /// the last token always recomputed). The held blocks are left in `self.found`.
    ///
    /// The candidate starts at the cap; each spec group in turn answers the longest hit it
    /// finds at or below it (full attention once, then only capping); the pass repeats until
    /// it cuts nothing, or once only with two spec groups. A chunked-local group whose chunk
    /// is not a multiple of the block may answer less when asked again at its own answer;
    /// vLLM's single pass keeps the first answer, and so does this. Every hit is a multiple of
    /// the alignment: the hash block with fine-grained hits, else the scheduler's block.
    pub(super) fn longest_hit(&mut self, req: &LookupRequest<'_>, num_computed_tokens: u64) -> Hit {
        let bs = u64::from(self.config.block_size);
        let layout = self.config.layout;
        for l in &mut self.found {
            l.clear();
        }
        if req.skip_reading_prefix_cache || !num_computed_tokens.is_multiple_of(bs) {
            return Hit::default();
        }
        // Suffix-relative chunk boundaries must be the absolute ones.
        let misaligned = |k: &GroupKind| match *k {
            GroupKind::ChunkedLocal { chunk } => {
                !num_computed_tokens.is_multiple_of(u64::from(chunk))
            }
            _ => false,
        };
        if layout.kinds().iter().any(misaligned) {
            return Hit::default();
        }
        let hash = u64::from(self.v.hash_block_size);
        let skipped = usize::try_from(num_computed_tokens / hash).unwrap_or(usize::MAX);
        let remaining = req.block_hashes.get(skipped..).unwrap_or_default();
        if remaining.is_empty() {
            return Hit::default();
        }
        let Some(max_hit_len) = req
            .num_tokens
            .checked_sub(1)
            .and_then(|t| t.checked_sub(num_computed_tokens))
            .filter(|&m| m > 0)
        else {
            return Hit::default();
        };
        let fine = self.v.partial_hash_hits;
        let specs = self.v.specs;
        let specs = specs.as_slice();
        let mut search = Search {
            cpu: &self.cpu,
            remaining,
            found: &mut self.found,
            hash,
            align: if fine { hash } else { bs },
            fine,
        };
        let single_pass = specs.len() == 2;
        let mut from = [0u64; MAX_GROUPS];
        let mut attention = [None::<u64>; MAX_GROUPS];
        // Spec groups whose EAGLE drop holds at the current candidate (one bit each).
        let mut verified = 0u8;
        let all_hashes = (remaining.len() as u64).saturating_mul(hash);
        let mut hit = max_hit_len;
        loop {
            let mut curr = hit;
            for (si, &spec) in specs.iter().enumerate() {
                if let Some(a) = attention[si] {
                    curr = curr.min(a);
                    continue;
                }
                let drop = spec.eagle && verified & (1 << si) == 0;
                let mut max = curr;
                // vLLM's unitary coordinator (one group) asks its manager with no margin.
                if drop && spec.kind != GroupKind::Mamba && layout.is_hybrid() {
                    // EAGLE matches one drop unit past the candidate, then drops it.
                    let gb = u64::from(spec.block);
                    let fine_kind = matches!(spec.kind, GroupKind::FullAttention);
                    let margin = if fine && fine_kind && gb > hash {
                        hash
                    } else {
                        gb
                    };
                    max = curr.saturating_add(margin).min(all_hashes);
                }
                let (len, first) = search.find(spec, max, drop);
                if drop {
                    verified |= 1 << si;
                } else if len < curr {
                    verified = 0;
                }
                if spec.kind == GroupKind::FullAttention {
                    attention[si] = Some(len);
                }
                from[si] = first;
                curr = len;
            }
            if curr >= hit {
                break;
            }
            hit = curr;
            if single_pass {
                break;
            }
        }
        let mut out = Hit {
            tokens: hit,
            ..Hit::default()
        };
        for (si, spec) in specs.iter().enumerate() {
            let entries = hit.div_ceil(u64::from(spec.block));
            for g in spec.groups() {
                out.from[g as usize] = from[si];
                out.entries[g as usize] = entries;
                if spec.kind == GroupKind::FullAttention {
                    let keep = usize::try_from(entries).unwrap_or(usize::MAX);
                    self.found[g as usize].truncate(keep);
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    //! EAGLE's margin past the cap: numbers derived by hand from vLLM 0.33.0's hybrid
    //! coordinator and managers.

    use alloc::vec::Vec;

    use crate::BlockKey;
    use crate::block_pool::{BlockPool, BlockPoolConfig};
    use crate::simple::{
        GroupKind, Handoff, Layout, LookupRequest, SimpleConfig, SimpleScheduler, StepInput,
        WorkerOutput,
    };

    /// The hash block (and attention block); Mamba blocks are four of them.
    const H: u32 = 16;

    /// Full attention of 16-token blocks beside Mamba of 64, hashed every 16 tokens (eager:
    /// fine-grained hits), every group EAGLE's.
    fn eagle_hybrid() -> SimpleScheduler {
        let mut c = SimpleConfig::with_cpu_blocks(4 * H, 64, 16);
        c.hash_block_size = Some(H);
        c.layout = Layout::new(&[GroupKind::FullAttention, GroupKind::Mamba])
            .and_then(|l| l.with_block_size(0, H))
            .and_then(|l| l.with_block_size(1, 4 * H))
            .unwrap();
        c.use_eagle_block_drop = true;
        SimpleScheduler::new(c).unwrap()
    }

    /// Stores GPU blocks cached under `keys` in the CPU pool (one request's hand-offs).
    fn store(s: &mut SimpleScheduler, keys: &[BlockKey]) {
        let mut g = BlockPool::new(BlockPoolConfig::new(32, true)).unwrap();
        let mut ids = Vec::new();
        for k in keys {
            g.get_new_blocks(1, |b| ids.push(b)).unwrap();
            let b = *ids.last().unwrap();
            g.cache_full_blocks(&[b], &[*k], 0, 1, H, None).unwrap();
        }
        s.update_state_after_alloc(&mut g, 1, &[], 0).unwrap();
        let h = [Handoff {
            req: 1,
            gpu_blocks: &ids,
        }];
        let step = StepInput {
            handoffs: &h,
            ..Default::default()
        };
        let e = s.build_connector_meta(&mut g, &step).unwrap().store_event;
        let done = [(e.unwrap(), 1)];
        let out = WorkerOutput {
            finished_recving: &[],
            completed_stores: &done,
        };
        s.update_connector_output(&mut g, &out).unwrap();
    }

    fn lookup(req: u64, block_hashes: &[u64], num_tokens: u64) -> LookupRequest<'_> {
        LookupRequest {
            req,
            block_hashes,
            num_tokens,
            skip_reading_prefix_cache: false,
        }
    }

    #[test]
    fn a_prompt_on_a_hash_boundary_lets_eagle_see_its_last_block() {
        let mut s = eagle_hybrid();
        // Attention holds all four hash blocks of a 64-token prompt; Mamba the state at 48.
        let keys = [1, 2, 3, 4].map(|h| BlockKey::new(h, 0));
        store(
            &mut s,
            &[keys[0], keys[1], keys[2], keys[3], BlockKey::new(3, 1)],
        );
        let hashes = [1, 2, 3, 4];
        // The cap is 63 tokens; attention looks one hash block past it (64, all four
        // hashes), finds 64 and drops 16; Mamba's last state at or below 48 is at 48.
        assert_eq!(
            s.get_num_new_matched_tokens(&lookup(7, &hashes, 64), 0),
            Ok((48, true))
        );
        // A caller may cut the hashes where the core says a lookup stops reading.
        let n = s.lookup_hash_count(64, 0);
        assert!(n >= 4, "{n}");
        let cut = &hashes[..hashes.len().min(usize::try_from(n).unwrap_or(usize::MAX))];
        assert_eq!(
            s.get_num_new_matched_tokens(&lookup(8, cut, 64), 0),
            Ok((48, true))
        );
        // Cut at the cap (three hashes: 48 tokens), attention would find 48, drop to 32, and
        // Mamba hold no state at or below it.
        assert_eq!(
            s.get_num_new_matched_tokens(&lookup(9, &hashes[..3], 64), 0),
            Ok((0, false))
        );
    }

    #[test]
    fn the_hashes_a_lookup_reads_stop_at_the_cap_without_eagle_or_a_second_group() {
        let s = eagle_hybrid();
        // 63 tokens after 16 computed: 46 tokens of hit, plus a Mamba block of margin.
        assert_eq!(s.lookup_hash_count(63, 16), (46 + 64) / 16);
        assert_eq!(s.lookup_hash_count(0, 16), 64 / 16);
        let mut c = SimpleConfig::with_cpu_blocks(H, 64, 16);
        c.use_eagle_block_drop = true;
        // One group: vLLM's unitary coordinator asks with no margin.
        let dense = SimpleScheduler::new(c).unwrap();
        assert_eq!(dense.lookup_hash_count(64, 0), 63 / 16);
        assert_eq!(dense.lookup_hash_count(0, 0), 0);
    }
}
