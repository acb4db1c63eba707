//! The capacity arithmetic for a simple full-attention layout: bytes per block, GPU blocks and
//! concurrency, and the CPU tier's chunks (`kvtier_core::capacity`).
#![allow(non_camel_case_types, reason = "C names")]
#![allow(
    clippy::missing_safety_doc,
    reason = "the shared safety contract is stated in the crate docs and the header"
)]

use core::ffi::c_int;

use kvtier_core::capacity::{
    CpuTierConfig, GpuCapacityError, GroupedLayout, LayerKind, LayerSpec, MAX_LAYERS, PoolError,
    PoolLayout, Workload, gpu_capacity, size_cpu_tier,
};

use crate::handle;
use crate::ptr::{OutRef, input_ref};
use crate::status::{Status, fail};

/// A model whose every layer is full attention with the same shape (Llama, Mistral, Qwen2...).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct kvtier_full_attention_layout {
    /// Attention layers (1 to 65,536).
    pub num_layers: u32,
    /// Tokens per block (vLLM's `block_size`, usually 16).
    pub block_size: u64,
    /// KV heads on one worker.
    pub num_kv_heads: u64,
    /// Head size (keys and values alike).
    pub head_size: u64,
    /// Bytes per element of the cache dtype (2 for bf16/fp16).
    pub dtype_bytes: u64,
}

/// The memory and scheduler budget.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct kvtier_capacity_budget {
    /// GPU memory for the KV cache in bytes; 0 with `num_gpu_blocks_override` 0 skips the GPU
    /// figures.
    pub gpu_memory_bytes: u64,
    /// Use this many GPU blocks instead of computing them (vLLM's
    /// `num_gpu_blocks_override`); 0 for none.
    pub num_gpu_blocks_override: u64,
    /// Tokens per request (`max_model_len`, at least 1).
    pub max_model_len: u64,
    /// vLLM's `max_num_batched_tokens`.
    pub max_num_batched_tokens: u64,
    /// Bytes of the CPU tier; 0 skips the CPU figures.
    pub cpu_bytes: u64,
    /// GPU blocks per CPU chunk (at least 1 when `cpu_bytes` is given).
    pub cpu_blocks_per_chunk: u64,
}

/// What `kvtier_capacity_full_attention` computed. Figures of a part that was skipped are 0.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct kvtier_capacity {
    /// Bytes one block costs (all layers).
    pub bytes_per_block: u64,
    /// Blocks per request of `max_model_len` tokens.
    pub blocks_per_request: u64,
    /// GPU blocks (vLLM's `num_gpu_blocks`).
    pub num_gpu_blocks: u64,
    /// Max concurrency as the exact ratio `num / den` (`num_gpu_blocks / blocks_per_request`
    /// in lowest terms).
    pub max_concurrency_num: u64,
    /// See `max_concurrency_num`.
    pub max_concurrency_den: u64,
    /// GPU KV cache size in tokens (`floor(num_gpu_blocks · max_model_len /
    /// blocks_per_request)`).
    pub kv_cache_size_tokens: u64,
    /// CPU chunks (vLLM's `cpu_num_chunks`).
    pub cpu_num_chunks: u64,
    /// Bytes of one CPU chunk slot, page padding included.
    pub cpu_aligned_chunk_bytes: u64,
    /// `cpu_num_chunks · cpu_aligned_chunk_bytes`.
    pub cpu_kv_cache_size_bytes: u64,
    /// CPU tier size in tokens for requests of `max_model_len`.
    pub cpu_kv_cache_size_tokens: u64,
}

/// Computes the capacity figures of a full-attention layout, exactly as vLLM 0.33.0 does at
/// start-up: bytes per block (layer-outermost pool), blocks per request, the GPU pool (when
/// `gpu_memory_bytes` or `num_gpu_blocks_override` is given) and the CPU tier (when
/// `cpu_bytes` is given; one worker, 4,096-byte page alignment). Llama-3-8B (32 layers,
/// 8 KV heads, head 128, bf16, block 16): 2,097,152 bytes per block.
///
/// Errors: `KVTIER_INVALID_ARGUMENT` (0 or more than 65,536 layers, `max_model_len` 0),
/// `KVTIER_DOES_NOT_FIT` (one request of `max_model_len` needs more GPU memory than given;
/// `kvtier_last_error` names the largest length that fits), `KVTIER_CAPACITY_ERROR` (a zero
/// size, or an overflow). `*out` is written only on success. Ownership: the inputs are read
/// and `out` written during the call only. Thread safety: touches no shared state; callable
/// from any thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvtier_capacity_full_attention(
    layout: *const kvtier_full_attention_layout,
    budget: *const kvtier_capacity_budget,
    out: *mut kvtier_capacity,
) -> c_int {
    handle::call(|| {
        // SAFETY: the caller passes a readable layout (checked for NULL and alignment).
        let layout = unsafe { input_ref(layout, "layout") }?;
        // SAFETY: the caller passes a readable budget (checked).
        let budget = unsafe { input_ref(budget, "budget") }?;
        // SAFETY: the caller passes a pointer valid for one write (checked).
        let mut out = unsafe { OutRef::new(out, "out") }?;
        out.set(full_attention(layout, budget)?);
        Ok(())
    })
}

fn full_attention(
    l: &kvtier_full_attention_layout,
    b: &kvtier_capacity_budget,
) -> Result<kvtier_capacity, Status> {
    let layers = usize::try_from(l.num_layers)
        .ok()
        .filter(|n| (1..=MAX_LAYERS).contains(n))
        .ok_or_else(|| {
            fail(
                Status::KVTIER_INVALID_ARGUMENT,
                format_args!("num_layers is {}: expected 1 to {MAX_LAYERS}", l.num_layers),
            )
        })?;
    if b.max_model_len == 0 {
        return Err(fail(
            Status::KVTIER_INVALID_ARGUMENT,
            "max_model_len is 0: expected at least 1",
        ));
    }
    let capacity_error = |e: &dyn core::fmt::Display| fail(Status::KVTIER_CAPACITY_ERROR, e);
    let spec = LayerSpec::attention(
        LayerKind::Full,
        l.block_size,
        l.num_kv_heads,
        l.head_size,
        l.dtype_bytes,
    );
    spec.validate().map_err(|e| capacity_error(&e))?;
    let grouped =
        GroupedLayout::from_layers(&vec![spec; layers]).map_err(|e| capacity_error(&e))?;
    let pool = PoolLayout::LayerOutermost;
    let w = Workload::new(b.max_model_len, b.max_num_batched_tokens);
    let bytes_per_block = grouped
        .bytes_per_block(pool)
        .map_err(|e| capacity_error(&e))?;
    let blocks_per_request = grouped
        .blocks_per_request(&w)
        .map_err(|e| capacity_error(&e))?;
    let mut c = kvtier_capacity {
        bytes_per_block,
        blocks_per_request,
        ..kvtier_capacity::default()
    };
    if b.gpu_memory_bytes > 0 || b.num_gpu_blocks_override > 0 {
        let over = (b.num_gpu_blocks_override > 0).then_some(b.num_gpu_blocks_override);
        let gpu = gpu_capacity(
            &grouped,
            core::slice::from_ref(&grouped),
            pool,
            &w,
            b.gpu_memory_bytes,
            over,
        )
        .map_err(|e| match e {
            GpuCapacityError::Pool(PoolError::Admission { .. }) => {
                fail(Status::KVTIER_DOES_NOT_FIT, e)
            }
            _ => capacity_error(&e),
        })?;
        c.num_gpu_blocks = gpu.num_blocks;
        c.max_concurrency_num = gpu.max_concurrency.num();
        c.max_concurrency_den = gpu.max_concurrency.den();
        c.kv_cache_size_tokens = gpu.kv_cache_size_tokens;
    }
    if b.cpu_bytes > 0 {
        let cfg = CpuTierConfig {
            blocks_per_chunk: b.cpu_blocks_per_chunk,
            ..CpuTierConfig::new(b.cpu_bytes)
        };
        let tier = size_cpu_tier(&cfg, bytes_per_block, &[spec], b.max_model_len)
            .map_err(|e| capacity_error(&e))?;
        c.cpu_num_chunks = tier.num_chunks;
        c.cpu_aligned_chunk_bytes = tier.aligned_chunk_bytes;
        c.cpu_kv_cache_size_bytes = tier.kv_cache_size_bytes;
        c.cpu_kv_cache_size_tokens = tier.kv_cache_size_tokens.unwrap_or(0);
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LLAMA_3_8B: kvtier_full_attention_layout = kvtier_full_attention_layout {
        num_layers: 32,
        block_size: 16,
        num_kv_heads: 8,
        head_size: 128,
        dtype_bytes: 2,
    };

    #[test]
    fn llama_3_8b_matches_the_readme_hand_check() {
        let budget = kvtier_capacity_budget {
            gpu_memory_bytes: 70 << 30,
            max_model_len: 8192,
            max_num_batched_tokens: 2048,
            cpu_bytes: 100 << 30,
            cpu_blocks_per_chunk: 1,
            ..kvtier_capacity_budget::default()
        };
        let c = full_attention(&LLAMA_3_8B, &budget).unwrap();
        assert_eq!(c.bytes_per_block, 2_097_152);
        assert_eq!(c.blocks_per_request, 512);
        assert_eq!(c.num_gpu_blocks, 35_840);
        assert_eq!((c.max_concurrency_num, c.max_concurrency_den), (70, 1));
        assert_eq!(c.kv_cache_size_tokens, 573_440);
        assert_eq!(c.cpu_num_chunks, 51_200);
        assert_eq!(c.cpu_kv_cache_size_tokens, 819_200);
        assert_eq!(c.cpu_aligned_chunk_bytes, 2_097_152);
    }

    #[test]
    fn a_request_that_does_not_fit_names_the_largest_length() {
        // 64 MiB less the 2 MiB null block holds 31 blocks of 16 tokens: 496 tokens.
        let budget = kvtier_capacity_budget {
            gpu_memory_bytes: 64 << 20,
            max_model_len: 8192,
            max_num_batched_tokens: 2048,
            ..kvtier_capacity_budget::default()
        };
        assert_eq!(
            full_attention(&LLAMA_3_8B, &budget),
            Err(Status::KVTIER_DOES_NOT_FIT)
        );
        // SAFETY: the thread's detail buffer is NUL-terminated and lives as long as the thread.
        let detail = unsafe { core::ffi::CStr::from_ptr(crate::status::last_error_ptr()) };
        assert!(
            detail
                .to_str()
                .unwrap()
                .ends_with("the estimated maximum model length is 496"),
            "{detail:?}"
        );
    }

    #[test]
    fn bad_inputs_are_errors() {
        let ok = kvtier_capacity_budget {
            max_model_len: 16,
            ..kvtier_capacity_budget::default()
        };
        let zero_layers = kvtier_full_attention_layout {
            num_layers: 0,
            ..LLAMA_3_8B
        };
        assert_eq!(
            full_attention(&zero_layers, &ok),
            Err(Status::KVTIER_INVALID_ARGUMENT)
        );
        let huge = kvtier_full_attention_layout {
            num_layers: 65_537,
            ..LLAMA_3_8B
        };
        assert_eq!(
            full_attention(&huge, &ok),
            Err(Status::KVTIER_INVALID_ARGUMENT)
        );
        let zero_block = kvtier_full_attention_layout {
            block_size: 0,
            ..LLAMA_3_8B
        };
        assert_eq!(
            full_attention(&zero_block, &ok),
            Err(Status::KVTIER_CAPACITY_ERROR)
        );
        let no_len = kvtier_capacity_budget {
            max_model_len: 0,
            ..ok
        };
        assert_eq!(
            full_attention(&LLAMA_3_8B, &no_len),
            Err(Status::KVTIER_INVALID_ARGUMENT)
        );
        let wide = kvtier_full_attention_layout {
            head_size: u64::MAX / 4,
            ..LLAMA_3_8B
        };
        assert_eq!(
            full_attention(&wide, &ok),
            Err(Status::KVTIER_CAPACITY_ERROR)
        );
        let no_chunk = kvtier_capacity_budget {
            cpu_bytes: 1 << 30,
            cpu_blocks_per_chunk: 0,
            ..ok
        };
        assert_eq!(
            full_attention(&LLAMA_3_8B, &no_chunk),
            Err(Status::KVTIER_CAPACITY_ERROR)
        );
    }
}
