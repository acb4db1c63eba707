//! The lookup (`get_num_new_matched_tokens`) and the load it turns into once the scheduler
//! has allocated GPU blocks (`update_state_after_alloc`).

use super::SimpleScheduler;
use super::error::{AllocStateError, InputError};
use super::gpu::{GpuBlocks, LookupRequest, Tables};
use super::layout::MAX_GROUPS;
use super::requests::Requests;

impl SimpleScheduler {
    /// Group `g`'s part of a load of `external` tokens from `slot`'s pending hit: the entries
    /// taken (`cdiv(external, group block size)`, at most the hit list's) and the table index
    /// of the first (`num_computed_tokens / group block size`).
    fn load_span(&self, slot: &super::requests::Slot, g: u32, external: u64) -> (u64, u64) {
        let gb = u64::from(self.v.group_block_sizes[g as usize]);
        let take = external
            .div_ceil(gb)
            .min(u64::from(slot.hit_entries[g as usize]));
        (take, slot.hit_computed / gb)
    }

    /// vLLM's `get_num_new_matched_tokens`: the tokens the CPU pool can add after the
    /// request's `num_computed_tokens`, and whether they load asynchronously (always, when
    /// there are any).
    ///
    /// First drops the request's earlier pending hit (a retry). Then, unless the request skips
    /// the prefix cache, `num_computed_tokens` is not aligned to the scheduler's block or to
    /// a chunked-local group's chunk, finds the longest hit among the request's hashes after
    /// `num_computed_tokens / hash_block_size`, of at most `num_tokens − 1 −
    /// num_computed_tokens` tokens (the last token is always recomputed), as vLLM's
    /// coordinators do over the groups (see [`GroupKind`](super::GroupKind) for what each kind
    /// needs). A hit ends on a scheduler block, or with fine-grained hits on a hash block
    /// ([`Validated::partial_hash_hits`](super::Validated::partial_hash_hits)). A hit pins its
    /// held blocks
    /// until [`update_state_after_alloc`](Self::update_state_after_alloc),
    /// [`request_finished`](Self::request_finished) or [`reset`](Self::reset).
    ///
    /// # Errors
    /// [`InputError::TooManyBlocks`] for a hit of more than `max_blocks_per_request` blocks
    /// in some group;
    /// [`InputError::TooManyRequests`] when the hit needs a new request slot and none is free.
    /// Nothing changes then.
    pub fn get_num_new_matched_tokens(
        &mut self,
        req: &LookupRequest<'_>,
        num_computed_tokens: u64,
    ) -> Result<(u64, bool), InputError> {
        let hit = self.longest_hit(req, num_computed_tokens);
        if hit
            .entries
            .iter()
            .any(|&e| e > u64::from(self.config.max_blocks_per_request))
        {
            return Err(InputError::TooManyBlocks { req: req.req });
        }
        if hit.tokens > 0 && !self.reqs.has_room_for(req.req) {
            return Err(InputError::TooManyRequests);
        }
        if let Some(s) = self.reqs.find(req.req) {
            self.free_pending_hit(s);
        }
        if hit.tokens == 0 {
            if let Some(s) = self.reqs.find(req.req) {
                self.reqs.release_if_idle(s);
            }
            return Ok((0, false));
        }
        let Some(s) = self.reqs.find_or_insert(req.req) else {
            return Err(InputError::TooManyRequests); // checked above
        };
        let slot = &mut self.reqs.slots[s as usize];
        slot.hit.clear();
        for (g, _) in self.config.layout.cacheable() {
            let g = g as usize;
            // Both at most max_blocks_per_request: checked above.
            slot.hit_from[g] = u32::try_from(hit.from[g]).unwrap_or(u32::MAX);
            slot.hit_entries[g] = u32::try_from(hit.entries[g]).unwrap_or(u32::MAX);
            debug_assert_eq!(
                self.found[g].len() as u64,
                hit.entries[g] - hit.from[g].min(hit.entries[g])
            );
            slot.hit.extend_from_slice(&self.found[g]);
        }
        // Counts stay far below u32::MAX: each pin is held by one of at most 2^24 requests
        // or by a transfer, so touch cannot overflow.
        let r = self.cpu.touch(&slot.hit);
        debug_assert!(r.is_ok());
        slot.has_hit = true;
        slot.hit_computed = num_computed_tokens;
        self.reqs.hit_order.push(s);
        Ok((hit.tokens, true))
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
        slot.hit_entries = [0; MAX_GROUPS];
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
    /// the held entries among the first `cdiv(num_external_tokens, group block size)` of the
    /// group's hit list become loads into that group's table from `num_computed_tokens /
    /// group block size` on (a Mamba state only when those tokens reach it; null padding is
    /// skipped); both sides stay pinned until the load finishes, and the rest of the hit is
    /// released. Without a pending hit nothing is loaded (vLLM logs a warning).
    ///
    /// # Errors
    /// [`AllocStateError`] for a GPU id out of range, no free request slot, external tokens
    /// not a multiple of the hash block size, a table too short for the loaded blocks, or a load already
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
        let hash = u64::from(self.v.hash_block_size);
        let pending = found.filter(|&s| self.reqs.slots[s as usize].has_hit);
        if let (Some(s), true) = (pending, num_external_tokens > 0) {
            if !num_external_tokens.is_multiple_of(hash) {
                return Err(AllocStateError::Unaligned {
                    num_external_tokens,
                });
            }
            let slot = &self.reqs.slots[s as usize];
            for (g, _) in self.config.layout.cacheable() {
                let (take, start) = self.load_span(slot, g, num_external_tokens);
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
        let mut spans = [(0u64, 0u64); MAX_GROUPS];
        for (g, _) in self.config.layout.cacheable() {
            let slot = &self.reqs.slots[s as usize];
            spans[g as usize] = self.load_span(slot, g, num_external_tokens);
        }
        let slot = &mut self.reqs.slots[s as usize];
        slot.load.gpu.clear();
        slot.load.cpu.clear();
        let mut pins = slot.hit.iter();
        for (g, _) in self.config.layout.cacheable() {
            let table = tables.get(g as usize).copied().unwrap_or_default();
            let (take, start) = spans[g as usize];
            for i in u64::from(slot.hit_from[g as usize])..u64::from(slot.hit_entries[g as usize]) {
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
