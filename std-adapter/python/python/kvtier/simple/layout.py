"""The model's KV-cache groups as kvtier's simple offloader lays them out: each group's kind
(``(kind, tokens)``, as the native layout takes it), and the checks that refuse a
configuration kvtier does not model, or one vLLM's CPU-side coordinator refuses."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vllm.v1.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheGroupRole,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec

# The spec classes kvtier models, each exactly (a subclass may change what vLLM's manager does):
# full attention (vLLM's FullAttentionManager), sliding window (its SlidingWindowManager; the
# MLA form differs only in its cache layout), chunked local attention.
FULL_ATTENTION_SPECS = (FullAttentionSpec, MLAAttentionSpec)
SLIDING_WINDOW_SPECS = (SlidingWindowSpec, SlidingWindowMLASpec)

# The most KV-cache groups kvtier's layout holds (kvtier_core::simple::MAX_GROUPS).
MAX_GROUPS = 8

# One group as the native layout takes it: its kind, and its window or chunk in tokens.
Layout = list[tuple[str, int]]


def group_kind(i: int, spec: Any) -> tuple[str, int]:
    """Group ``i``'s kind as the native layout takes it, ``(kind, tokens)``; raises
    ValueError for a spec kvtier does not model."""
    if not spec.prefix_cacheable:
        # vLLM's scheduler side never looks such a group up, stores, loads or reports it.
        return ("scratch", 0)
    kind = type(spec)
    if kind in FULL_ATTENTION_SPECS:
        return ("full_attention", 0)
    if kind in SLIDING_WINDOW_SPECS:
        return ("sliding_window", spec.sliding_window)
    if kind is ChunkedLocalAttentionSpec:
        return ("chunked_local", spec.attention_chunk_size)
    if kind is MambaSpec:
        mode = spec.mamba_cache_mode
        if mode != "align":
            raise ValueError(
                "kvtier's SimpleCPUOffloadScheduler supports Mamba groups in 'align' cache "
                f"mode only; group {i}'s is {mode!r}"
            )
        return ("mamba", 0)
    raise ValueError(
        "kvtier's SimpleCPUOffloadScheduler supports prefix-cacheable KV-cache groups of "
        "full attention (FullAttentionSpec, MLAAttentionSpec), sliding-window attention "
        "(SlidingWindowSpec, SlidingWindowMLASpec), chunked local attention "
        "(ChunkedLocalAttentionSpec) and Mamba in 'align' mode (MambaSpec); group "
        f"{i} is a prefix-cacheable {kind.__name__}, which is not supported"
    )


def check_scope(
    vllm_config: VllmConfig,
    kv_cache_config: KVCacheConfig,
    scheduler_block_size: int,
) -> tuple[Layout, int]:
    """The native layout of the model's KV-cache groups (one ``(kind, tokens)`` per group,
    in group order) and the full-attention group's id (vLLM's ``fa_gidx``); raises
    ValueError for a configuration outside kvtier's simple offloader.

    Groups whose spec is not prefix-cacheable (a scratch or ring group such as
    ``CircularBufferSpec``) take no part in vLLM's scheduler side beyond the checks its
    coordinator makes when it is built; those checks are made here, and the groups are
    ``scratch`` in the layout."""
    groups = kv_cache_config.kv_cache_groups
    _check_roles(groups)
    if not 1 <= len(groups) <= MAX_GROUPS:
        raise ValueError(
            f"kvtier's SimpleCPUOffloadScheduler supports 1 to {MAX_GROUPS} KV-cache "
            f"groups; this model has {len(groups)}"
        )
    layout = [group_kind(i, g.kv_cache_spec) for i, g in enumerate(groups)]
    cacheable = [i for i, (kind, _) in enumerate(layout) if kind != "scratch"]
    _check_lookup_together(groups, layout, cacheable, scheduler_block_size)
    attention = _attention_group(groups, layout, cacheable)
    _check_coordinator(vllm_config, groups, scheduler_block_size)
    check_retention_interval(kv_cache_config, scheduler_block_size)
    return layout, attention


def _check_roles(groups: Sequence[KVCacheGroupSpec]) -> None:
    """Refuses a HiSparse group (a role other than the default, or host-resident)."""
    for i, g in enumerate(groups):
        if g.role != KVCacheGroupRole.DEFAULT or g.host_resident:
            raise ValueError(
                "kvtier's SimpleCPUOffloadScheduler does not support HiSparse KV-cache "
                f"groups; group {i} has role {getattr(g.role, 'value', g.role)!r}"
                + (" and is host-resident" if g.host_resident else "")
            )


def _check_lookup_together(
    groups: Sequence[KVCacheGroupSpec],
    layout: Layout,
    cacheable: list[int],
    scheduler_block_size: int,
) -> None:
    """kvtier looks groups of one kind and window or chunk up together, vLLM only groups of
    one whole spec; the answers differ only beside a chunked group whose chunk is not a
    multiple of the scheduler block (its lookup is not stable, so vLLM's passes decide)."""
    if not any(k == "chunked_local" and t % scheduler_block_size for k, t in layout):
        return
    for a in cacheable:
        for b in cacheable:
            if a < b and layout[a] == layout[b] and (
                groups[a].kv_cache_spec != groups[b].kv_cache_spec
            ):
                raise ValueError(
                    "kvtier's SimpleCPUOffloadScheduler looks up groups of one kind "
                    f"together; groups {a} and {b} are of one kind with different specs "
                    "beside a chunked local group whose chunk is not a multiple of the "
                    f"scheduler block ({scheduler_block_size}), where vLLM's lookup "
                    "would differ"
                )


def _attention_group(
    groups: Sequence[KVCacheGroupSpec], layout: Layout, cacheable: list[int]
) -> int:
    """The prefix-cacheable full-attention group vLLM's ``fa_gidx`` names; raises
    ValueError when there is none, when a prefix-cacheable group takes no part in KV
    transfer, or when another group of a full-attention kind comes first."""
    attention = [i for i in cacheable if layout[i][0] == "full_attention"]
    if not attention:
        names = ", ".join(type(groups[i].kv_cache_spec).__name__ for i in cacheable)
        raise ValueError(
            "kvtier's SimpleCPUOffloadScheduler needs a prefix-cacheable full-attention "
            f"KV-cache group; this model's prefix-cacheable groups are {names or 'none'}"
        )
    for i in cacheable:
        # vLLM's prefix_cacheable_group_ids leaves out a group that is not transferable,
        # while its coordinator's lookup still includes it.
        if not groups[i].enable_kv_transfer:
            raise ValueError(
                "kvtier's SimpleCPUOffloadScheduler needs its prefix-cacheable groups to take "
                f"part in KV transfer; group {i} has enable_kv_transfer=False"
            )
    # vLLM's fa_gidx is the first group of a full-attention kind, prefix-cacheable or not.
    first_full = next(
        i for i, g in enumerate(groups) if isinstance(g.kv_cache_spec, FullAttentionSpec)
    )
    if first_full != attention[0]:
        raise ValueError(
            "kvtier's SimpleCPUOffloadScheduler needs the prefix-cacheable full-attention "
            f"group ({attention[0]}) to be the first group of a full-attention kind; group "
            f"{first_full} ({type(groups[first_full].kv_cache_spec).__name__}) comes first"
        )
    return attention[0]


def _check_coordinator(
    vllm_config: VllmConfig, groups: Sequence[KVCacheGroupSpec], scheduler_block_size: int
) -> None:
    """What vLLM's CPU-side coordinator checks of every group when it is built: block sizes
    that divide the scheduler's, under DCP only full-attention groups sharded, and a
    scheduler block that holds an EAGLE group's prefill lookahead."""
    dcp = vllm_config.parallel_config.decode_context_parallel_size
    for i, g in enumerate(groups):
        spec = g.kv_cache_spec
        if scheduler_block_size % spec.block_size:
            raise ValueError(
                f"the scheduler block size {scheduler_block_size} is not a multiple of "
                f"group {i}'s block size {spec.block_size}"
            )
        if (
            len(groups) > 1
            and dcp > 1
            and spec.dcp_sharded
            and not isinstance(spec, FullAttentionSpec)
        ):
            raise ValueError(
                "under decode context parallelism a model of several KV-cache groups may "
                f"shard only full-attention groups; group {i} is a sharded "
                f"{type(spec).__name__}"
            )
    lookahead = vllm_config.num_prefill_lookahead_tokens
    if any(g.is_eagle_group for g in groups) and scheduler_block_size < lookahead:
        raise ValueError(
            f"an EAGLE group with {lookahead} prefill lookahead tokens needs a scheduler "
            f"block of at least as many tokens; it has {scheduler_block_size}"
        )


def check_retention_interval(kv_cache_config: KVCacheConfig, scheduler_block_size: int) -> None:
    """The ``prefix_cache_retention_interval`` values vLLM's coordinator refuses: any but 0
    (or unset) without a sliding-window or Mamba group (of any group, prefix-cacheable or
    not), else a negative one or one that is not a multiple of the scheduler block size."""
    interval = getattr(kv_cache_config, "prefix_cache_retention_interval", None)
    if interval is None:
        return
    sparse = any(
        isinstance(g.kv_cache_spec, (SlidingWindowSpec, MambaSpec))
        for g in kv_cache_config.kv_cache_groups
    )
    if not sparse:
        if interval != 0:
            raise ValueError(
                f"prefix_cache_retention_interval={interval} has no effect without a "
                "sliding-window or Mamba KV-cache group (only 0 is accepted)"
            )
        return
    if interval < 0 or interval % scheduler_block_size:
        raise ValueError(
            f"prefix_cache_retention_interval ({interval}) must be non-negative and a "
            f"multiple of the scheduler block size ({scheduler_block_size})"
        )
