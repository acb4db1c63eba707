"""The sizes of kvtier's fixed tables, from vLLM's configuration and the offload budget:
the GPU pool, the requests and blocks a request tracked at once (``kvtier_max_requests``,
``kvtier_max_blocks_per_request``), the CPU pool's room for secondary hashes
(``kvtier_secondary_hashes``) and its event queue."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from vllm.v1.simple_kv_offload.sizing import gpu_total_bytes

if TYPE_CHECKING:
    from collections.abc import Sequence

    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig

    from kvtier.simple.layout import Layout


class Sizes(NamedTuple):
    """What the native scheduler is built with besides the layout."""

    num_gpu_blocks: int
    gpu_bytes: int
    max_requests: int
    max_blocks: int
    secondary_hashes: int
    event_capacity: int


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def extra_config(vllm_config: VllmConfig) -> dict[str, Any]:
    """The connector's ``kv_connector_extra_config`` (empty when there is none)."""
    kv_transfer = getattr(vllm_config, "kv_transfer_config", None)
    extra = getattr(kv_transfer, "kv_connector_extra_config", None)
    return dict(extra or {})


def native_sizes(
    vllm_config: VllmConfig,
    kv_cache_config: KVCacheConfig,
    layout: Layout,
    group_block_sizes: Sequence[int],
    hash_block_size: int,
    offload_capacity: int,
    num_cpu_blocks: int | None,
    aligned_num_cpu_blocks: int | None,
) -> Sizes:
    """The tables' sizes; raises ValueError for a ``num_cpu_blocks`` outside the local
    offload capacity."""
    num_gpu_blocks = kv_cache_config.num_blocks
    gpu_bytes = gpu_total_bytes(kv_cache_config)
    local_capacity = num_gpu_blocks * offload_capacity // gpu_bytes
    if num_cpu_blocks is not None and (
        type(num_cpu_blocks) is not int or not 0 < num_cpu_blocks <= local_capacity
    ):
        raise ValueError(
            f"num_cpu_blocks={num_cpu_blocks!r} must be between 1 and "
            f"local offload capacity {local_capacity}"
        )
    extra = extra_config(vllm_config)
    max_num_seqs = getattr(vllm_config.scheduler_config, "max_num_seqs", 256)
    max_requests = int(extra.get("kvtier_max_requests", 4 * max_num_seqs + 64))
    # A request's table in its group of the smallest blocks.
    smallest = min(group_block_sizes)
    max_blocks = int(
        extra.get(
            "kvtier_max_blocks_per_request",
            min(
                num_gpu_blocks,
                cdiv(vllm_config.model_config.max_model_len, smallest) + 64,
            ),
        )
    )
    if num_cpu_blocks is not None:
        pool_blocks = num_cpu_blocks
    elif aligned_num_cpu_blocks is not None:
        pool_blocks = aligned_num_cpu_blocks
    else:
        pool_blocks = max(1, local_capacity)
    # Room for the secondary hashes a stored block brings: one per hash boundary inside
    # the largest group block, and at least one per block (vLLM's pool keeps any).
    cacheable_sizes = [
        size for size, (kind, _) in zip(group_block_sizes, layout) if kind != "scratch"
    ]
    per_block = max(1, max(cacheable_sizes) // hash_block_size - 1)
    secondary_hashes = int(
        extra.get("kvtier_secondary_hashes", min(max(pool_blocks, 1) * per_block, 2**32 - 1))
    )
    # One call records at most one event per key the CPU pool holds (a removal when a
    # step hands its block out, a store when its copy completes) plus a reset's clear;
    # the queue is drained after every call.
    event_capacity = min(max(pool_blocks, 0) + secondary_hashes + 64, 2**32 - 1)
    return Sizes(
        num_gpu_blocks, gpu_bytes, max_requests, max_blocks, secondary_hashes, event_capacity
    )
