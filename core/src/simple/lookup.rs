//! The lookup (`get_num_new_matched_tokens`) and the load it turns into once the scheduler
//! has allocated GPU blocks (`update_state_after_alloc`).

use super::SimpleScheduler;
use super::error::{AllocStateError, InputError};
use super::gpu::{GpuBlocks, GroupTables, LookupRequest};
use super::requests::Requests;
use crate::BlockKey;

/// A CPU hit: its length in blocks, and whether it ends with a Mamba state (a hybrid model).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Hit {
    /// Blocks of the hit (each group's blocks cover the same tokens).
    blocks: usize,
    /// The hit ends with a Mamba state (always, for a hybrid hit of at least one block).
    mamba: bool,
}

impl SimpleScheduler {
    /// vLLM's `get_num_new_matched_tokens`: the tokens the CPU pool can add after the
    /// request's `num_computed_tokens`, and whether they load asynchronously (always, when
    /// there are any).
    ///
    /// First drops the request's earlier pending hit (a retry). Then, unless the request skips
    /// the prefix cache or `num_computed_tokens` is not block-aligned, walks the request's
    /// remaining hashes while the CPU pool holds them, at most `(num_tokens − 1 −
    /// num_computed_tokens) / block_size` blocks (the last token is always recomputed). In a
    /// hybrid model the hit then ends at the last of those blocks whose Mamba state the pool
    /// holds too (none: no hit), as vLLM's hybrid coordinator reconciles a full-attention hit
    /// with a Mamba group's. A hit pins its blocks (the Mamba state's too) until
    /// [`update_state_after_alloc`](Self::update_state_after_alloc),
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
        if hit.blocks > self.config.max_blocks_per_request as usize {
            return Err(InputError::TooManyBlocks { req: req.req });
        }
        if hit.blocks > 0 && !self.reqs.has_room_for(req.req) {
            return Err(InputError::TooManyRequests);
        }
        if let Some(s) = self.reqs.find(req.req) {
            self.free_pending_hit(s);
        }
        if hit.blocks == 0 {
            if let Some(s) = self.reqs.find(req.req) {
                self.reqs.release_if_idle(s);
            }
            return Ok((0, false));
        }
        let Some(s) = self.reqs.find_or_insert(req.req) else {
            return Err(InputError::TooManyRequests); // checked above
        };
        let skipped = usize::try_from(num_computed_tokens / bs).unwrap_or(usize::MAX);
        let hashes = req
            .block_hashes
            .get(skipped..skipped.saturating_add(hit.blocks))
            .unwrap_or_default();
        let (attention, mamba) = (self.config.attention_group, self.config.mamba_group);
        let slot = &mut self.reqs.slots[s as usize];
        slot.hit.clear();
        for &h in hashes {
            if let Some(b) = self.cpu.get_one_block(&BlockKey::new(h, attention)) {
                slot.hit.push(b);
            }
        }
        slot.hit_mamba = false;
        let state = match (hit.mamba, mamba, hashes.last()) {
            (true, Some(m), Some(&h)) => self.cpu.get_one_block(&BlockKey::new(h, m)),
            _ => None,
        };
        if let Some(b) = state {
            slot.hit.push(b);
            slot.hit_mamba = true;
        }
        // Counts stay far below u32::MAX: each pin is held by one of at most 2^24 requests
        // or by a transfer, so touch cannot overflow.
        let r = self.cpu.touch(&slot.hit);
        debug_assert!(r.is_ok());
        slot.has_hit = true;
        slot.hit_computed = num_computed_tokens;
        self.reqs.hit_order.push(s);
        Ok((hit.blocks as u64 * bs, true))
    }

    /// The leading remaining hashes the CPU pool holds, within vLLM's cap; in a hybrid model
    /// cut back to the last one whose Mamba state it holds (vLLM's `MambaManager` scans
    /// right to left within the attention hit; one pass suffices for one attention and one
    /// Mamba group).
    fn longest_hit(&self, req: &LookupRequest<'_>, num_computed_tokens: u64) -> Hit {
        let bs = u64::from(self.config.block_size);
        if req.skip_reading_prefix_cache || !num_computed_tokens.is_multiple_of(bs) {
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
        let cap = usize::try_from(max_hit_len / bs).unwrap_or(usize::MAX);
        let attention = self.config.attention_group;
        let blocks = remaining
            .iter()
            .take(cap)
            .take_while(|&&h| {
                self.cpu
                    .get_one_block(&BlockKey::new(h, attention))
                    .is_some()
            })
            .count();
        let Some(m) = self.config.mamba_group else {
            return Hit {
                blocks,
                mamba: false,
            };
        };
        let held = remaining[..blocks]
            .iter()
            .rposition(|&h| self.cpu.get_one_block(&BlockKey::new(h, m)).is_some());
        Hit {
            blocks: held.map_or(0, |i| i + 1),
            mamba: held.is_some(),
        }
    }

    /// The Mamba group comes before the attention group in vLLM's group order.
    fn mamba_first(&self) -> bool {
        self.config
            .mamba_group
            .is_some_and(|m| m < self.config.attention_group)
    }

    /// Releases slot `s`'s pending hit, if any (`_free_pending_cpu_hit`: the blocks in group
    /// order).
    pub(super) fn free_pending_hit(&mut self, s: u32) {
        let mamba_first = self.mamba_first();
        let slot = &mut self.reqs.slots[s as usize];
        if !slot.has_hit {
            return;
        }
        slot.has_hit = false;
        let split = slot.hit.len() - usize::from(slot.hit_mamba);
        let (attention, mamba) = slot.hit.split_at(split);
        let r = if mamba_first {
            self.cpu
                .free_blocks(mamba)
                .and_then(|()| self.cpu.free_blocks(attention))
        } else {
            self.cpu.free_blocks(&slot.hit)
        };
        debug_assert!(r.is_ok(), "the hit's pins are the scheduler's own");
        slot.hit.clear();
        slot.hit_mamba = false;
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
        let tables = GroupTables {
            attention: block_ids,
            mamba: &[],
        };
        self.update_state_after_alloc_groups(gpu, req, tables, num_external_tokens)
    }

    /// vLLM's `update_state_after_alloc`: with `tables` the request's GPU block tables after
    /// allocation (the Mamba group's empty in a dense model) and `num_external_tokens` the
    /// tokens the scheduler took from the pending hit.
    ///
    /// In eager mode a request seen for the first time gets its store state. Then the pending
    /// hit is consumed: with no external tokens it is released; otherwise its first
    /// `cdiv(num_external_tokens, block_size)` attention blocks become a load into the
    /// attention table's blocks from `num_computed_tokens / block_size` on, and a hybrid
    /// hit's Mamba state, when those tokens reach it, a load into the Mamba table's block at
    /// the hit's last position (group order: vLLM lists each group's loads in turn); both
    /// sides stay pinned until the load finishes, and the rest of the hit is released.
    /// Without a pending hit nothing is loaded (vLLM logs a warning).
    ///
    /// # Errors
    /// [`AllocStateError`] for a GPU id out of range, no free request slot, external tokens
    /// not block-aligned, a table too short for the loaded blocks, or a load already
    /// registered for the request (each an assertion in vLLM). Nothing changes then.
    pub fn update_state_after_alloc_groups(
        &mut self,
        gpu: &mut impl GpuBlocks,
        req: u64,
        tables: GroupTables<'_>,
        num_external_tokens: u64,
    ) -> Result<(), AllocStateError> {
        self.check_gpu(gpu, tables.attention)
            .and_then(|()| self.check_gpu(gpu, tables.mamba))
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
        let mut mamba_load = None;
        if let (Some(s), true) = (pending, num_external_tokens > 0) {
            if !num_external_tokens.is_multiple_of(bs) {
                return Err(AllocStateError::Unaligned {
                    num_external_tokens,
                });
            }
            let slot = &self.reqs.slots[s as usize];
            let attention_hit = slot.hit.len() - usize::from(slot.hit_mamba);
            let wanted = usize::try_from(num_external_tokens / bs).unwrap_or(usize::MAX);
            take = wanted.min(attention_hit);
            start = usize::try_from(slot.hit_computed / bs).unwrap_or(usize::MAX);
            if tables.attention.len().saturating_sub(start) < take {
                return Err(AllocStateError::TableTooShort { req });
            }
            if slot.hit_mamba && wanted >= attention_hit {
                let at = start.saturating_add(attention_hit - 1);
                let Some(&g) = tables.mamba.get(at) else {
                    return Err(AllocStateError::TableTooShort { req });
                };
                mamba_load = slot.hit.last().map(|&c| (g, c));
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
        let mamba_first = self.mamba_first();
        let slot = &mut self.reqs.slots[s as usize];
        slot.load.gpu.clear();
        slot.load.cpu.clear();
        let push_mamba = |load: &mut super::requests::Load| {
            if let Some((g, c)) = mamba_load {
                load.gpu.push(g);
                load.cpu.push(c);
            }
        };
        if mamba_first {
            push_mamba(&mut slot.load);
        }
        for (i, &c) in slot.hit.iter().take(take).enumerate() {
            slot.load.gpu.push(tables.attention[start + i]);
            slot.load.cpu.push(c);
        }
        if !mamba_first {
            push_mamba(&mut slot.load);
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
