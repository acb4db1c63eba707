//! Bytes per pool block, the number of blocks a memory budget holds, and the admission check.

use alloc::vec::Vec;

use super::arith::{div_floor, lcm, round_up};
use super::error::{AdmissionError, BlocksError, SizingError};
use super::grouping::GroupedLayout;
use super::spec::Workload;

/// How the worker's KV pool is laid out in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PoolLayout {
    /// One block holds every layer of the widest group side by side; the block stride is
    /// `round_up(max_g Σ page, lcm(stride alignments))`.
    BlockOutermost,
    /// Each layer owns a region of blocks; one block costs `max_g Σ round_up(page, alignment)`
    /// (the layout vLLM's capacity tests set explicitly, "LBNHC"). The default.
    #[default]
    LayerOutermost,
}

impl GroupedLayout {
    /// Bytes one pool block costs on this worker (0 when no group has a layer here).
    ///
    /// # Errors
    /// [`SizingError::Overflow`].
    pub fn bytes_per_block(&self, layout: PoolLayout) -> Result<u64, SizingError> {
        let mut widest = 0u64;
        let mut align = 1u64;
        for group in self.groups() {
            let mut sum = 0u64;
            for &i in group.layers() {
                let Some(spec) = usize::try_from(i).ok().and_then(|i| self.layers().get(i)) else {
                    continue;
                };
                let cost = match layout {
                    PoolLayout::BlockOutermost => {
                        align = lcm(align, spec.stride_alignment).ok_or(SizingError::Overflow)?;
                        spec.page_bytes()
                    }
                    PoolLayout::LayerOutermost => spec.stride_bytes(),
                }
                .map_err(SizingError::Spec)?;
                sum = sum.checked_add(cost).ok_or(SizingError::Overflow)?;
            }
            widest = widest.max(sum);
        }
        match layout {
            PoolLayout::BlockOutermost => {
                round_up(widest, align.max(1)).ok_or(SizingError::Overflow)
            }
            PoolLayout::LayerOutermost => Ok(widest),
        }
    }

    /// Bytes one request of `w.max_model_len` tokens needs on this worker:
    /// `bytes_per_block · blocks_per_request` (vLLM's `_max_memory_usage_bytes_from_groups`).
    ///
    /// # Errors
    /// As [`GroupedLayout::blocks_per_request`], or overflow.
    pub fn request_bytes(&self, layout: PoolLayout, w: &Workload) -> Result<u64, SizingError> {
        if self.groups().is_empty() {
            return Ok(0);
        }
        let bpb = self.bytes_per_block(layout)?;
        bpb.checked_mul(self.blocks_per_request(w)?)
            .ok_or(SizingError::Overflow)
    }
}

/// `⌊available / bytes_per_block⌋`.
///
/// # Errors
/// [`BlocksError::ZeroBytesPerBlock`].
pub const fn num_blocks_floor(available: u64, bytes_per_block: u64) -> Result<u64, BlocksError> {
    match div_floor(available, bytes_per_block) {
        Some(n) => Ok(n),
        None => Err(BlocksError::ZeroBytesPerBlock),
    }
}

/// What one worker's pool holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerBlocks {
    /// Bytes per pool block (0 for an attention-free worker).
    pub bytes_per_block: u64,
    /// Blocks in the pool, the null block included.
    pub num_blocks: u64,
    /// The memory the checks plan against: the budget, or `override · bytes_per_block`.
    pub effective_memory: u64,
}

/// The blocks one worker gets from `available` bytes: `⌊available / bytes_per_block⌋`, or the
/// override when set (and then `effective_memory = override · bytes_per_block`); a worker with
/// no group (attention-free) gets 1 block, the null block.
///
/// # Errors
/// [`BlocksError`] on zero bytes per block or overflow.
pub fn worker_blocks(
    layout: &GroupedLayout,
    pool: PoolLayout,
    available: u64,
    num_gpu_blocks_override: Option<u64>,
) -> Result<WorkerBlocks, BlocksError> {
    if layout.groups().is_empty() {
        return Ok(WorkerBlocks {
            bytes_per_block: 0,
            num_blocks: 1,
            effective_memory: available,
        });
    }
    let bytes_per_block = layout
        .bytes_per_block(pool)
        .map_err(|_| BlocksError::Overflow)?;
    if bytes_per_block == 0 {
        return Err(BlocksError::ZeroBytesPerBlock);
    }
    match num_gpu_blocks_override {
        Some(n) => {
            let effective_memory = n
                .checked_mul(bytes_per_block)
                .ok_or(BlocksError::Overflow)?;
            Ok(WorkerBlocks {
                bytes_per_block,
                num_blocks: n,
                effective_memory,
            })
        }
        None => Ok(WorkerBlocks {
            bytes_per_block,
            num_blocks: num_blocks_floor(available, bytes_per_block)?,
            effective_memory: available,
        }),
    }
}

/// The pool size all workers agree on: the minimum of their block counts.
///
/// # Errors
/// [`BlocksError::NoWorkers`] for an empty slice.
pub fn min_across_workers(workers: &[WorkerBlocks]) -> Result<u64, BlocksError> {
    workers
        .iter()
        .map(|w| w.num_blocks)
        .min()
        .ok_or(BlocksError::NoWorkers)
}

/// The largest `max_model_len` in `[1, w.max_model_len]` whose request fits in `memory` bytes
/// (vLLM's binary search), or 0 when not even one token fits.
///
/// # Errors
/// As [`GroupedLayout::request_bytes`].
pub fn max_fitting_len(
    layout: &GroupedLayout,
    pool: PoolLayout,
    w: &Workload,
    memory: u64,
) -> Result<u64, SizingError> {
    let fits = |len: u64| -> Result<bool, SizingError> {
        match layout.request_bytes(pool, &w.with_max_model_len(len)) {
            Ok(bytes) => Ok(bytes <= memory),
            // Overflow means "needs more than any u64 memory".
            Err(SizingError::Overflow) => Ok(false),
            Err(e) => Err(e),
        }
    };
    if w.max_model_len == 0 || !fits(1)? {
        return Ok(0);
    }
    let (mut left, mut right, mut result) = (1u64, w.max_model_len, 1u64);
    while left <= right {
        // No overflow: left + (right - left) / 2.
        let mid = left + (right - left) / 2;
        if fits(mid)? {
            result = mid;
            // mid == u64::MAX fits: nothing longer exists.
            let Some(next) = mid.checked_add(1) else {
                break;
            };
            left = next;
        } else {
            right = mid - 1;
        }
    }
    Ok(result)
}

/// The admission check one worker makes at start-up, on `memory` bytes (the effective memory of
/// [`WorkerBlocks`]): one block is reserved for the null block, and one request of
/// `w.max_model_len` tokens must fit in the rest. Returns the bytes one request needs.
///
/// # Errors
/// [`AdmissionError::NoMemory`] when nothing is left after the null block,
/// [`AdmissionError::TooLong`] (with the largest length that fits) when the request does not fit.
pub fn check_admission(
    layout: &GroupedLayout,
    pool: PoolLayout,
    w: &Workload,
    memory: u64,
) -> Result<u64, AdmissionError> {
    if layout.groups().is_empty() {
        return Ok(0);
    }
    let bytes_per_block = layout.bytes_per_block(pool)?;
    let check = match memory.checked_sub(bytes_per_block) {
        Some(c) if c > 0 => c,
        _ => {
            return Err(AdmissionError::NoMemory {
                available: memory,
                bytes_per_block,
            });
        }
    };
    let needed = match layout.request_bytes(pool, w) {
        Ok(n) => n,
        Err(SizingError::Overflow) => u64::MAX,
        Err(e) => return Err(e.into()),
    };
    if needed > check {
        let max_fitting_len = max_fitting_len(layout, pool, w, check)?;
        return Err(AdmissionError::TooLong {
            needed,
            available: check,
            max_model_len: w.max_model_len,
            max_fitting_len,
        });
    }
    Ok(needed)
}

/// Every worker's blocks and admission, then the minimum: what vLLM's `get_kv_cache_configs`
/// settles on.
///
/// # Errors
/// The first worker's [`BlocksError`] or [`AdmissionError`], as a [`PoolError`].
pub fn pool_blocks(
    workers: &[GroupedLayout],
    pool: PoolLayout,
    w: &Workload,
    available: u64,
    num_gpu_blocks_override: Option<u64>,
) -> Result<(u64, Vec<WorkerBlocks>), PoolError> {
    let mut per_worker = Vec::with_capacity(workers.len());
    for (worker, layout) in workers.iter().enumerate() {
        let wb = worker_blocks(layout, pool, available, num_gpu_blocks_override)
            .map_err(|error| PoolError::Blocks { worker, error })?;
        check_admission(layout, pool, w, wb.effective_memory)
            .map_err(|error| PoolError::Admission { worker, error })?;
        per_worker.push(wb);
    }
    let n =
        min_across_workers(&per_worker).map_err(|error| PoolError::Blocks { worker: 0, error })?;
    Ok((n, per_worker))
}

/// Sizing the pool across workers failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolError {
    /// A worker's blocks could not be computed.
    Blocks {
        /// The worker (pipeline stage).
        worker: usize,
        /// Why.
        error: BlocksError,
    },
    /// A worker's admission check failed.
    Admission {
        /// The worker (pipeline stage).
        worker: usize,
        /// Why.
        error: AdmissionError,
    },
}

impl core::fmt::Display for PoolError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Blocks { worker, error } => write!(f, "worker {worker}: {error}"),
            Self::Admission { worker, error } => write!(f, "worker {worker}: {error}"),
        }
    }
}

impl core::error::Error for PoolError {}
