//! The lookup (`get_num_new_matched_tokens`) and the load it turns into once the scheduler
//! has allocated GPU blocks (`update_state_after_alloc`).

use super::SimpleScheduler;
use super::error::{AllocStateError, InputError};
use super::gpu::{GpuBlocks, LookupRequest};
use super::requests::Requests;
use crate::BlockKey;

impl SimpleScheduler {
    /// vLLM's `get_num_new_matched_tokens`: the tokens the CPU pool can add after the
    /// request's `num_computed_tokens`, and whether they load asynchronously (always, when
    /// there are any).
    ///
    /// First drops the request's earlier pending hit (a retry). Then, unless the request skips
    /// the prefix cache or `num_computed_tokens` is not block-aligned, walks the request's
    /// remaining hashes while the CPU pool holds them, at most `(num_tokens − 1 −
    /// num_computed_tokens) / block_size` blocks (the last token is always recomputed). A hit
    /// pins its blocks until [`update_state_after_alloc`](Self::update_state_after_alloc),
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
        let hit_blocks = self.longest_hit(req, num_computed_tokens);
        if hit_blocks > self.config.max_blocks_per_request as usize {
            return Err(InputError::TooManyBlocks { req: req.req });
        }
        if hit_blocks > 0 && !self.reqs.has_room_for(req.req) {
            return Err(InputError::TooManyRequests);
        }
        if let Some(s) = self.reqs.find(req.req) {
            self.free_pending_hit(s);
        }
        if hit_blocks == 0 {
            if let Some(s) = self.reqs.find(req.req) {
                self.reqs.release_if_idle(s);
            }
            return Ok((0, false));
        }
        let Some(s) = self.reqs.find_or_insert(req.req) else {
            return Err(InputError::TooManyRequests); // checked above
        };
        let skipped = usize::try_from(num_computed_tokens / bs).unwrap_or(usize::MAX);
        let slot = &mut self.reqs.slots[s as usize];
        slot.hit.clear();
        let hashes = req
            .block_hashes
            .get(skipped..skipped.saturating_add(hit_blocks))
            .unwrap_or_default();
        for &h in hashes {
            if let Some(b) = self.cpu.get_one_block(&BlockKey::new(h, 0)) {
                slot.hit.push(b);
            }
        }
        // Counts stay far below u32::MAX: each pin is held by one of at most 2^24 requests
        // or by a transfer, so touch cannot overflow.
        let r = self.cpu.touch(&slot.hit);
        debug_assert!(r.is_ok());
        slot.has_hit = true;
        slot.hit_computed = num_computed_tokens;
        self.reqs.hit_order.push(s);
        Ok((hit_blocks as u64 * bs, true))
    }

    /// The number of leading remaining hashes the CPU pool holds, within vLLM's cap.
    fn longest_hit(&self, req: &LookupRequest<'_>, num_computed_tokens: u64) -> usize {
        let bs = u64::from(self.config.block_size);
        if req.skip_reading_prefix_cache || !num_computed_tokens.is_multiple_of(bs) {
            return 0;
        }
        let skipped = usize::try_from(num_computed_tokens / bs).unwrap_or(usize::MAX);
        let remaining = req.block_hashes.get(skipped..).unwrap_or_default();
        if remaining.is_empty() {
            return 0;
        }
        let Some(max_hit_len) = req
            .num_tokens
            .checked_sub(1)
            .and_then(|t| t.checked_sub(num_computed_tokens))
            .filter(|&m| m > 0)
        else {
            return 0;
        };
        let cap = usize::try_from(max_hit_len / bs).unwrap_or(usize::MAX);
        remaining
            .iter()
            .take(cap)
            .take_while(|&&h| self.cpu.get_one_block(&BlockKey::new(h, 0)).is_some())
            .count()
    }

    /// Releases slot `s`'s pending hit, if any (`_free_pending_cpu_hit`).
    pub(super) fn free_pending_hit(&mut self, s: u32) {
        let slot = &mut self.reqs.slots[s as usize];
        if !slot.has_hit {
            return;
        }
        slot.has_hit = false;
        let r = self.cpu.free_blocks(&slot.hit);
        debug_assert!(r.is_ok(), "the hit's pins are the scheduler's own");
        slot.hit.clear();
        Requests::unlist(&mut self.reqs.hit_order, s);
    }

    /// vLLM's `update_state_after_alloc`: with `block_ids` the request's GPU block table
    /// (group 0) after allocation and `num_external_tokens` the tokens the scheduler took from
    /// the pending hit.
    ///
    /// In eager mode a request seen for the first time gets its store state. Then the pending
    /// hit is consumed: with no external tokens it is released; otherwise its first
    /// `cdiv(num_external_tokens, block_size)` blocks become a load into the table's blocks
    /// from `num_computed_tokens / block_size` on (both sides pinned until the load
    /// finishes), and the rest of the hit is released. Without a pending hit nothing is
    /// loaded (vLLM logs a warning).
    ///
    /// # Errors
    /// [`AllocStateError`] for a GPU id out of range, no free request slot, external tokens
    /// not block-aligned, a table too short for the loaded blocks, or a load already
    /// registered for the request (each an assertion in vLLM). Nothing changes then.
    pub fn update_state_after_alloc(
        &mut self,
        gpu: &mut impl GpuBlocks,
        req: u64,
        block_ids: &[u32],
        num_external_tokens: u64,
    ) -> Result<(), AllocStateError> {
        self.check_gpu(gpu, block_ids)
            .map_err(AllocStateError::Input)?;
        let eager = !self.config.lazy_offload;
        let found = self.reqs.find(req);
        let has_store = found.is_some_and(|s| self.reqs.slots[s as usize].store.active);
        if eager && !has_store && !self.reqs.has_room_for(req) {
            return Err(AllocStateError::Input(InputError::TooManyRequests));
        }
        let bs = u64::from(self.config.block_size);
        let pending = found.filter(|&s| self.reqs.slots[s as usize].has_hit);
        let mut take = 0usize;
        let mut start = 0usize;
        if let (Some(s), true) = (pending, num_external_tokens > 0) {
            if !num_external_tokens.is_multiple_of(bs) {
                return Err(AllocStateError::Unaligned {
                    num_external_tokens,
                });
            }
            let slot = &self.reqs.slots[s as usize];
            take = usize::try_from(num_external_tokens / bs)
                .unwrap_or(usize::MAX)
                .min(slot.hit.len());
            start = usize::try_from(slot.hit_computed / bs).unwrap_or(usize::MAX);
            if block_ids.len().saturating_sub(start) < take {
                return Err(AllocStateError::TableTooShort { req });
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
            st.block_ids.clear();
            st.cursor = 0;
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
        for (i, &c) in slot.hit.iter().take(take).enumerate() {
            slot.load.gpu.push(block_ids[start + i]);
            slot.load.cpu.push(c);
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
