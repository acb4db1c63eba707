//! The CPU hit search: vLLM's coordinators over the layout's spec groups (one spec group per
//! distinct [`GroupKind`], full attention first), each kind's own search, and vLLM's loop that
//! cuts the candidate until no group cuts it (a single pass for one full-attention and one
//! other spec group).

use super::SimpleScheduler;
use super::gpu::LookupRequest;
use super::layout::{GroupKind, MAX_GROUPS};
use crate::BlockKey;

/// A CPU hit: its length in blocks, and where each group's hit list starts holding blocks
/// (the entries before are vLLM's null padding).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Hit {
    /// Blocks of the hit; every group's hit list has this many entries.
    pub(super) blocks: u64,
    /// Per group: its first held entry.
    pub(super) from: [u64; MAX_GROUPS],
}

/// `cdiv(window − 1, block_size)`: the contiguous blocks a sliding-window hit needs.
fn window_blocks(window: u32, block_size: u64) -> u64 {
    u64::from(window).saturating_sub(1).div_ceil(block_size)
}

impl SimpleScheduler {
    /// vLLM's `find_longest_cache_hit` for `req` after `num_computed_tokens`, with
    /// `get_num_new_matched_tokens`'s guards (prefix cache skipped, computed tokens not
    /// block- or chunk-aligned, nothing left, the last token always recomputed).
    ///
    /// Spec groups: one per distinct kind among the prefix-cacheable groups (a spec group's
    /// members must all hold a block for it to count), full attention first. The candidate
    /// starts at the cap; each spec group in turn answers the longest hit it finds at or below
    /// it (full attention once, then only capping); the pass repeats until it cuts nothing,
    /// or once only with two spec groups. A chunked-local group whose chunk is not a multiple
    /// of the block may answer less when asked again at its own answer; vLLM's single pass
    /// keeps the first answer, and so does this.
    pub(super) fn longest_hit(&self, req: &LookupRequest<'_>, num_computed_tokens: u64) -> Hit {
        let bs = u64::from(self.config.block_size);
        let layout = self.config.layout;
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
        let skipped = usize::try_from(num_computed_tokens / bs).unwrap_or(usize::MAX);
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
        // The spec groups: distinct kinds, full attention first.
        let mut specs = [GroupKind::Scratch; MAX_GROUPS];
        let mut n = 0;
        let fa_first = layout
            .cacheable()
            .filter(|(_, k)| *k == GroupKind::FullAttention)
            .chain(
                layout
                    .cacheable()
                    .filter(|(_, k)| *k != GroupKind::FullAttention),
            );
        for (_, kind) in fa_first {
            if !specs[..n].contains(&kind) {
                specs[n] = kind;
                n += 1;
            }
        }
        let specs = &specs[..n];
        // Block `i` of the remaining hashes is held by every group of `kind`.
        let held = |i: u64, kind: GroupKind| {
            let Some(&h) = usize::try_from(i).ok().and_then(|i| remaining.get(i)) else {
                return false;
            };
            layout
                .cacheable()
                .filter(|&(_, k)| k == kind)
                .all(|(g, _)| self.cpu.get_one_block(&BlockKey::new(h, g)).is_some())
        };
        // One spec group's answer at or below `max` tokens: (blocks, first held entry).
        let find = |kind: GroupKind, max: u64| -> (u64, u64) {
            let max_blocks = (max / bs).min(remaining.len() as u64);
            match kind {
                GroupKind::FullAttention | GroupKind::Scratch => (
                    (0..max_blocks)
                        .find(|&i| !held(i, kind))
                        .unwrap_or(max_blocks),
                    0,
                ),
                GroupKind::SlidingWindow { window } => {
                    let need = window_blocks(window, bs);
                    let mut run = 0;
                    for i in (0..max_blocks).rev() {
                        if !held(i, kind) {
                            run = 0;
                            continue;
                        }
                        run += 1;
                        if run >= need {
                            return (i + run, i);
                        }
                    }
                    // No whole window: the run from the start, if any.
                    (run, 0)
                }
                GroupKind::ChunkedLocal { chunk } => {
                    let chunk = u64::from(chunk);
                    let from = (max / chunk * chunk / bs).min(max_blocks);
                    let len = (from..max_blocks)
                        .find(|&i| !held(i, kind))
                        .unwrap_or(max_blocks);
                    (len, from)
                }
                GroupKind::Mamba => (0..max_blocks)
                    .rev()
                    .find(|&i| held(i, kind))
                    .map_or((0, 0), |i| (i + 1, i)),
            }
        };
        let single_pass = n == 2;
        let mut from = [0u64; MAX_GROUPS];
        let mut attention: Option<u64> = None;
        let mut hit = max_hit_len;
        loop {
            let mut curr = hit;
            for (si, &kind) in specs.iter().enumerate() {
                if kind == GroupKind::FullAttention
                    && let Some(a) = attention
                {
                    curr = curr.min(a.saturating_mul(bs));
                    continue;
                }
                let (len, first) = find(kind, curr);
                if kind == GroupKind::FullAttention {
                    attention = Some(len);
                }
                from[si] = first;
                curr = len.saturating_mul(bs);
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
            blocks: hit / bs,
            from: [0; MAX_GROUPS],
        };
        for (g, kind) in layout.cacheable() {
            if let Some(si) = specs.iter().position(|&k| k == kind) {
                out.from[g as usize] = from[si];
            }
        }
        out
    }
}
