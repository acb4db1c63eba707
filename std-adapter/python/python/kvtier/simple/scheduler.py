"""``SimpleCPUOffloadScheduler``: vLLM's scheduler-side calls, each answered by the native
scheduler (``kvtier._native.SimpleScheduler``) with vLLM's own types."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_events import MEDIUM_CPU, MEDIUM_STORAGE
from vllm.logger import init_logger
from vllm.v1.core.kv_cache_utils import BlockHashWithGroupId, resolve_dcp_kv_block_size
from vllm.v1.simple_kv_offload.metadata import (
    SimpleCPUOffloadMetadata,
    SimpleCPUOffloadWorkerMetadata,
)

from kvtier import _native
from kvtier.simple import metrics
from kvtier.simple.events import StoreEvents
from kvtier.simple.layout import check_scope
from kvtier.simple.pool import CpuBlockPool, CpuCoordinator
from kvtier.simple.sizing import Sizes, native_sizes
from kvtier.simple.step import step_args, tables

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from vllm.config import VllmConfig
    from vllm.distributed.kv_events import KVCacheEvent
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request
    from vllm.v1.simple_kv_offload.manager import BlockStoreMeta, BoundaryStoreStats
    from vllm.v1.simple_kv_offload.metrics import SimpleCPUOffloadStats

# Named after the package, as its records were when it was one module.
logger = init_logger("kvtier.simple")


class SimpleCPUOffloadScheduler:
    """vLLM 0.33.0's ``SimpleCPUOffloadScheduler`` (scheduler-side manager of
    ``SimpleCPUOffloadConnector``), with kvtier's bookkeeping. See ``kvtier.simple``'s docs."""

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
        self._layout, self._attention_group = check_scope(
            vllm_config, kv_cache_config, scheduler_block_size
        )
        # vLLM's public names: the full-attention group (fa_gidx), each group's block size
        # (DCP-resolved) and the groups its stores, loads and lookups take part in.
        self.fa_gidx = self._attention_group
        dcp = vllm_config.parallel_config.decode_context_parallel_size
        groups = kv_cache_config.kv_cache_groups
        self.group_block_sizes = tuple(
            resolve_dcp_kv_block_size(g.kv_cache_spec, dcp) for g in groups
        )
        self.fa_block_size = self.group_block_sizes[self.fa_gidx]
        self.prefix_cacheable_group_ids = kv_cache_config.prefix_cacheable_group_ids
        self.enable_kv_cache_events = (
            vllm_config.kv_events_config is not None
            and vllm_config.kv_events_config.enable_kv_cache_events
        )
        self.cp_world_size = dcp
        sizes = native_sizes(
            vllm_config,
            kv_cache_config,
            self._layout,
            self.group_block_sizes,
            hash_block_size,
            offload_capacity,
            num_cpu_blocks,
            aligned_num_cpu_blocks,
        )
        self._native = self._native_scheduler(
            sizes,
            offload_capacity,
            num_cpu_blocks,
            aligned_num_cpu_blocks,
            lazy_offload=bool(lazy_offload),
            disk=disk_capacity_bytes > 0,
            page_cache=bool(use_page_cache),
        )
        self.num_cpu_blocks: int = self._native.num_cpu_blocks()
        self.cpu_block_pool = CpuBlockPool(self._native.cpu_pool(), hash_block_size)
        self.cpu_coordinator = CpuCoordinator(
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
        # KV-cache events (when enabled): those not yet taken, and what the stores in
        # flight need to report theirs.
        self._kv_events = StoreEvents(
            kv_cache_config, hash_block_size, self.group_block_sizes, self.kv_event_medium
        )

    def _native_scheduler(
        self,
        sizes: Sizes,
        offload_capacity: int,
        num_cpu_blocks: int | None,
        aligned_num_cpu_blocks: int | None,
        *,
        lazy_offload: bool,
        disk: bool,
        page_cache: bool,
    ) -> _native.SimpleScheduler:
        """The native scheduler of this configuration (the layout, block sizes and vLLM's
        public names already set)."""
        vllm_config = self.vllm_config
        groups = self.kv_cache_config.kv_cache_groups
        spec_config = vllm_config.speculative_config
        return _native.SimpleScheduler(
            self.block_size,
            sizes.num_gpu_blocks,
            offload_capacity,
            sizes.gpu_bytes,
            num_cpu_blocks,
            aligned_num_cpu_blocks,
            lazy_offload,
            vllm_config.scheduler_config.max_num_batched_tokens,
            vllm_config.parallel_config.world_size,
            # A dense model's eager scan holds the re-prefillable tail back; a hybrid one's
            # only for its EAGLE groups.
            vllm_config.num_prefill_lookahead_tokens,
            disk,
            page_cache,
            sizes.max_requests,
            sizes.max_blocks,
            self.enable_kv_cache_events,
            sizes.event_capacity,
            self._layout,
            self.hash_block_size,
            list(self.group_block_sizes),
            self.cp_world_size,
            sizes.secondary_hashes,
            spec_config is not None and bool(spec_config.use_eagle_block_drop()),
            [i for i, g in enumerate(groups) if g.is_eagle_group],
        )

    def _tables(self, block_ids: Sequence[Sequence[int] | None]) -> list[list[int]]:
        """A request's block ids per group as the native module takes them."""
        return tables(self._layout, block_ids)

    def _drop_forgotten(self) -> None:
        for req_id in self._native.take_forgotten():
            self._requests.pop(req_id, None)
        if self.enable_kv_cache_events:
            self._kv_events.record_pool_events(self._native.take_pool_events())

    def _step_args(
        self, scheduler_output: SchedulerOutput
    ) -> tuple[tuple[Any, ...], list[Request | None]]:
        """The native step argument of a scheduler output, and the scheduled requests."""
        return step_args(scheduler_output, self._layout, self._lazy_mode, self._requests)

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
            events, pool = self._kv_events, self._gpu_block_pool
            for g, c in zip(gpu, cpu, strict=True):
                capture = events.capture(self._native, pool, g, c, scheduled_requests)
                events.prepared[c] = capture
                if meta is not None:
                    meta.append(events.store_meta(pool, *capture))
            self._drop_forgotten()
        return gpu, cpu, req_ids, meta

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
            events = self._kv_events
            if store_event >= 0:
                events.store_payloads[store_event] = [
                    events.prepared.pop(c, None)
                    or events.capture(
                        self._native, self._gpu_block_pool, g, c, scheduled_requests
                    )
                    for g, c in zip(store_gpu, store_cpu, strict=True)
                ]
            events.flush_requests.clear()
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
        self._kv_events.record_completed(
            self._native, self._gpu_block_pool, (event for event, _ in completed)
        )

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
            self._kv_events.flush_requests[flush_list] = tracked
        self._drop_forgotten()
        return False, None

    def get_boundary_store_stats(self) -> BoundaryStoreStats:
        """The cumulative boundary hand-off outcomes."""
        return metrics.boundary_store_stats(self._native.boundary_store_stats())

    def get_stats(self) -> SimpleCPUOffloadStats:
        """Drains the interval's stats."""
        return metrics.stats(self._native.get_stats())

    def take_events(self) -> Iterable[KVCacheEvent]:
        """The CPU prefix cache's events since the last call (vLLM's: ``BlockStored`` when a
        store completes, ``BlockRemoved`` when a CPU block is reused, ``AllBlocksCleared``
        on a reset that cleared it)."""
        return self._kv_events.take()

    def reset(self) -> bool:
        """Abandons pending transfers; whether the CPU prefix cache was cleared."""
        answer = self._native.reset()
        self._requests.clear()
        self._kv_events.clear_in_flight()
        self._drop_forgotten()
        return answer
