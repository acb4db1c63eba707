"""kvtier as a vLLM 0.33.0 offloading spec.

Load it with vLLM's out-of-tree spec mechanism::

    --kv-transfer-config '{"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
      "kv_connector_extra_config": {"spec_name": "KvtierOffloadingSpec",
      "spec_module_path": "kvtier.vllm", "cpu_bytes_to_use": 68719476736}}'

``KvtierOffloadingSpec`` is vLLM's ``CPUOffloadingSpec`` (same extra-config keys, same
worker) whose scheduler-side manager is ``KvtierOffloadingManager``: vLLM's
``CPUOffloadingManager`` reproduced by kvtier's Rust manager, with vLLM's own types.

vLLM's classes are imported from the installed vLLM; this module needs vLLM, ``kvtier`` does
not.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable, Sequence

from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
    OffloadingConnectorStats,
)
from vllm.v1.kv_offload.base import (
    ConfigInfoMapping,
    LoadStoreSpec,
    LookupResult,
    Medium,
    OffloadingEvent,
    OffloadingManager,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
)
from vllm.v1.kv_offload.cpu.common import (
    CPULoadStoreSpec,
    CPUOffloadingInfo,
    CPUOffloadingMetrics,
)
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from kvtier import _native

__all__ = ["KvtierOffloadingManager", "KvtierOffloadingSpec"]

_VOCAB = (
    LookupResult.MISS,
    LookupResult.HIT_PENDING,
    LookupResult.HIT,
    CPULoadStoreSpec,
    PrepareStoreOutput,
    OffloadingEvent,
    Medium.CPU,
    RequestOffloadingContext,
    ReqContext,
)

# The methods whose calls go straight to the native manager (no Python frame in between);
# `lookup`, the most frequent, through its raw entry (`_bound_lookup`, the same method).
_DIRECT = (
    "prepare_load",
    "touch",
    "complete_load",
    "prepare_store",
    "complete_store",
    "on_new_request",
    "on_request_finished",
)


class KvtierOffloadingManager(OffloadingManager):
    """vLLM 0.33.0's ``CPUOffloadingManager``, in Rust.

    Takes exactly ``CPUOffloadingManager``'s keywords. ``cache_policy`` is ``"lru"`` or
    ``"arc"``; out-of-tree policies (``cache_policy_module_path``) are not supported. Every
    answer is vLLM's own type with vLLM's values: the same chunk ids, the same victims in the
    same order, the same events and stats. Where vLLM's manager asserts, this raises the same
    exception type with kvtier's message and changes nothing.
    """

    def __init__(
        self,
        num_chunks: int,
        cache_policy: str = "lru",
        cache_policy_module_path: str | None = None,
        enable_events: bool = False,
        store_threshold: int = 1,
        max_tracker_size: int = 64_000,
        info: CPUOffloadingInfo | None = None,
    ):
        if cache_policy_module_path is not None:
            raise ValueError(
                "kvtier implements the built-in 'lru' and 'arc' cache policies only; "
                f"cache_policy_module_path={cache_policy_module_path!r} (an out-of-tree "
                "policy) is not supported: use vLLM's CPUOffloadingSpec for it"
            )
        self.medium: Medium = Medium.CPU
        self.store_threshold: int = store_threshold
        self.max_tracker_size: int = max_tracker_size
        self._config_info: ConfigInfoMapping = (
            info.as_config_info() if info is not None else {}
        )
        self._native = _native.Manager(
            num_chunks,
            cache_policy,
            store_threshold,
            max_tracker_size,
            enable_events,
            _VOCAB,
        )
        for name in _DIRECT:
            setattr(self, name, getattr(self._native, name))
        self.lookup = self._native._bound_lookup()

    # The class-level methods below are what the instance attributes set in __init__ call.

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        return self._native.lookup(key, req_context)

    def get_load_source(
        self, key: OffloadKey, req_context: ReqContext
    ) -> CacheHitSource:
        return CacheHitSource.HOST

    def prepare_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> LoadStoreSpec:
        return self._native.prepare_load(keys, req_context)

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self._native.touch(keys, req_context)

    def complete_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> None:
        self._native.complete_load(keys, req_context)

    def prepare_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        return self._native.prepare_store(keys, req_context)

    def complete_store(
        self,
        keys: Collection[OffloadKey],
        req_context: ReqContext,
        success: bool = True,
    ) -> None:
        self._native.complete_store(keys, req_context, success)

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return self._native.on_new_request(req_context)

    def on_request_finished(self, req_context: ReqContext) -> None:
        self._native.on_request_finished(req_context)

    def take_events(self) -> Iterable[OffloadingEvent]:
        return iter(self._native.take_events())

    def reset_cache(self) -> None:
        self._native.reset_cache()

    def config_info(self) -> Sequence[ConfigInfoMapping]:
        return [self._config_info]

    def get_stats(self) -> OffloadingConnectorStats:
        num_used, write_pending, num_chunks, sizes, skipped = self._native.take_stats()
        stats = OffloadingConnectorStats()
        usage = num_used / num_chunks if num_chunks > 0 else 0.0
        stats.set_gauge(CPUOffloadingMetrics.CPU_CACHE_USAGE_PERC, usage)
        for size in sizes:
            stats.observe_histogram(CPUOffloadingMetrics.CPU_ALLOCATION_SIZE, size)
        write_usage = write_pending / num_chunks if num_chunks > 0 else 0.0
        stats.set_gauge(CPUOffloadingMetrics.CPU_CACHE_WRITE_USAGE_PERC, write_usage)
        stats.set_gauge(
            CPUOffloadingMetrics.CPU_CACHE_READ_USAGE_PERC,
            max(usage - write_usage, 0.0),
        )
        if skipped is not None:
            stats.increase_counter(CPUOffloadingMetrics.STORES_SKIPPED, skipped)
        return stats

    # vLLM's public state of the reuse filter.

    @property
    def counts(self) -> OrderedDict[OffloadKey, int] | None:
        """vLLM's reuse tracker: the offer count of each tracked key, least recently offered
        first; ``None`` without a reuse filter (``store_threshold`` below 2). Each read is a
        new snapshot: changing it changes nothing in the manager."""
        entries = self._native.tracker_entries()
        return None if entries is None else OrderedDict(entries)

    @property
    def stores_skipped_in_current_batch(self) -> int:
        """Store candidates the reuse filter skipped since the last ``get_stats()`` (0 without
        a filter)."""
        return self._native.stores_skipped()

    # Introspection for tests and operators.

    def interned_keys(self) -> int:
        """Distinct keys the manager's key table holds now (at most about twice the keys
        the manager itself holds: resident, ghost, tracked, in live requests and events)."""
        return self._native.interned_keys()

    def live_requests(self) -> int:
        """Request states the manager holds now."""
        return self._native.live_requests()


class KvtierOffloadingSpec(CPUOffloadingSpec):
    """vLLM's ``CPUOffloadingSpec`` with kvtier's manager on the scheduler side.

    Reads the same ``kv_connector_extra_config`` keys (``cpu_bytes_to_use``,
    ``eviction_policy``, ``store_threshold``, ``max_tracker_size``, ...) and uses vLLM's CPU
    worker unchanged.
    """

    def get_manager(self) -> OffloadingManager:
        if not self._manager:
            self._manager = KvtierOffloadingManager(
                num_chunks=self.num_chunks,
                cache_policy=self.eviction_policy,
                cache_policy_module_path=self.cache_policy_module_path,
                enable_events=self.kv_events_config.enable_kv_cache_events,
                store_threshold=int(self.extra_config.get("store_threshold", 0)),
                max_tracker_size=int(self.extra_config.get("max_tracker_size", 64_000)),
                info=self.cpu_info,
            )
        return self._manager


def __getattr__(name: str):
    """``KvtierSimpleCPUOffloadConnector`` (vLLM's simple CPU offload connector with kvtier's
    scheduler-side manager, ``kvtier.simple_connector``), imported on first use so that the
    offloading spec above does not import vLLM's simple offloader."""
    if name == "KvtierSimpleCPUOffloadConnector":
        from kvtier.simple_connector import KvtierSimpleCPUOffloadConnector

        return KvtierSimpleCPUOffloadConnector
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
