//! The lookup (`get_num_new_matched_tokens`) and the load it turns into once the scheduler
//! has allocated GPU blocks (`update_state_after_alloc`).

use super::SimpleScheduler;
use super::error::{AllocStateError, InputError};
use super::gpu::{GpuBlocks, LookupRequest, Tables};
use super::requests::Requests;
use crate::BlockKey;

impl SimpleScheduler {
    /// vLLM's `get_num_new_matched_tokens`: the tokens the CPU pool can add after the
    /// request's `num_computed_tokens`, and whether they load asynchronously (always, when
    /// there are any).
    ///
    /// First drops the request's earlier pending hit (a retry). Then, unless the request skips
    /// the prefix cache, `num_computed_tokens` is not block-aligned, or not aligned to a
    /// chunked-local group's chunk, finds the longest hit among the request's remaining
    /// hashes of at most `(num_tokens − 1 − num_computed_tokens) / block_size` blocks (the
    /// last token is always recomputed) as vLLM's coordinators do over the groups (see
    /// [`GroupKind`](super::GroupKind) for what each kind needs). A hit pins its held blocks
    /// until [`update_state_after_alloc`](Self::update_state_after_alloc),
    /// [`request_finished`](Self::request_finished) or [`reset`](Self::reset).
    ///
    /// # Errors
    /// [`InputError::TooManyBlocks`] for a hit longer than `max_blocks_per_request`;
    /// [`InputError::TooManyRequests`] when the hit needs a new request slot and none is free.
    /// Nothing changes then.
    pub fn get_num_new_matched_tokens(
        &mut self,
        req: &LookupRequest<'_>,
        num_computed_tokens: u64,
    ) -> Result<(u64, bool), InputError> {
        let bs = u64::from(self.config.block_size);
        let hit = self.longest_hit(req, num_computed_tokens);
        let blocks = hit.blocks;
        if blocks > u64::from(self.config.max_blocks_per_request) {
            return Err(InputError::TooManyBlocks { req: req.req });
        }
        if blocks > 0 && !self.reqs.has_room_for(req.req) {
            return Err(InputError::TooManyRequests);
        }
        if let Some(s) = self.reqs.find(req.req) {
            self.free_pending_hit(s);
        }
        if blocks == 0 {
            if let Some(s) = self.reqs.find(req.req) {
                self.reqs.release_if_idle(s);
            }
            return Ok((0, false));
        }
        let Some(s) = self.reqs.find_or_insert(req.req) else {
            return Err(InputError::TooManyRequests); // checked above
        };
        let skipped = usize::try_from(num_computed_tokens / bs).unwrap_or(usize::MAX);
        let remaining = req.block_hashes.get(skipped..).unwrap_or_default();
        let slot = &mut self.reqs.slots[s as usize];
        slot.hit.clear();
        let idx = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        for (g, _) in self.config.layout.cacheable() {
            let from = hit.from[g as usize];
            // At most `blocks`, itself below max_blocks_per_request: fits u32.
            slot.hit_from[g as usize] = u32::try_from(from).unwrap_or(u32::MAX);
            for &h in remaining.get(idx(from)..idx(blocks)).unwrap_or_default() {
                // Held: the search checked every one of these keys.
                if let Some(b) = self.cpu.get_one_block(&BlockKey::new(h, g)) {
                    slot.hit.push(b);
                }
            }
        }
        // Counts stay far below u32::MAX: each pin is held by one of at most 2^24 requests
        // or by a transfer, so touch cannot overflow.
        let r = self.cpu.touch(&slot.hit);
        debug_assert!(r.is_ok());
        slot.has_hit = true;
        // At most max_blocks_per_request: checked above.
        slot.hit_blocks = u32::try_from(blocks).unwrap_or(u32::MAX);
        slot.hit_computed = num_computed_tokens;
        self.reqs.hit_order.push(s);
        Ok((blocks * bs, true))
    }

    /// Releases slot `s`'s pending hit, if any (`_free_pending_cpu_hit`: the blocks in group
    /// order).
    pub(super) fn free_pending_hit(&mut self, s: u32) {
        let slot = &mut self.reqs.slots[s as usize];
        if !slot.has_hit {
            return;
        }
        slot.has_hit = false;
        let r = self.cpu.free_blocks(&slot.hit);
        debug_assert!(r.is_ok(), "the hit's pins are the scheduler's own");
        slot.hit.clear();
        slot.hit_blocks = 0;
        Requests::unlist(&mut self.reqs.hit_order, s);
    }

    /// vLLM's `update_state_after_alloc` for a dense model: with `block_ids` the request's
    /// GPU block table after allocation and `num_external_tokens` the tokens the scheduler
    /// took from the pending hit. See
    /// [`update_state_after_alloc_groups`](Self::update_state_after_alloc_groups).
    ///
    /// # Errors
    /// As [`update_state_after_alloc_groups`](Self::update_state_after_alloc_groups).
    pub fn update_state_after_alloc(
        &mut self,
        gpu: &mut impl GpuBlocks,
        req: u64,
        block_ids: &[u32],
        num_external_tokens: u64,
    ) -> Result<(), AllocStateError> {
        self.update_state_after_alloc_groups(gpu, req, &[block_ids], num_external_tokens)
    }

    /// vLLM's `update_state_after_alloc`: with `tables` the request's GPU block tables after
    /// allocation, one per group, and `num_external_tokens` the tokens the scheduler took
    /// from the pending hit.
    ///
    /// In eager mode a request seen for the first time gets its store state. Then the pending
    /// hit is consumed: with no external tokens it is released; otherwise, group after group,
    /// the held entries among the first `cdiv(num_external_tokens, block_size)` of the
    /// group's hit list become loads into that group's table from `num_computed_tokens /
    /// block_size` on (a Mamba state only when those tokens reach it; null padding is
    /// skipped); both sides stay pinned until the load finishes, and the rest of the hit is
    /// released. Without a pending hit nothing is loaded (vLLM logs a warning).
    ///
    /// # Errors
    /// [`AllocStateError`] for a GPU id out of range, no free request slot, external tokens
    /// not block-aligned, a table too short for the loaded blocks, or a load already
    /// registered for the request (each an assertion in vLLM). Nothing changes then.
    pub fn update_state_after_alloc_groups(
        &mut self,
        gpu: &mut impl GpuBlocks,
        req: u64,
        tables: Tables<'_>,
        num_external_tokens: u64,
    ) -> Result<(), AllocStateError> {
        for t in tables {
            self.check_gpu(gpu, t).map_err(AllocStateError::Input)?;
        }
        let eager = !self.config.lazy_offload;
        let found = self.reqs.find(req);
        let has_store = found.is_some_and(|s| self.reqs.slots[s as usize].store.active);
        if eager && !has_store && !self.reqs.has_room_for(req) {
            return Err(AllocStateError::Input(InputError::TooManyRequests));
        }
        let bs = u64::from(self.config.block_size);
        let pending = found.filter(|&s| self.reqs.slots[s as usize].has_hit);
        let mut take = 0u64;
        let mut start = 0u64;
        if let (Some(s), true) = (pending, num_external_tokens > 0) {
            if !num_external_tokens.is_multiple_of(bs) {
                return Err(AllocStateError::Unaligned {
                    num_external_tokens,
                });
            }
            let slot = &self.reqs.slots[s as usize];
            take = (num_external_tokens / bs).min(u64::from(slot.hit_blocks));
            start = slot.hit_computed / bs;
            for (g, _) in self.config.layout.cacheable() {
                let held = u64::from(slot.hit_from[g as usize]);
                let table = tables.get(g as usize).copied().unwrap_or_default();
                if take > held && (table.len() as u64) < start.saturating_add(take) {
                    return Err(AllocStateError::TableTooShort { req });
                }
            }
            if slot.load.active {
                return Err(AllocStateError::LoadPending { req });
            }
        }
        if eager && !has_store {
            let Some(s) = self.reqs.find_or_insert(req) else {
                return Err(AllocStateError::Input(InputError::TooManyRequests));
            };
            let st = &mut self.reqs.slots[s as usize].store;
            st.active = true;
            st.clear();
            st.events = 0;
            st.last_event = None;
            st.finished = false;
        }
        let Some(s) = pending else {
            return Ok(());
        };
        if num_external_tokens == 0 {
            self.free_pending_hit(s);
            self.reqs.release_if_idle(s);
            return Ok(());
        }
        let slot = &mut self.reqs.slots[s as usize];
        slot.load.gpu.clear();
        slot.load.cpu.clear();
        let len = u64::from(slot.hit_blocks);
        let mut pins = slot.hit.iter();
        for (g, _) in self.config.layout.cacheable() {
            let table = tables.get(g as usize).copied().unwrap_or_default();
            for i in u64::from(slot.hit_from[g as usize])..len {
                let Some(&c) = pins.next() else { break };
                if i < take {
                    // Within the table: checked above.
                    let at = usize::try_from(start + i).unwrap_or(usize::MAX);
                    slot.load.gpu.push(table.get(at).copied().unwrap_or(0));
                    slot.load.cpu.push(c);
                }
            }
        }
        let r = self.cpu.touch(&slot.load.cpu);
        debug_assert!(r.is_ok());
        slot.load.active = true;
        slot.load.event = None;
        self.free_pending_hit(s);
        let slot = &self.reqs.slots[s as usize];
        gpu.touch(&slot.load.gpu);
        self.reqs.load_order.push(s);
        Ok(())
    }
}
