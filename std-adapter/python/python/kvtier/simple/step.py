"""vLLM's scheduler output as the native scheduler takes it: each request's block tables
(one list per group) and one step's ``(handoffs, preempted, finished, scheduled)``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.utils import yield_req_data

if TYPE_CHECKING:
    from collections.abc import Sequence

    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.request import Request

    from kvtier.simple.layout import Layout


def tables(layout: Layout, block_ids: Sequence[Sequence[int] | None]) -> list[list[int]]:
    """A request's block ids per group as the native module takes them: every
    prefix-cacheable group's (a missing one empty), and an empty list for each scratch
    group (vLLM's scheduler side never reads those tables)."""
    return [
        list(ids) if kind != "scratch" and ids is not None else []
        for (kind, _), ids in zip(
            layout,
            (*block_ids, *([None] * (len(layout) - len(block_ids)))),
        )
    ]


def step_args(
    scheduler_output: SchedulerOutput,
    layout: Layout,
    lazy_mode: bool,
    requests: dict[str, Request],
) -> tuple[tuple[Any, ...], list[Request | None]]:
    """The native step argument ``(handoffs, preempted, finished, scheduled)`` of a
    scheduler output, and the scheduled requests (``None`` for one not in ``requests``,
    the eager store states' requests). Lazy mode passes no hand-offs and no scheduled
    requests."""
    handoffs: list[tuple[str, list[int]]] = []
    scheduled: list[tuple[Any, ...]] = []
    scheduled_requests: list[Request | None] = []
    if not lazy_mode:
        block_state = scheduler_output.kv_connector_block_state
        if block_state is not None:
            handoffs = [
                (req_id, [entry[1] for entry in entries])
                for req_id, entries in block_state.boundary_state_offloads.items()
            ]
        num_scheduled = scheduler_output.num_scheduled_tokens
        for req_id, groups, is_full_table in yield_req_data(scheduler_output):
            new_ids = tables(layout, groups) if groups else None
            request = requests.get(req_id)
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
