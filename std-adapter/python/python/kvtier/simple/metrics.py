"""The simple offloader's metrics as vLLM's types carry them: the interval's stats
(``SimpleCPUOffloadStats``) and the cumulative boundary hand-off outcomes
(``BoundaryStoreStats``), from the native scheduler's flat answers."""

from __future__ import annotations

from typing import Any

from vllm.v1.simple_kv_offload.manager import BoundaryStoreStats
from vllm.v1.simple_kv_offload.metrics import (
    OUTCOME_TO_FIELD,
    MetricName,
    SimpleCPUOffloadStats,
)

# The order vLLM's get_stats fills its payload in.
STATS_ORDER = {
    **{
        (MetricName.SAVE_OUTCOMES, (outcome,)): i
        for i, outcome in enumerate(OUTCOME_TO_FIELD)
    },
    (MetricName.LOAD_BLOCKS, ()): 100,
    (MetricName.USED_BLOCKS, ()): 101,
    (MetricName.PENDING_STORE_BLOCKS, ()): 102,
}


def stats(series: list[tuple[Any, ...]]) -> SimpleCPUOffloadStats:
    """The native ``(name, labelvalues, is_counter, value)`` series, in vLLM's order."""
    out = SimpleCPUOffloadStats()
    series.sort(key=lambda s: STATS_ORDER.get((s[0], s[1]), 200))
    for name, labelvalues, is_counter, value in series:
        if is_counter:
            out.increase_counter(name, value, labelvalues)
        else:
            out.set_gauge(name, value, labelvalues)
    return out


def boundary_store_stats(counts: tuple[int, ...]) -> BoundaryStoreStats:
    """The native outcome counts, in ``BoundaryStoreStats``' field order."""
    (
        published,
        stored,
        dropped_cpu_full,
        dropped_request_gone,
        skipped_already_cached,
        skipped_in_flight,
        dropped_null_block,
        dropped_not_hashed,
    ) = counts
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
