"""kvtier's simple CPU offloader as vLLM 0.33.0's ``SimpleCPUOffloadScheduler``.

``SimpleCPUOffloadScheduler`` here takes vLLM's constructor arguments and answers every call
with vLLM's own types (``SimpleCPUOffloadMetadata``, ``SimpleCPUOffloadStats``,
``BoundaryStoreStats``, and with KV-cache events on ``BlockStored`` / ``BlockRemoved`` /
``AllBlocksCleared``); the bookkeeping is kvtier's Rust ``kvtier_core::simple``. The GPU
pool stays vLLM's ``BlockPool`` (the one ``bind_gpu_block_pool`` gives): kvtier reads it and
pins or releases its blocks through its own ``touch`` and ``free_blocks``.

Scope: the model's KV-cache groups, in vLLM's group order (at most eight), each of full
attention (``FullAttentionSpec``, ``MLAAttentionSpec``), sliding-window attention
(``SlidingWindowSpec``, ``SlidingWindowMLASpec``: vLLM's ``SlidingWindowManager`` for both),
chunked local attention (``ChunkedLocalAttentionSpec``), Mamba in ``align`` mode
(``MambaSpec``), or of a spec that is not prefix-cacheable (a scratch or ring group such as
``CircularBufferSpec``, or a bounded-replay ``SlidingWindowMLASpec``, of any block size
dividing the scheduler's: vLLM's scheduler side never looks them up, stores, loads or reports
them, so kvtier passes their tables as empty). At least one prefix-cacheable group is of full
attention, and the first group of a full-attention kind is one of them (vLLM's ``fa_gidx``).
Each group has its own block size (DCP-resolved; the scheduler's block is a multiple of
each, every prefix-cacheable one a multiple of the hash block; under DCP only full-attention
groups may be sharded, which vLLM's coordinator asserts), and in eager mode hits are
fine-grained where vLLM's ``partial_hash_hits_enabled`` allows them (a Mamba block larger than
the hash block, or equal to it under DCP): full attention's last block and the Mamba state may
end on any hash boundary, secondary block hashes are copied with a store, and a finishing
prompt's partial full-attention tail is flushed. With EAGLE's trailing-block drop
(``use_eagle_block_drop``) the draft groups (``is_eagle_group``; every group when none is
marked) match one block past a hit and drop it, and their eager scan holds the block back,
as vLLM's coordinator does. One full-attention group
alone is vLLM's ``UnitaryKVCacheCoordinator``; any other layout is its
``HybridKVCacheCoordinator``, whose hit is the longest every group accepts and whose eager scan
holds no re-prefillable tail back (``num_prefill_lookahead_tokens``); kvtier follows both. The
eager scan and the finish-time flush follow every full-attention, sliding-window and
chunked-local table, storing entries the GPU has nulled from its prefix cache while it holds
them; Mamba states are stored from the scheduler's boundary hand-offs. Any other
configuration (a prefix-cacheable spec of another kind, e.g. ``RSWASpec``,
``SinkFullAttentionSpec``, ``CrossAttentionSpec``, a HiSparse group, Mamba outside ``align``
mode) raises ``ValueError`` naming what is not supported, rather than running with different
bookkeeping.

Two optional ``kv_connector_extra_config`` keys bound kvtier's fixed tables:
``kvtier_max_requests`` (requests tracked at once; default ``4 · max_num_seqs + 64``) and
``kvtier_max_blocks_per_request`` (default ``cdiv(max_model_len, smallest group block) + 64``,
at most the GPU pool).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_events import (
    MEDIUM_CPU,
    MEDIUM_STORAGE,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
)
from vllm.distributed.kv_transfer.kv_connector.utils import yield_req_data
from vllm.logger import init_logger
from vllm.v1.core.kv_cache_utils import (
    BlockHashWithGroupId,
    generate_block_hash_extra_keys,
    get_block_hash,
    get_group_id,
    make_block_hash_with_group_id,
    maybe_convert_block_hash,
    resolve_dcp_kv_block_size,
    to_event_extra_keys,
)
from vllm.v1.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheGroupRole,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
    get_kv_cache_spec_kind,
    get_kv_cache_spec_sliding_window,
)
from vllm.v1.simple_kv_offload.manager import BlockStoreMeta, BoundaryStoreStats
from vllm.v1.simple_kv_offload.metadata import (
    SimpleCPUOffloadMetadata,
    SimpleCPUOffloadWorkerMetadata,
)
from vllm.v1.simple_kv_offload.metrics import (
    OUTCOME_TO_FIELD,
    MetricName,
    SimpleCPUOffloadStats,
)
from vllm.v1.simple_kv_offload.sizing import gpu_total_bytes

from kvtier import _native

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from vllm.config import VllmConfig
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

__all__ = ["SimpleCPUOffloadScheduler"]

logger = init_logger(__name__)

# The order vLLM's get_stats fills its payload in.
_STATS_ORDER = {
    **{
        (MetricName.SAVE_OUTCOMES, (outcome,)): i
        for i, outcome in enumerate(OUTCOME_TO_FIELD)
    },
    (MetricName.LOAD_BLOCKS, ()): 100,
    (MetricName.USED_BLOCKS, ()): 101,
    (MetricName.PENDING_STORE_BLOCKS, ()): 102,
}

# The spec classes kvtier models, each exactly (a subclass may change what vLLM's manager does):
# full attention (vLLM's FullAttentionManager), sliding window (its SlidingWindowManager; the
# MLA form differs only in its cache layout), chunked local attention.
_FULL_ATTENTION_SPECS = (FullAttentionSpec, MLAAttentionSpec)
_SLIDING_WINDOW_SPECS = (SlidingWindowSpec, SlidingWindowMLASpec)

# The most KV-cache groups kvtier's layout holds (kvtier_core::simple::MAX_GROUPS).
_MAX_GROUPS = 8

# Event payload list numbers from here on name finish-time flushes (the native module's).
_FLUSH_LISTS = 1 << 21


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _group_kind(i: int, spec: Any) -> tuple[str, int]:
    """Group ``i``'s kind as the native layout takes it, ``(kind, tokens)``; raises
    ValueError for a spec kvtier does not model."""
    if not spec.prefix_cacheable:
        # vLLM's scheduler side never looks such a group up, stores, loads or reports it.
        return ("scratch", 0)
    kind = type(spec)
    if kind in _FULL_ATTENTION_SPECS:
        return ("full_attention", 0)
    if kind in _SLIDING_WINDOW_SPECS:
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


def _check_scope(
    vllm_config: VllmConfig,
    kv_cache_config: KVCacheConfig,
    scheduler_block_size: int,
    hash_block_size: int,
) -> tuple[list[tuple[str, int]], int]:
    """The native layout of the model's KV-cache groups (one ``(kind, tokens)`` per group,
    in group order) and the full-attention group's id (vLLM's ``fa_gidx``); raises
    ValueError for a configuration outside kvtier's simple offloader.

    Groups whose spec is not prefix-cacheable (a scratch or ring group such as
    ``CircularBufferSpec``) take no part in vLLM's scheduler side beyond the checks its
    coordinator makes when it is built; those checks are made here, and the groups are
    ``scratch`` in the layout."""
    groups = kv_cache_config.kv_cache_groups
    for i, g in enumerate(groups):
        if g.role != KVCacheGroupRole.DEFAULT or g.host_resident:
            raise ValueError(
                "kvtier's SimpleCPUOffloadScheduler does not support HiSparse KV-cache "
                f"groups; group {i} has role {getattr(g.role, 'value', g.role)!r}"
                + (" and is host-resident" if g.host_resident else "")
            )
    if not 1 <= len(groups) <= _MAX_GROUPS:
        raise ValueError(
            f"kvtier's SimpleCPUOffloadScheduler supports 1 to {_MAX_GROUPS} KV-cache "
            f"groups; this model has {len(groups)}"
        )
    layout = [_group_kind(i, g.kv_cache_spec) for i, g in enumerate(groups)]
    cacheable = [i for i, (kind, _) in enumerate(layout) if kind != "scratch"]
    # kvtier looks groups of one kind and window or chunk up together, vLLM only groups of
    # one whole spec; the answers differ only beside a chunked group whose chunk is not a
    # multiple of the scheduler block (its lookup is not stable, so vLLM's passes decide).
    if any(k == "chunked_local" and t % scheduler_block_size for k, t in layout):
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
    dcp = vllm_config.parallel_config.decode_context_parallel_size
    # What vLLM's CPU-side coordinator checks of every group when it is built.
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
    _check_retention_interval(kv_cache_config, scheduler_block_size)
    return layout, attention[0]


def _check_retention_interval(kv_cache_config: KVCacheConfig, scheduler_block_size: int) -> None:
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


def _extra_config(vllm_config: VllmConfig) -> dict[str, Any]:
    kv_transfer = getattr(vllm_config, "kv_transfer_config", None)
    extra = getattr(kv_transfer, "kv_connector_extra_config", None)
    return dict(extra or {})


class CpuBlock:
    """One CPU block as vLLM's ``KVCacheBlock`` reads: ``block_id``, and live from the pool
    ``ref_cnt``, ``block_hash`` (``BlockHashWithGroupId`` bytes or ``None``),
    ``block_hash_num_tokens``, ``is_null``."""

    __slots__ = ("_pool", "block_id")

    def __init__(self, pool: _native.CpuBlockPool, block_id: int) -> None:
        self._pool = pool
        self.block_id = block_id

    @property
    def ref_cnt(self) -> int:
        return self._pool.ref_cnt(self.block_id)

    @property
    def block_hash(self) -> bytes | None:
        return self._pool.block_hash(self.block_id)

    @property
    def block_hash_num_tokens(self) -> int | None:
        return self._pool.block_hash_num_tokens(self.block_id)

    @property
    def is_null(self) -> bool:
        return self.block_id == 0

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, CpuBlock)
            and other._pool is self._pool
            and other.block_id == self.block_id
        )

    def __hash__(self) -> int:
        return hash(self.block_id)

    def __repr__(self) -> str:
        return f"CpuBlock(block_id={self.block_id}, ref_cnt={self.ref_cnt})"


class _CachedBlocks:
    """``cached_block_hash_to_block``: lookup by ``BlockHashWithGroupId``."""

    def __init__(self, pool: CpuBlockPool) -> None:
        self._pool = pool

    def get_one_block(self, key: bytes) -> CpuBlock | None:
        b = self._pool._native.get_one_block(key)
        return None if b is None else self._pool.blocks[b]


class _SecondaryHashes:
    """``cached_block_hashes_by_block``: each block's secondary hashes (the keys it is
    reachable under besides its ``block_hash``), only blocks that have some."""

    def __init__(self, pool: CpuBlockPool) -> None:
        self._pool = pool

    def get(self, block_id: int, default: Any = None) -> Any:
        keys = self._pool._native.secondary_hashes(block_id)
        return set(keys) if keys else default

    def __getitem__(self, block_id: int) -> set[bytes]:
        keys = self.get(block_id)
        if keys is None:
            raise KeyError(block_id)
        return keys

    def __contains__(self, block_id: object) -> bool:
        return isinstance(block_id, int) and self.get(block_id) is not None


class _CpuCoordinator:
    """What vLLM's scheduler exposes of its CPU-side coordinator: whether hits are
    fine-grained, its pool and its groups' block sizes."""

    def __init__(
        self, enable_partial_hash_hits: bool, block_pool: CpuBlockPool, sizes: tuple[int, ...]
    ) -> None:
        self.enable_partial_hash_hits = enable_partial_hash_hits
        self.block_pool = block_pool
        self.group_block_sizes = sizes


class CpuBlockPool:
    """vLLM's ``cpu_block_pool`` over kvtier's CPU pool: what vLLM's tests and connector
    read (free count, blocks, lookup by hash), pin with (``touch``, ``free_blocks``) and seed
    hits with (``get_new_blocks``, ``cache_full_blocks``), each checked: a bad call raises
    ``ValueError`` and changes nothing. Releasing a reference the scheduler's own loads or
    stores hold corrupts its transfers, as it does in vLLM."""

    def __init__(self, native: _native.CpuBlockPool, hash_block_size: int) -> None:
        self._native = native
        self.hash_block_size = hash_block_size
        self.blocks: tuple[CpuBlock, ...] = tuple(
            CpuBlock(native, i) for i in range(native.num_blocks())
        )
        self.cached_block_hash_to_block = _CachedBlocks(self)
        self.cached_block_hashes_by_block = _SecondaryHashes(self)

    def get_num_free_blocks(self) -> int:
        return self._native.free_count()

    def touch(self, blocks: Iterable[CpuBlock]) -> None:
        self._native.touch([b.block_id for b in blocks])

    def free_blocks(self, ordered_blocks: Iterable[CpuBlock]) -> None:
        self._native.free_blocks([b.block_id for b in ordered_blocks])

    def get_new_blocks(self, num_blocks: int) -> list[CpuBlock]:
        """``num_blocks`` blocks from the front of the free queue, each with one reference
        (the caller's, given back with ``free_blocks``); ``ValueError`` when fewer are free."""
        return [self.blocks[b] for b in self._native.get_new_blocks(num_blocks)]

    def cache_full_blocks(
        self,
        request: Request,
        blocks: list[CpuBlock],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        kv_cache_group_id: int,
    ) -> None:
        """Caches ``blocks[num_cached_blocks:num_full_blocks]`` under the request's block
        hashes at ``block_size`` (each block keyed by the hash at its end) in group
        ``kv_cache_group_id``, as vLLM's ``BlockPool.cache_full_blocks`` does."""
        if block_size <= 0 or block_size % self.hash_block_size:
            raise ValueError(
                f"a block of {block_size} tokens is not a multiple of the hash block "
                f"({self.hash_block_size})"
            )
        per = block_size // self.hash_block_size
        hashes = request.block_hashes[per - 1 :: per]
        keys = [make_block_hash_with_group_id(h, kv_cache_group_id) for h in hashes]
        self._native.cache_full_blocks(
            [b.block_id for b in blocks], keys, num_cached_blocks, num_full_blocks, block_size
        )


class SimpleCPUOffloadScheduler:
    """vLLM 0.33.0's ``SimpleCPUOffloadScheduler`` (scheduler-side manager of
    ``SimpleCPUOffloadConnector``), with kvtier's bookkeeping. See the module docs."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        kv_cache_config: KVCacheConfig | None,
        cpu_capacity_bytes: int,
        scheduler_block_size: int,
        hash_block_size: int,
        lazy_offload: bool = False,
        disk_capacity_bytes: int = 0,
        use_page_cache: bool = False,
        num_cpu_blocks: int | None = None,
        aligned_num_cpu_blocks: int | None = None,
    ):
        self.vllm_config = vllm_config
        self.kv_cache_config = kv_cache_config
        offload_capacity = (
            disk_capacity_bytes if disk_capacity_bytes > 0 else cpu_capacity_bytes
        )
        self.block_size = scheduler_block_size
        self.hash_block_size = hash_block_size
        assert self.block_size % self.hash_block_size == 0
        assert kv_cache_config is not None
        self._layout, self._attention_group = _check_scope(
            vllm_config, kv_cache_config, scheduler_block_size, hash_block_size
        )
        groups = kv_cache_config.kv_cache_groups
        # vLLM's public names: the full-attention group (fa_gidx), each group's block size
        # (DCP-resolved) and the groups its stores, loads and lookups take part in.
        self.fa_gidx = self._attention_group
        dcp = vllm_config.parallel_config.decode_context_parallel_size
        self.group_block_sizes = tuple(
            resolve_dcp_kv_block_size(g.kv_cache_spec, dcp) for g in groups
        )
        self.fa_block_size = self.group_block_sizes[self.fa_gidx]
        self.prefix_cacheable_group_ids = kv_cache_config.prefix_cacheable_group_ids
        self.enable_kv_cache_events = (
            vllm_config.kv_events_config is not None
            and vllm_config.kv_events_config.enable_kv_cache_events
        )
        self.cp_world_size = vllm_config.parallel_config.decode_context_parallel_size
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
        scheduler_config = vllm_config.scheduler_config
        spec_config = vllm_config.speculative_config
        extra = _extra_config(vllm_config)
        max_num_seqs = getattr(scheduler_config, "max_num_seqs", 256)
        max_requests = int(extra.get("kvtier_max_requests", 4 * max_num_seqs + 64))
        # A request's table in its group of the smallest blocks.
        smallest = min(self.group_block_sizes)
        max_blocks = int(
            extra.get(
                "kvtier_max_blocks_per_request",
                min(
                    num_gpu_blocks,
                    _cdiv(vllm_config.model_config.max_model_len, smallest) + 64,
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
            size
            for size, (kind, _) in zip(self.group_block_sizes, self._layout)
            if kind != "scratch"
        ]
        per_block = max(1, max(cacheable_sizes) // hash_block_size - 1)
        secondary_hashes = int(
            extra.get(
                "kvtier_secondary_hashes", min(max(pool_blocks, 1) * per_block, 2**32 - 1)
            )
        )
        # One call records at most one event per key the CPU pool holds (a removal when a
        # step hands its block out, a store when its copy completes) plus a reset's clear;
        # the queue is drained after every call.
        event_capacity = min(max(pool_blocks, 0) + secondary_hashes + 64, 2**32 - 1)
        self._native = _native.SimpleScheduler(
            self.block_size,
            num_gpu_blocks,
            offload_capacity,
            gpu_bytes,
            num_cpu_blocks,
            aligned_num_cpu_blocks,
            bool(lazy_offload),
            scheduler_config.max_num_batched_tokens,
            vllm_config.parallel_config.world_size,
            # A dense model's eager scan holds the re-prefillable tail back; a hybrid one's
            # only for its EAGLE groups.
            vllm_config.num_prefill_lookahead_tokens,
            disk_capacity_bytes > 0,
            bool(use_page_cache),
            max_requests,
            max_blocks,
            self.enable_kv_cache_events,
            event_capacity,
            self._layout,
            hash_block_size,
            list(self.group_block_sizes),
            dcp,
            secondary_hashes,
            spec_config is not None and bool(spec_config.use_eagle_block_drop()),
            [i for i, g in enumerate(groups) if g.is_eagle_group],
        )
        self.num_cpu_blocks: int = self._native.num_cpu_blocks()
        self.cpu_block_pool = CpuBlockPool(self._native.cpu_pool(), hash_block_size)
        self.cpu_coordinator = _CpuCoordinator(
            self._native.partial_hash_hits(), self.cpu_block_pool, self.group_block_sizes
        )
        self.kv_event_medium = MEDIUM_STORAGE if disk_capacity_bytes > 0 else MEDIUM_CPU
        self._lazy_mode = bool(lazy_offload)
        self._expected_worker_count: int = vllm_config.parallel_config.world_size
        self._target_free: int = self._native.target_free()
        self._gpu_block_pool: BlockPool | None = None
        # The request objects of eager store states (vLLM's StoreRequestState.request): the
        # progress a step's scan and a finish-time flush read.
        self._requests: dict[str, Request] = {}
        # KV-cache events (when enabled): those not yet taken, the BlockStored payloads of
        # each issued store event (captured when it is issued, emitted when it completes),
        # and the requests of the finish-time flushes queued since the last step.
        # Each group's spec kind and sliding window, as its events name them.
        self._spec_meta = [
            (
                get_kv_cache_spec_kind(g.kv_cache_spec).value,
                get_kv_cache_spec_sliding_window(g.kv_cache_spec),
            )
            for g in kv_cache_config.kv_cache_groups
        ]
        self._events: list[KVCacheEvent] = []
        self._store_payloads: dict[int, list[tuple[Any, ...]]] = {}
        self._flush_requests: dict[int, Request] = {}
        # The payload captures of prepared stores (prepare_store_specs), by CPU block, until
        # the next build_connector_meta issues them.
        self._prepared: dict[int, tuple[Any, ...]] = {}

    def _tables(self, block_ids: Sequence[Sequence[int] | None]) -> list[list[int]]:
        """A request's block ids per group as the native module takes them: every
        prefix-cacheable group's (a missing one empty), and an empty list for each scratch
        group (vLLM's scheduler side never reads those tables)."""
        return [
            list(ids) if kind != "scratch" and ids is not None else []
            for (kind, _), ids in zip(
                self._layout,
                (*block_ids, *([None] * (len(self._layout) - len(block_ids)))),
            )
        ]

    def _drop_forgotten(self) -> None:
        for req_id in self._native.take_forgotten():
            self._requests.pop(req_id, None)
        if self.enable_kv_cache_events:
            for kind, key in self._native.take_pool_events():
                if kind == "removed":
                    self._events.append(
                        BlockRemoved(
                            block_hashes=[maybe_convert_block_hash(get_block_hash(key))],
                            medium=self.kv_event_medium,
                            group_idx=get_group_id(key),
                            locality="LOCAL",
                        )
                    )
                else:
                    self._events.append(AllBlocksCleared())

    def _payload_request(self, lst, req_id, key, scheduled):
        """The request a positional store's payload reads: named by its parent hash's list,
        or (a first block) the request whose table named it. A first block may have been
        freed and hashed by another request since (the scan reads the ids the connector
        was given), so the hash does not tell; a finishing request's id may be released
        before its flush is issued, but its flush reads the table given at finish, whose
        blocks still hold its own hashes."""
        if lst is not None:
            return scheduled[lst] if lst < _FLUSH_LISTS else self._flush_requests[lst]
        for r in (*scheduled, *self._flush_requests.values()):
            if r is not None and req_id is not None and r.request_id == req_id:
                return r
        # A first block's hash is the request's hash at the block's end.
        raw = get_block_hash(key)
        last = self.group_block_sizes[get_group_id(key)] // self.hash_block_size - 1
        for r in self._flush_requests.values():
            if len(r.block_hashes) > last and r.block_hashes[last] == raw:
                return r
        raise AssertionError(f"the request {req_id!r} of a stored block is unknown")

    def _store_capture(self, gpu_block: int, cpu_block: int, scheduled) -> tuple[Any, ...]:
        """What one block of a store event needs for its ``BlockStored`` events, captured
        when the event is issued: the GPU block, and for a positional store the request
        whose tokens it holds and its first token."""
        assert self._gpu_block_pool is not None
        meta = self._native.stored_meta(cpu_block)
        if meta is None:
            return (gpu_block, None, 0)
        lst, _, start, req_id = meta
        key = self._gpu_block_pool.blocks[gpu_block].block_hash
        return (gpu_block, self._payload_request(lst, req_id, key, scheduled), start)

    def _payload(
        self, request: Request, first: int, end: int, block_size: int | None = None
    ) -> BlockStoreMeta:
        """vLLM's payload of ``request``'s tokens ``first..end``: the tokens, the hash before
        them (the parent), the LoRA and the extra keys."""
        h = first // self.hash_block_size
        lora = request.lora_request
        extra, _ = generate_block_hash_extra_keys(request, first, end, 0)
        return BlockStoreMeta(
            token_ids=list(request.all_token_ids[first:end]),
            parent_block_hash=(
                maybe_convert_block_hash(request.block_hashes[h - 1]) if h else None
            ),
            lora_id=lora.adapter_id if lora else None,
            lora_name=lora.name if lora else None,
            extra_keys=extra,
            block_size=block_size,
        )

    def _inner_hashes(self, key: bytes, request: Request, start: int) -> dict[bytes, int]:
        """The keys of ``request``'s hash blocks inside the block stored under ``key`` from
        token ``start``, other than ``key`` itself, each with its first token."""
        group = get_group_id(key)
        hb = self.hash_block_size
        inner: dict[bytes, int] = {}
        for h in range(start // hb, (start + self.group_block_sizes[group]) // hb):
            if h < len(request.block_hashes):
                k = make_block_hash_with_group_id(request.block_hashes[h], group)
                if k != key:
                    inner[k] = h * hb
        return inner

    def _block_stored(
        self, key: bytes, request: Request | None, start: int, size: int
    ) -> BlockStored:
        """vLLM's ``BlockStored`` for ``key`` of ``size`` tokens: with ``request``, the
        payload of its tokens from ``start`` (empty when the request has fewer)."""
        group = get_group_id(key)
        kind, window = self._spec_meta[group]
        meta = None
        if request is not None and start + size <= len(request.all_token_ids):
            meta = self._payload(request, start, start + size)
        return BlockStored(
            block_hashes=[maybe_convert_block_hash(get_block_hash(key))],
            parent_block_hash=meta and meta.parent_block_hash,
            token_ids=meta.token_ids if meta else [],
            block_size=size,
            lora_id=meta and meta.lora_id,
            medium=self.kv_event_medium,
            lora_name=meta and meta.lora_name,
            extra_keys=to_event_extra_keys(meta and meta.extra_keys and [meta.extra_keys]),
            group_idx=group,
            kv_cache_spec_kind=kind,
            kv_cache_spec_sliding_window=window,
            locality="LOCAL",
        )

    def _completed_events(self, captures: list[tuple[Any, ...]]) -> Iterable[BlockStored]:
        """The ``BlockStored`` events of a completed store, block by block: the GPU block's
        hash, then each secondary hash it holds (the request's own hash block at that
        boundary, or without a payload and block size 0)."""
        assert self._gpu_block_pool is not None
        pool = self._gpu_block_pool
        hb = self.hash_block_size
        for gpu_block, request, start in captures:
            key = pool.blocks[gpu_block].block_hash
            size = self.group_block_sizes[get_group_id(key)]
            yield self._block_stored(key, request, start, size)
            inner = self._inner_hashes(key, request, start) if request is not None else {}
            for secondary in pool.cached_block_hashes_by_block.get(gpu_block, ()):
                at = inner.get(secondary)
                if at is None:
                    yield self._block_stored(secondary, None, 0, 0)
                else:
                    yield self._block_stored(secondary, request, at, hb)

    def bind_gpu_block_pool(self, gpu_block_pool: BlockPool) -> None:
        """The GPU pool the scheduler built; every later call reads and pins it."""
        self._native.bind(gpu_block_pool)
        self._gpu_block_pool = gpu_block_pool

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        """``(num_new_tokens, is_async)`` from consecutive CPU cache hits (pinned until
        ``update_state_after_alloc``)."""
        if (
            not request.skip_reading_prefix_cache
            and num_computed_tokens % self.block_size != 0
        ):
            logger.warning_once(
                "SimpleCPU external lookup requires scheduler-block-aligned local tokens, "
                "got %d tokens with scheduler block size %d.",
                num_computed_tokens,
                self.block_size,
            )
        answer = self._native.get_num_new_matched_tokens(
            request.request_id,
            request.block_hashes,
            request.num_tokens,
            num_computed_tokens,
            request.skip_reading_prefix_cache,
        )
        self._drop_forgotten()
        return answer

    def update_state_after_alloc(
        self,
        request: Request,
        blocks: KVCacheBlocks,
        num_external_tokens: int,
    ) -> None:
        """Registers the request's store state (eager mode) and turns its pending hit into
        a load into ``blocks``."""
        req_id = request.request_id
        if not self._lazy_mode and req_id not in self._requests:
            self._requests[req_id] = request
        self._native.update_state_after_alloc(
            req_id, self._tables(blocks.get_block_ids()), num_external_tokens
        )
        self._drop_forgotten()

    def _step_args(
        self, scheduler_output: SchedulerOutput
    ) -> tuple[tuple[Any, ...], list[Request | None]]:
        """The native step argument ``(handoffs, preempted, finished, scheduled)`` of a
        scheduler output, and the scheduled requests (``None`` for one not tracked)."""
        handoffs: list[tuple[str, list[int]]] = []
        scheduled: list[tuple[Any, ...]] = []
        scheduled_requests: list[Request | None] = []
        if not self._lazy_mode:
            block_state = scheduler_output.kv_connector_block_state
            if block_state is not None:
                handoffs = [
                    (req_id, [entry[1] for entry in entries])
                    for req_id, entries in block_state.boundary_state_offloads.items()
                ]
            num_scheduled = scheduler_output.num_scheduled_tokens
            for req_id, groups, is_full_table in yield_req_data(scheduler_output):
                new_ids = self._tables(groups) if groups else None
                request = self._requests.get(req_id)
                scheduled_requests.append(request)
                if request is None:
                    scheduled.append((req_id, new_ids, is_full_table, 0, 0, 0, None))
                    continue
                scheduled.append(
                    (
                        req_id,
                        new_ids,
                        is_full_table,
                        num_scheduled.get(req_id, 0),
                        request.num_computed_tokens,
                        request.num_output_placeholders,
                        request.block_hashes,
                    )
                )
        preempted = list(scheduler_output.preempted_req_ids or ())
        finished = list(scheduler_output.finished_req_ids)
        return (handoffs, preempted, finished, scheduled), scheduled_requests

    def prepare_store_specs(
        self, scheduler_output: SchedulerOutput
    ) -> tuple[
        list[int], list[int], list[str], list[dict[BlockHashWithGroupId, BlockStoreMeta]] | None
    ]:
        """The store half of ``build_connector_meta``: ``(gpu_block_ids, cpu_block_ids,
        req_ids, block_meta)`` as vLLM's, ``block_meta`` (one dict of payloads a block,
        empty for a hand-off) ``None`` without KV events or in lazy mode. The stores are
        planned as ``build_connector_meta`` plans them (outcomes counted, blocks allocated
        and pinned); vLLM's method then leaves them in no store event, kvtier's next
        ``build_connector_meta`` issues them after that step's own stores, and ``reset``
        releases them."""
        meta: list[dict[BlockHashWithGroupId, BlockStoreMeta]] | None = (
            [] if self.enable_kv_cache_events and not self._lazy_mode else None
        )
        if self._gpu_block_pool is None:
            return [], [], [], meta
        args, scheduled_requests = self._step_args(scheduler_output)
        gpu, cpu, req_ids = self._native.prepare_store_specs(args)
        if self.enable_kv_cache_events:
            for g, c in zip(gpu, cpu, strict=True):
                capture = self._store_capture(g, c, scheduled_requests)
                self._prepared[c] = capture
                if meta is not None:
                    meta.append(self._store_meta(*capture))
            self._drop_forgotten()
        return gpu, cpu, req_ids, meta

    def _store_meta(
        self, gpu_block: int, request: Request | None, start: int
    ) -> dict[BlockHashWithGroupId, BlockStoreMeta]:
        """vLLM's event payloads of a positional store of ``gpu_block`` from ``request``'s
        token ``start``: its own hash's, then each other hash block's inside it; none for a
        hand-off."""
        if request is None:
            return {}
        assert self._gpu_block_pool is not None
        key = self._gpu_block_pool.blocks[gpu_block].block_hash
        hb, size = self.hash_block_size, self.group_block_sizes[get_group_id(key)]
        out = {key: self._payload(request, start, start + size)}
        for k, at in self._inner_hashes(key, request, start).items():
            out[k] = self._payload(request, at, at + hb, hb)
        return out

    def build_connector_meta(
        self, scheduler_output: SchedulerOutput
    ) -> SimpleCPUOffloadMetadata:
        """This step's store and load events."""
        preempted = list(scheduler_output.preempted_req_ids or ())
        if self._gpu_block_pool is None:
            return SimpleCPUOffloadMetadata(need_flush=bool(preempted))
        args, scheduled_requests = self._step_args(scheduler_output)
        (
            store_event,
            store_gpu,
            store_cpu,
            load_event,
            load_gpu,
            load_cpu,
            load_event_to_reqs,
            need_flush,
        ) = self._native.build_connector_meta(args)
        if self.enable_kv_cache_events:
            if store_event >= 0:
                self._store_payloads[store_event] = [
                    self._prepared.pop(c, None) or self._store_capture(g, c, scheduled_requests)
                    for g, c in zip(store_gpu, store_cpu, strict=True)
                ]
            self._flush_requests.clear()
            self._drop_forgotten()
        return SimpleCPUOffloadMetadata(
            load_event=load_event,
            load_gpu_blocks=load_gpu,
            load_cpu_blocks=load_cpu,
            load_event_to_reqs=load_event_to_reqs,
            store_event=store_event,
            store_gpu_blocks=store_gpu,
            store_cpu_blocks=store_cpu,
            need_flush=need_flush,
        )

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        """Finished loads, and stores every worker reported."""
        finished_recving = list(connector_output.finished_recving or [])
        meta = connector_output.kv_connector_worker_meta
        completed = (
            list(meta.completed_store_events.items())
            if isinstance(meta, SimpleCPUOffloadWorkerMetadata)
            else []
        )
        self._native.update_connector_output(finished_recving, completed)
        self._drop_forgotten()
        for event, _ in completed:
            captures = self._store_payloads.get(event)
            if captures is not None and self._native.store_event_state(event) is None:
                self._events.extend(self._completed_events(captures))
                del self._store_payloads[event]

    def has_pending_stores(self) -> bool:
        """Whether a store transfer is queued or in flight."""
        return self._native.has_pending_stores()

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        """Releases the request's pending hit, unissued load and (once its stores are done)
        store state. Always ``(False, None)``."""
        self._native.request_finished(request.request_id)
        self._drop_forgotten()
        return False, None

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        """Queues the finishing request's confirmed blocks not yet stored (eager mode), then
        ``request_finished``."""
        req_id = request.request_id
        if self._native.is_storing(req_id) and any(
            ids is None and kind not in ("scratch", "mamba")
            for (kind, _), ids in zip(self._layout, block_ids)
        ):
            # vLLM's finish-time scan takes the length of every positional group's table.
            raise TypeError("object of type 'NoneType' has no len()")
        tracked = self._requests.get(req_id, request)
        flush_list = self._native.request_finished_all_groups(
            req_id,
            self._tables(block_ids),
            tracked.num_computed_tokens,
            tracked.num_output_placeholders,
            tracked.block_hashes,
            # Read (as vLLM reads it) only for a fine-grained partial tail.
            tracked.num_prompt_tokens if self.cpu_coordinator.enable_partial_hash_hits else 0,
        )
        if self.enable_kv_cache_events and flush_list is not None:
            self._flush_requests[flush_list] = tracked
        self._drop_forgotten()
        return False, None

    def get_boundary_store_stats(self) -> BoundaryStoreStats:
        """The cumulative boundary hand-off outcomes."""
        (
            published,
            stored,
            dropped_cpu_full,
            dropped_request_gone,
            skipped_already_cached,
            skipped_in_flight,
            dropped_null_block,
            dropped_not_hashed,
        ) = self._native.boundary_store_stats()
        return BoundaryStoreStats(
            published=published,
            stored=stored,
            dropped_cpu_full=dropped_cpu_full,
            dropped_request_gone=dropped_request_gone,
            skipped_already_cached=skipped_already_cached,
            skipped_in_flight=skipped_in_flight,
            dropped_null_block=dropped_null_block,
            dropped_not_hashed=dropped_not_hashed,
        )

    def get_stats(self) -> SimpleCPUOffloadStats:
        """Drains the interval's stats."""
        stats = SimpleCPUOffloadStats()
        series = self._native.get_stats()
        series.sort(key=lambda s: _STATS_ORDER.get((s[0], s[1]), 200))
        for name, labelvalues, is_counter, value in series:
            if is_counter:
                stats.increase_counter(name, value, labelvalues)
            else:
                stats.set_gauge(name, value, labelvalues)
        return stats

    def take_events(self) -> Iterable[KVCacheEvent]:
        """The CPU prefix cache's events since the last call (vLLM's: ``BlockStored`` when a
        store completes, ``BlockRemoved`` when a CPU block is reused, ``AllBlocksCleared``
        on a reset that cleared it)."""
        events, self._events = self._events, []
        return events

    def reset(self) -> bool:
        """Abandons pending transfers; whether the CPU prefix cache was cleared."""
        answer = self._native.reset()
        self._requests.clear()
        self._store_payloads.clear()  # abandoned: their completions cache nothing
        self._flush_requests.clear()
        self._prepared.clear()  # released
        self._drop_forgotten()
        return answer
