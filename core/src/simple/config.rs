//! The simple offloader's configuration, the CPU pool's size and lazy mode's `target_free`.

use crate::stats::simple_offload::Backend;

use super::error::ConfigError;
use super::layout::{GroupKind, Layout, MAX_GROUPS, SpecGroups};

/// How the CPU pool's size is chosen (vLLM's `_derive_cpu_config`).
///
/// The byte budget bounds every choice: `local_capacity = num_gpu_blocks · capacity_bytes /
/// gpu_total_bytes` (floor), the blocks the budget holds at the GPU's bytes per block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolSize {
    /// `max(1, local_capacity)`: the pool the byte budget holds.
    FromBytes,
    /// An explicit `num_cpu_blocks`; it must lie in `1..=local_capacity`.
    Explicit(u32),
    /// The count the workers agreed on (the minimum over ranks of what each rank's live
    /// allocation holds; vLLM's `cache_config.simple_cpu_offload_num_blocks`), used as is.
    Aligned(u32),
}

/// The CPU pool's sizing inputs, per rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolSizing {
    /// Bytes this rank may use: the disk capacity in disk mode, otherwise the CPU budget per
    /// rank (see [`per_rank_bytes`]).
    pub capacity_bytes: u64,
    /// Bytes of the GPU's KV cache on this rank (vLLM's `kv_cache_tensors[0].size`).
    pub gpu_total_bytes: u64,
    /// How the count is chosen.
    pub size: PoolSize,
}

/// The server-wide CPU budget split over the ranks: `cpu_bytes_to_use / world_size` (floor),
/// or the explicit `cpu_bytes_to_use_per_rank` when given (vLLM warns when they differ and
/// uses the explicit value). `None` when `world_size == 0`.
#[must_use]
pub const fn per_rank_bytes(
    cpu_bytes_to_use: u64,
    world_size: u32,
    explicit: Option<u64>,
) -> Option<u64> {
    if world_size == 0 {
        return None;
    }
    match explicit {
        Some(b) => Some(b),
        None => Some(cpu_bytes_to_use / world_size as u64),
    }
}

impl PoolSizing {
    /// `floor(num_gpu_blocks · capacity_bytes / gpu_total_bytes)`, exact in 128 bits.
    ///
    /// # Errors
    /// [`ConfigError::ZeroGpuBytes`] when `gpu_total_bytes == 0`.
    pub fn local_capacity(&self, num_gpu_blocks: u32) -> Result<u64, ConfigError> {
        if self.gpu_total_bytes == 0 {
            return Err(ConfigError::ZeroGpuBytes);
        }
        let q = u128::from(num_gpu_blocks) * u128::from(self.capacity_bytes)
            / u128::from(self.gpu_total_bytes);
        Ok(u64::try_from(q).unwrap_or(u64::MAX))
    }

    /// The number of CPU blocks (the null block included), as vLLM chooses it.
    ///
    /// # Errors
    /// [`ConfigError::ZeroGpuBytes`]; [`ConfigError::ExplicitBlocks`] when an explicit count is
    /// 0 or above the local capacity (vLLM's `ValueError`); [`ConfigError::PoolTooLarge`] when
    /// the count does not fit in `u32`; [`ConfigError::ZeroCpuBlocks`] for an aligned count of 0.
    pub fn num_cpu_blocks(&self, num_gpu_blocks: u32) -> Result<u32, ConfigError> {
        let local = self.local_capacity(num_gpu_blocks)?;
        let n = match self.size {
            PoolSize::FromBytes => local.max(1),
            PoolSize::Aligned(0) => return Err(ConfigError::ZeroCpuBlocks),
            PoolSize::Aligned(n) => u64::from(n),
            PoolSize::Explicit(n) => {
                if n == 0 || u64::from(n) > local {
                    return Err(ConfigError::ExplicitBlocks {
                        num_cpu_blocks: n,
                        local_capacity: local,
                    });
                }
                u64::from(n)
            }
        };
        u32::try_from(n).map_err(|_| ConfigError::PoolTooLarge { blocks: n })
    }
}

/// One prefix-cacheable KV-cache group, for lazy mode's `target_free`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupSpec {
    /// Full attention (or any other kind not listed): `cdiv(max_num_batched_tokens, block)`.
    FullAttention {
        /// The group's block size in tokens.
        block_size: u32,
        /// Whether DCP shards its blocks (the block then spans `block_size · dcp` tokens).
        dcp_sharded: bool,
    },
    /// Sliding window: `cdiv(window, block) + 1`.
    SlidingWindow {
        /// The group's block size in tokens.
        block_size: u32,
        /// The window in tokens.
        window: u32,
        /// Whether DCP shards its blocks.
        dcp_sharded: bool,
    },
    /// Mamba: 2.
    Mamba,
}

/// Lazy mode's `target_free`: `2 · Σ_g c_g` over the prefix-cacheable groups, with block sizes
/// resolved for DCP (vLLM's `_estimate_lazy_target_blocks`, watermark ratio 1). `None` when a
/// block size (after DCP) is 0 or the sum overflows.
#[must_use]
pub fn lazy_target_blocks(
    groups: &[GroupSpec],
    max_num_batched_tokens: u32,
    dcp_world_size: u32,
) -> Option<u64> {
    let resolve = |block: u32, sharded: bool| -> Option<u64> {
        let b = u64::from(block).checked_mul(if sharded {
            u64::from(dcp_world_size)
        } else {
            1
        })?;
        (b > 0).then_some(b)
    };
    let mut target = 0u64;
    for g in groups {
        let term = match *g {
            GroupSpec::Mamba => 2,
            GroupSpec::SlidingWindow {
                block_size,
                window,
                dcp_sharded,
            } => u64::from(window).div_ceil(resolve(block_size, dcp_sharded)?) + 1,
            GroupSpec::FullAttention {
                block_size,
                dcp_sharded,
            } => u64::from(max_num_batched_tokens).div_ceil(resolve(block_size, dcp_sharded)?),
        };
        target = target.checked_add(term)?;
    }
    target.checked_mul(2)
}

/// How to build a [`SimpleScheduler`](super::SimpleScheduler): `new(required…)`, then change
/// the public optional fields; [`SimpleScheduler::new`](super::SimpleScheduler::new) validates
/// everything once.
///
/// The model's KV-cache groups are [`layout`](Self::layout): by default one full-attention
/// group whose block size is the scheduler's and the hash block size (a dense model, vLLM's
/// `UnitaryKVCacheCoordinator`); any other [`Layout`] runs as vLLM's `HybridKVCacheCoordinator`,
/// each group with its own block size ([`Layout::with_block_size`]) and fine-grained
/// (hash-block) hits where vLLM allows them ([`Validated::partial_hash_hits`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SimpleConfig {
    /// The scheduler's block size in tokens (vLLM's `scheduler_block_size`: the least common
    /// multiple of the groups' block sizes, DCP-resolved), and every group's unless the
    /// layout says otherwise. Must be > 0.
    pub block_size: u32,
    /// The tokens each request hash covers (vLLM's `hash_block_size`); `None` (default): the
    /// scheduler's block size. It must divide every prefix-cacheable group's block size.
    pub hash_block_size: Option<u32>,
    /// vLLM's `decode_context_parallel_size` (default 1). Block sizes are given already
    /// resolved; this only decides whether a Mamba block equal to the hash block allows
    /// fine-grained hits (it does under DCP).
    pub dcp_world_size: u32,
    /// Blocks in the GPU pool, the null block included (GPU block ids are below it).
    pub num_gpu_blocks: u32,
    /// The CPU pool's sizing.
    pub sizing: PoolSizing,
    /// Lazy offload (default false: eager).
    pub lazy_offload: bool,
    /// `max_num_batched_tokens` (default 2048), for lazy mode's `target_free`.
    pub max_num_batched_tokens: u32,
    /// Lazy mode's `target_free` given outright, e.g. for DCP-sharded groups (see
    /// [`lazy_target_blocks`]); `None` (default): computed from [`layout`](Self::layout) at
    /// `block_size` (a chunked-local group counting as full attention, as in vLLM).
    pub lazy_target_free: Option<u32>,
    /// Workers that must report a store before it completes (vLLM's `world_size`, default 1).
    pub world_size: u32,
    /// `num_prefill_lookahead_tokens` (default 0): in a dense model the last `max(0, n − 1)`
    /// computed tokens are not yet cacheable (see [`Validated::reprefillable`]).
    pub num_prefill_lookahead_tokens: u32,
    /// Where the pool lives (default CPU). Disk reports the STORAGE medium in events and
    /// `backend="disk"` on the info gauge.
    pub backend: Backend,
    /// Disk mode with the OS page cache (reported only with [`Backend::Disk`]).
    pub page_cache: bool,
    /// Record events (vLLM's `enable_kv_cache_events`, default false).
    pub enable_events: bool,
    /// The most events held between two `take_events` calls (default 4096); more are dropped
    /// and counted.
    pub event_capacity: u32,
    /// Requests tracked at once (pending hits, loads, store state; default 256).
    pub max_requests: u32,
    /// Blocks one request's table may hold (default: `num_gpu_blocks`).
    pub max_blocks_per_request: u32,
    /// The model's KV-cache groups (default [`Layout::dense`]).
    pub layout: Layout,
    /// vLLM's `speculative_config.use_eagle_block_drop()` (default false): the EAGLE groups
    /// ([`Layout::with_eagle_group`], all groups when none is marked) match one block past a
    /// hit and drop it, and a hybrid model's eager scan holds their last block back.
    pub use_eagle_block_drop: bool,
    /// Room for secondary hashes in the CPU pool (keys a stored block is reachable under
    /// besides its own: the GPU block's fine-grained prefix boundaries, copied with it);
    /// `None` (default): every CPU block holding one per hash boundary inside its group's
    /// block, `num_cpu_blocks · (largest group block / hash block − 1)`, so none is ever
    /// refused (0 when the hash block is every group's). Keys past the room are not kept and
    /// are counted ([`SimpleScheduler::dropped_secondary_hashes`](super::SimpleScheduler::dropped_secondary_hashes)).
    pub secondary_hashes: Option<u32>,
}

impl SimpleConfig {
    /// Eager mode on the CPU for `block_size`-token blocks, a GPU pool of `num_gpu_blocks` and
    /// the given sizing.
    #[must_use]
    pub const fn new(block_size: u32, num_gpu_blocks: u32, sizing: PoolSizing) -> Self {
        SimpleConfig {
            block_size,
            hash_block_size: None,
            dcp_world_size: 1,
            num_gpu_blocks,
            sizing,
            lazy_offload: false,
            max_num_batched_tokens: 2048,
            lazy_target_free: None,
            world_size: 1,
            num_prefill_lookahead_tokens: 0,
            backend: Backend::Cpu,
            page_cache: false,
            enable_events: false,
            event_capacity: 4096,
            max_requests: 256,
            max_blocks_per_request: num_gpu_blocks,
            layout: Layout::dense(),
            use_eagle_block_drop: false,
            secondary_hashes: None,
        }
    }

    /// A config for a pool of exactly `num_cpu_blocks` blocks (the null block included), as
    /// the workers' aligned count gives it.
    #[must_use]
    pub const fn with_cpu_blocks(
        block_size: u32,
        num_gpu_blocks: u32,
        num_cpu_blocks: u32,
    ) -> Self {
        Self::new(
            block_size,
            num_gpu_blocks,
            PoolSizing {
                capacity_bytes: 0,
                gpu_total_bytes: 1,
                size: PoolSize::Aligned(num_cpu_blocks),
            },
        )
    }

    /// Validates the configuration, giving the facts the scheduler runs on.
    ///
    /// # Errors
    /// The [`ConfigError`] of the first field that is out of range.
    pub fn validate(&self) -> Result<Validated, ConfigError> {
        if self.block_size == 0 {
            return Err(ConfigError::ZeroBlockSize);
        }
        if self.num_gpu_blocks == 0 {
            return Err(ConfigError::ZeroGpuBlocks);
        }
        if self.world_size == 0 {
            return Err(ConfigError::ZeroWorldSize);
        }
        if self.max_requests == 0 || self.max_blocks_per_request == 0 {
            return Err(ConfigError::ZeroBound);
        }
        let geometry = self.geometry()?;
        let num_cpu_blocks = self.sizing.num_cpu_blocks(self.num_gpu_blocks)?;
        let target_free = if !self.lazy_offload {
            0
        } else if let Some(t) = self.lazy_target_free {
            t
        } else {
            let mut groups = [GroupSpec::Mamba; super::layout::MAX_GROUPS];
            let mut n = 0;
            for (g, kind) in self.layout.cacheable() {
                groups[n] = self.lazy_term(g, kind);
                n += 1;
            }
            let t = lazy_target_blocks(&groups[..n], self.max_num_batched_tokens, 1)
                .unwrap_or(u64::MAX);
            u32::try_from(t).unwrap_or(u32::MAX)
        };
        let per_block = geometry.ratio().saturating_sub(1);
        let secondary_capacity = self
            .secondary_hashes
            .unwrap_or_else(|| num_cpu_blocks.saturating_mul(per_block));
        Ok(Validated {
            num_cpu_blocks,
            target_free,
            secondary_capacity,
            hash_block_size: geometry.hash,
            hash_blocks_per_block: geometry.ratio,
            partial_hash_hits: geometry.fine,
            group_block_sizes: geometry.blocks,
            specs: SpecGroups::of(&self.layout, &geometry.blocks, geometry.drop),
            prefill_reprefillable: self.num_prefill_lookahead_tokens.saturating_sub(1),
            // vLLM's hybrid coordinator (several groups) holds no tail back without EAGLE.
            reprefillable: if self.layout.is_hybrid() {
                0
            } else {
                self.num_prefill_lookahead_tokens.saturating_sub(1)
            },
        })
    }
}

/// The block sizes [`SimpleConfig::validate`] checks.
struct Geometry {
    hash: u32,
    blocks: [u32; MAX_GROUPS],
    fine: bool,
    /// The groups that drop EAGLE's block, one bit each.
    drop: u8,
    /// The largest group block over the hash block.
    ratio: u32,
}

impl Geometry {
    fn ratio(&self) -> u32 {
        self.ratio
    }
}

impl SimpleConfig {
    /// Checks the block sizes as vLLM's coordinators assert them, and decides fine-grained
    /// hits (vLLM's `partial_hash_hits_enabled`, eager mode only).
    fn geometry(&self) -> Result<Geometry, ConfigError> {
        let bad = |why| Err(ConfigError::BlockSizes { why });
        let bs = self.block_size;
        let hash = self.hash_block_size.unwrap_or(bs);
        if hash == 0 || !bs.is_multiple_of(hash) {
            return bad("the hash block size must be > 0 and divide the scheduler's block size");
        }
        if self.dcp_world_size == 0 {
            return bad("dcp_world_size must be > 0");
        }
        let layout = &self.layout;
        let mut blocks = [bs; MAX_GROUPS];
        for (g, &kind) in layout.kinds().iter().enumerate() {
            let gb = layout.block_size(super::len32(g)).unwrap_or(bs);
            blocks[g] = gb;
            if !bs.is_multiple_of(gb) {
                return bad("every group's block size must divide the scheduler's");
            }
            if kind.is_cacheable() && !gb.is_multiple_of(hash) {
                return bad(
                    "every prefix-cacheable group's block size must be a multiple of \
                            the hash block size",
                );
            }
        }
        if !layout.is_hybrid() && (blocks[0] != bs || hash != bs) {
            return bad("a single-group model has one block size: its group's, the \
                        scheduler's and the hash block size");
        }
        let cacheable = || layout.cacheable().map(|(g, k)| (k, blocks[g as usize]));
        let mamba_fine = cacheable().any(|(k, gb)| {
            k == GroupKind::Mamba && (gb > hash || (self.dcp_world_size > 1 && gb == hash))
        });
        let all_fine = cacheable()
            .all(|(k, gb)| matches!(k, GroupKind::FullAttention | GroupKind::Mamba) || gb == hash);
        let fine = !self.lazy_offload && layout.is_hybrid() && mamba_fine && all_fine;
        let align = if fine { hash } else { bs };
        if cacheable().any(|(k, gb)| matches!(k, GroupKind::ChunkedLocal { .. }) && gb != align) {
            return bad(
                "a chunked-local group's block size must be the hit alignment (the \
                        scheduler's block size, or the hash block size with fine-grained hits)",
            );
        }
        let ratio = cacheable().map(|(_, gb)| gb / hash).max().unwrap_or(1);
        let all = u8::try_from((1u16 << layout.len()) - 1).unwrap_or(u8::MAX);
        let drop = match (self.use_eagle_block_drop, layout.eagle_groups()) {
            (false, _) => 0,
            (true, 0) => all,
            (true, marked) => marked,
        };
        if layout
            .cacheable()
            .any(|(g, k)| matches!(k, GroupKind::ChunkedLocal { .. }) && drop & (1 << g) != 0)
        {
            return bad("EAGLE's block drop on a chunked-local group (vLLM asserts)");
        }
        let eagle_groups = layout.eagle_groups() != 0 || self.use_eagle_block_drop;
        if eagle_groups && bs < self.num_prefill_lookahead_tokens {
            return bad("EAGLE groups need a scheduler block of at least \
                        num_prefill_lookahead_tokens tokens");
        }
        Ok(Geometry {
            hash,
            blocks,
            fine,
            drop,
            ratio,
        })
    }

    /// The lazy `target_free` term of group `g` (chunked local counts as full attention, as
    /// in vLLM's estimate).
    fn lazy_term(&self, g: u32, kind: GroupKind) -> GroupSpec {
        let block_size = self.layout.block_size(g).unwrap_or(self.block_size);
        match kind {
            GroupKind::Mamba => GroupSpec::Mamba,
            GroupKind::SlidingWindow { window } => GroupSpec::SlidingWindow {
                block_size,
                window,
                dcp_sharded: false,
            },
            _ => GroupSpec::FullAttention {
                block_size,
                dcp_sharded: false,
            },
        }
    }
}

/// What [`SimpleConfig::validate`] derives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Validated {
    /// The CPU pool's blocks, the null block included.
    pub num_cpu_blocks: u32,
    /// Lazy mode's `target_free` (0 in eager mode).
    pub target_free: u32,
    /// The tokens each request hash covers.
    pub hash_block_size: u32,
    /// The largest prefix-cacheable group block over the hash block (1 when they are one).
    pub hash_blocks_per_block: u32,
    /// Secondary hashes the CPU pool has room for ([`SimpleConfig::secondary_hashes`]).
    pub secondary_capacity: u32,
    /// Fine-grained hits (vLLM's `enable_partial_hash_hits`): eager mode, a hybrid layout
    /// with a Mamba group whose block is larger than the hash block (or equal to it under
    /// DCP), and every other prefix-cacheable group full attention or of the hash block size.
    /// Hits then end on any hash-block boundary (full attention's last block and Mamba's
    /// state may be partial), not only on the scheduler's block boundaries.
    pub partial_hash_hits: bool,
    /// Each group's block size (entries past the layout's groups are the scheduler's).
    pub group_block_sizes: [u32; MAX_GROUPS],
    /// The spec groups the hit search runs over.
    pub(crate) specs: SpecGroups,
    /// `max(0, num_prefill_lookahead_tokens − 1)`: what an EAGLE group's cacheable prefix
    /// holds back in a hybrid model.
    pub(crate) prefill_reprefillable: u32,
    /// Computed tokens not yet cacheable: `max(0, num_prefill_lookahead_tokens − 1)` for a
    /// dense model (vLLM's unitary coordinator); 0 for any other layout (its hybrid coordinator
    /// holds the tail back only for EAGLE groups, which kvtier does not model).
    pub reprefillable: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn sizing(capacity_bytes: u64, gpu_total_bytes: u64, size: PoolSize) -> PoolSizing {
        PoolSizing {
            capacity_bytes,
            gpu_total_bytes,
            size,
        }
    }

    #[test]
    fn pool_size_follows_vllm_derive_cpu_config() {
        // 1000 GPU blocks in 10 GiB; a 4 GiB budget holds 400.
        let s = sizing(4 * GIB, 10 * GIB, PoolSize::FromBytes);
        assert_eq!(s.local_capacity(1000), Ok(400));
        assert_eq!(s.num_cpu_blocks(1000), Ok(400));
        // A budget below one block still gives one block.
        assert_eq!(
            sizing(1, 10 * GIB, PoolSize::FromBytes).num_cpu_blocks(1000),
            Ok(1)
        );
        // Explicit within capacity, at capacity, above it, zero.
        assert_eq!(
            sizing(4 * GIB, 10 * GIB, PoolSize::Explicit(400)).num_cpu_blocks(1000),
            Ok(400)
        );
        assert_eq!(
            sizing(4 * GIB, 10 * GIB, PoolSize::Explicit(401)).num_cpu_blocks(1000),
            Err(ConfigError::ExplicitBlocks {
                num_cpu_blocks: 401,
                local_capacity: 400
            })
        );
        assert!(
            sizing(4 * GIB, 10 * GIB, PoolSize::Explicit(0))
                .num_cpu_blocks(1000)
                .is_err()
        );
        // Aligned is used as is, even above the budget.
        assert_eq!(
            sizing(0, 10 * GIB, PoolSize::Aligned(77)).num_cpu_blocks(1000),
            Ok(77)
        );
        assert_eq!(
            sizing(1, 0, PoolSize::FromBytes).num_cpu_blocks(1),
            Err(ConfigError::ZeroGpuBytes)
        );
        // 8 GiB over 4 ranks.
        assert_eq!(per_rank_bytes(8 * GIB, 4, None), Some(2 * GIB));
        assert_eq!(per_rank_bytes(8 * GIB, 4, Some(GIB)), Some(GIB));
        assert_eq!(per_rank_bytes(8 * GIB, 0, None), None);
    }

    #[test]
    fn lazy_target_follows_vllm_estimate() {
        let fa = GroupSpec::FullAttention {
            block_size: 16,
            dcp_sharded: false,
        };
        // cdiv(2048, 16) = 128, doubled.
        assert_eq!(lazy_target_blocks(&[fa], 2048, 1), Some(256));
        let sw = GroupSpec::SlidingWindow {
            block_size: 16,
            window: 100,
            dcp_sharded: true,
        };
        // FA 128 + SW cdiv(100, 32) + 1 = 5 + Mamba 2, doubled.
        assert_eq!(
            lazy_target_blocks(&[fa, sw, GroupSpec::Mamba], 2048, 2),
            Some(270)
        );
        let zero = GroupSpec::FullAttention {
            block_size: 0,
            dcp_sharded: false,
        };
        assert_eq!(lazy_target_blocks(&[zero], 2048, 1), None);
        let mut c = SimpleConfig::with_cpu_blocks(16, 100, 10);
        c.lazy_offload = true;
        assert_eq!(c.validate().map(|v| v.target_free), Ok(256));
        c.lazy_target_free = Some(3);
        assert_eq!(c.validate().map(|v| v.target_free), Ok(3));
        c.lazy_offload = false;
        assert_eq!(c.validate().map(|v| v.target_free), Ok(0));
        // A hybrid model's default adds the Mamba group's 2: (128 + 2) · 2.
        c.lazy_offload = true;
        c.lazy_target_free = None;
        c.layout = Layout::hybrid_mamba(true);
        assert_eq!(c.validate().map(|v| v.target_free), Ok(260));
        // A sliding window of 100 tokens adds cdiv(100, 16) + 1 = 8, a chunked local group
        // cdiv(2048, 16) = 128, a scratch group nothing: (128 + 8 + 128) · 2.
        c.layout = Layout::new(&[
            GroupKind::FullAttention,
            GroupKind::SlidingWindow { window: 100 },
            GroupKind::ChunkedLocal { chunk: 64 },
            GroupKind::Scratch,
        ])
        .unwrap();
        assert_eq!(c.validate().map(|v| v.target_free), Ok(528));
    }

    #[test]
    fn validate_rejects_zeroes() {
        let ok = SimpleConfig::with_cpu_blocks(16, 100, 10);
        assert_eq!(ok.validate().map(|v| v.num_cpu_blocks), Ok(10));
        let mut c = ok;
        c.block_size = 0;
        assert_eq!(c.validate(), Err(ConfigError::ZeroBlockSize));
        let mut c = ok;
        c.world_size = 0;
        assert_eq!(c.validate(), Err(ConfigError::ZeroWorldSize));
        let mut c = ok;
        c.num_prefill_lookahead_tokens = 3;
        assert_eq!(c.validate().map(|v| v.reprefillable), Ok(2));
        c.layout = Layout::hybrid_mamba(false);
        assert_eq!(c.validate().map(|v| v.reprefillable), Ok(0));
        assert_eq!(
            SimpleConfig::with_cpu_blocks(16, 100, 0).validate(),
            Err(ConfigError::ZeroCpuBlocks)
        );
    }
}
