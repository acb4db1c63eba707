"""A deterministic engine step loop around a simple-offloader scheduler (vLLM's
``SimpleCPUOffloadScheduler`` or kvtier's), for the differential test and the benchmark.

The GPU side is vLLM 0.33.0's own ``KVCacheManager`` (its ``BlockPool`` is bound to the
offloader), driven the way vLLM's engine scheduler drives it: per step, running requests get
their next prefill chunk or one decode token, then waiting requests are admitted (at most
``max_seqs`` running, a token budget per step, and only when the free GPU blocks hold the whole
request, so that no running request ever needs preempting, unless ``Shape.overcommit``); a
request's GPU prefix hit comes
from ``get_computed_blocks``, its CPU hit from the offloader, loaded asynchronously. After the
step's ``build_connector_meta`` the "workers" finish that step's transfers one step later:
loads through ``finished_recving``, stores through ``SimpleCPUOffloadWorkerMetadata``, one
report per worker (``world_size`` workers, the second a step after the first). A finished
request is handed to ``request_finished_all_groups`` (vLLM's connector supports the hybrid
allocator) and freed. With ``preempt_every`` = k, every k-th step preempts the last running
request (its blocks freed, its progress lost, back to the queue's front; it resumes with its
whole block table), so the offloader also sees ``preempted_req_ids`` and resumed requests.
``Shape.overcommit``, ``abort_every``, ``reset_every`` and ``disorder_every`` add preemption
for want of GPU blocks, aborted requests, resets with requests in flight, and late, stale and
repeated worker reports; ``aligned_every`` adds prompts that end on a hash block. What they
did is counted per step (``Record.counts``).

With ``Shape.hybrid`` the model is a hybrid one: a full-attention group and a Mamba group in
vLLM's ``align`` mode, both of 16-token blocks (``Shape.mamba_first`` puts the Mamba group
first). The manager then keeps one running Mamba state per request, nulling the older ones, and
hands every state it caches to the connector (``take_boundary_state_offloads``, read into the
step's ``kv_connector_block_state`` as vLLM's scheduler does); prefill chunks are cut by vLLM's
own engine-scheduler function (``_mamba_block_aligned_split``: block boundaries, the prompt's
last cacheable boundary, its hash-aligned checkpoint), so that those states exist; the
copy-on-write copies of a fine-grained Mamba hit are taken each step and their blocks
released, as vLLM's engine does.

With ``Shape.sliding_window`` = w (or ``Shape.attention_chunk`` = c) the model has a
full-attention group and a sliding-window group of a w-token window (a chunked-local group of
c-token chunks) beside it, both of 16-token blocks: the manager itself nulls the blocks that
left the window (chunk) and frees them (``remove_skipped_blocks`` from ``allocate_slots``), and
its hits carry null blocks there. vLLM's engine scheduler cuts no chunk differently for these
groups (its block-aligned split is for Mamba ``align`` mode only), so neither does the driver.
Admission counts the blocks of both groups: a request is admitted only when the free blocks
hold its whole length in each of them (the local group's frees are not counted on), so no
running request ever waits for blocks another running request holds.

With ``Shape.hash_block`` below the block size (8 or 4 tokens) the request's hashes, the GPU
prefix cache's and the offloader's are that fine (vLLM's hash block is the groups' smallest
block; its single-group coordinator takes no finer one). In a hybrid model the attention
group's blocks are that small (with as many more KV heads) and the Mamba group's stay 16
tokens, which is where vLLM allows partial hash hits: eager hits end on any hash block, loads
start mid-block. In a dense model a second full-attention group of blocks that small sits
beside the 16-token one: hits stay block-aligned, and a 16-token block is stored with the
hashes of the hash blocks inside it (secondary hashes, a prompt's partial last block). With
``Shape.eagle`` the model drafts with EAGLE (a speculative config whose
``use_eagle_block_drop()`` is true, as vLLM's own tests give it): the GPU manager and the
offloader both drop a hit's last block.

Requests come from a trace (kvtrace or Mooncake JSONL): each block id of a request becomes
``Shape.hash_block`` tokens (16 unless the hashes are finer) derived from the id alone, so
that requests sharing trace blocks share prompt prefixes and vLLM's chained block hashes; with
finer hashes, two requests that share an odd number of ids share part of a block. Everything
the offloader returns is recorded per step (``Record``), so that two runs can be compared step
by step.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import sys
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from unittest.mock import Mock

import vllm_stubs

vllm_stubs.install()

# test_kv_events.py stands a one-alias module in for vLLM's kv_cache_utils when it is imported
# first; the engine types below need the real file.
_utils = sys.modules.get("vllm.v1.core.kv_cache_utils")
if _utils is not None and getattr(_utils, "__file__", None) is None:
    del sys.modules["vllm.v1.core.kv_cache_utils"]

from vllm import SamplingParams  # noqa: E402
from vllm.config import (  # noqa: E402
    CacheConfig,
    KVEventsConfig,
    KVTransferConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    SpeculativeConfig,
    VllmConfig,
)
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_manager import KVCacheManager  # noqa: E402
from vllm.v1.core.kv_cache_utils import (  # noqa: E402
    get_request_block_hasher,
    init_none_hash,
)
from vllm.v1.core.sched.output import (  # noqa: E402
    CachedRequestData,
    KVConnectorBlockState,
    NewRequestData,
    SchedulerOutput,
)
from vllm.v1.core.single_type_kv_cache_manager import (  # noqa: E402
    register_all_kvcache_specs,
)
from vllm.v1.kv_cache_interface import (  # noqa: E402
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
    MambaSpec,
    SlidingWindowSpec,
    get_mamba_prefill_checkpoint_position,
    is_mamba_prefill_checkpoint_valid,
)
from vllm.v1.outputs import KVConnectorOutput  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402
from vllm.v1.simple_kv_offload.metadata import (  # noqa: E402
    SimpleCPUOffloadWorkerMetadata,
)
from vllm.v1.simple_kv_offload.metrics import MetricName  # noqa: E402

import torch  # noqa: E402  (vllm_stubs' torch: dtypes as values)

BLOCK = 16
HEADS = 1
HEAD_SIZE = 16
BYTES_PER_BLOCK = BLOCK * HEADS * HEAD_SIZE * 2 * 2  # K and V, float16

init_none_hash(sha256)
register_all_kvcache_specs(vllm_config=None)


@dataclass(frozen=True)
class Shape:
    """One run's engine shape."""

    gpu_blocks: int = 160
    cpu_blocks: int = 64
    lazy: bool = False
    world_size: int = 2
    max_seqs: int = 8
    step_tokens: int = 256
    chunk_tokens: int = 64
    decode_tokens: int = 3
    drain: int = 3
    preempt_every: int = 0
    kv_events: bool = False
    hybrid: bool = False
    mamba_first: bool = False
    # A sliding-window group of this many tokens beside the full-attention one (0: none).
    sliding_window: int = 0
    # A chunked-local-attention group of chunks of this many tokens beside it (0: none).
    attention_chunk: int = 0
    # The hash block size in tokens (divides BLOCK; below it, a second full-attention group of
    # blocks this small, and hits are fine-grained).
    hash_block: int = BLOCK
    # EAGLE drafting (vLLM's use_eagle_block_drop): hits drop their last block.
    eagle: bool = False
    # Every k-th prompt ends on a hash-block boundary, no partial tail, and from the second on
    # repeats the one k before (a turn asked again: its blocks may be on the CPU to its end).
    # 0: none does.
    aligned_every: int = 0
    # Admission asks only for the blocks of the request's first chunk, so that a running
    # request may find no free GPU block: it then preempts the running requests after it, last
    # first, as vLLM's engine does.
    overcommit: bool = False
    # Every k-th step aborts the first running request still in its prefill (0: none).
    abort_every: int = 0
    # Every k-th step ends with the connector's reset(), requests in flight (0: only the last).
    reset_every: int = 0
    # Every k-th store event's reports come two steps late (later events complete first), and
    # every report also names an event never issued and one already completed (0: none).
    disorder_every: int = 0


# A hybrid model's Mamba blocks each reserve this many more GPU blocks per request: the
# running state, the previous step's and a cached one not yet released.
MAMBA_RESERVE = 3


def kv_cache_config(
    gpu_blocks: int,
    hybrid: bool = False,
    mamba_first: bool = False,
    sliding_window: int = 0,
    attention_chunk: int = 0,
    fine_block: int = BLOCK,
) -> KVCacheConfig:
    """One full-attention group of one layer, float16, ``gpu_blocks`` blocks; with ``hybrid``,
    a Mamba group (``align`` mode, one float32 state of one element a block) beside it; with
    ``sliding_window`` (``attention_chunk``), a second attention layer of that window (chunk)
    in a group after it, the same per-block bytes, in its own tensor. With ``fine_block``
    below ``BLOCK``, blocks of that many tokens (and as many more heads: the same per-block
    bytes): in a hybrid model the attention group's (the Mamba group keeps ``BLOCK``), in a
    dense one a second full-attention layer's, in a group of its own."""
    fine = fine_block < BLOCK
    if hybrid + bool(sliding_window) + bool(attention_chunk) + (fine and not hybrid) > 1:
        raise ValueError("one layout at a time: hybrid, sliding window, chunked local or fine")
    spec = FullAttentionSpec(
        block_size=fine_block if hybrid else BLOCK,
        num_kv_heads=HEADS * BLOCK // fine_block if hybrid else HEADS,
        head_size=HEAD_SIZE,
        dtype=torch.float16,
    )
    size = BYTES_PER_BLOCK * gpu_blocks
    # The attention layer's tensor first: the offloader sizes its pool from the first.
    tensors = [
        KVCacheTensor(
            size=size, layers=["layer_0"], layer_stride=size, block_stride=BYTES_PER_BLOCK
        )
    ]
    groups = [KVCacheGroupSpec(["layer_0"], spec)]
    if hybrid:
        mamba = MambaSpec(
            block_size=BLOCK, shapes=((1, 1),), dtypes=(torch.float32,), mamba_cache_mode="align"
        )
        page = mamba.page_size_bytes
        tensors.append(
            KVCacheTensor(
                size=page * gpu_blocks,
                layers=["mamba_0"],
                layer_stride=page * gpu_blocks,
                block_stride=page,
            )
        )
        group = KVCacheGroupSpec(["mamba_0"], mamba)
        groups = [group, *groups] if mamba_first else [*groups, group]
    if sliding_window or attention_chunk:
        common = dict(
            block_size=BLOCK, num_kv_heads=HEADS, head_size=HEAD_SIZE, dtype=torch.float16
        )
        local = (
            SlidingWindowSpec(**common, sliding_window=sliding_window)
            if sliding_window
            else ChunkedLocalAttentionSpec(**common, attention_chunk_size=attention_chunk)
        )
        tensors.append(
            KVCacheTensor(
                size=size, layers=["layer_1"], layer_stride=size, block_stride=BYTES_PER_BLOCK
            )
        )
        groups.append(KVCacheGroupSpec(["layer_1"], local))
    if fine and not hybrid:
        spec = FullAttentionSpec(
            block_size=fine_block,
            num_kv_heads=HEADS * BLOCK // fine_block,
            head_size=HEAD_SIZE,
            dtype=torch.float16,
        )
        tensors.append(
            KVCacheTensor(
                size=size, layers=["layer_1"], layer_stride=size, block_stride=BYTES_PER_BLOCK
            )
        )
        groups.append(KVCacheGroupSpec(["layer_1"], spec))
    return KVCacheConfig(num_blocks=gpu_blocks, kv_cache_tensors=tensors, kv_cache_groups=groups)


def vllm_config(shape: Shape) -> VllmConfig:
    cfg = VllmConfig(
        model_config=ModelConfig(model="facebook/opt-125m", max_model_len=1 << 16),
        scheduler_config=SchedulerConfig(
            max_num_seqs=shape.max_seqs,
            max_num_batched_tokens=shape.step_tokens,
            max_model_len=1 << 16,
            enable_chunked_prefill=True,
            is_encoder_decoder=False,
        ),
        cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=True),
        parallel_config=ParallelConfig(tensor_parallel_size=shape.world_size),
        kv_events_config=KVEventsConfig(enable_kv_cache_events=shape.kv_events),
        kv_transfer_config=KVTransferConfig(
            kv_connector="SimpleCPUOffloadConnector", kv_role="kv_both"
        ),
    )
    if shape.eagle:
        spec = Mock(spec=SpeculativeConfig)
        spec.num_speculative_tokens = 1
        spec.use_eagle.return_value = True
        spec.use_eagle_block_drop.return_value = True
        spec.use_multi_module_mtp.return_value = False
        cfg.speculative_config = spec
    return cfg


# --- traces -----------------------------------------------------------------------------


def kvtrace_requests(path: str, limit: int) -> list[list[int]]:
    """The block ids of the first ``limit`` requests of a kvtrace, in arrival (L) order."""
    out: list[list[int]] = []
    with open(path) as f:
        for line in f:
            if line.startswith("L "):
                parts = line.split()
                out.append([int(h, 16) for h in parts[3:]])
                if len(out) == limit:
                    break
    return out


def mooncake_requests(path: str, limit: int, max_blocks: int = 64) -> list[list[int]]:
    """The block ids of the first ``limit`` requests of a Mooncake JSONL trace (its full
    512-token blocks, each replayed here as one 16-token block; at most ``max_blocks`` per
    request, so that a request fits the GPU pool)."""
    out: list[list[int]] = []
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            full = min(len(rec["hash_ids"]), rec["input_length"] // 512)
            if full == 0:
                continue
            out.append(rec["hash_ids"][:min(full, max_blocks)])
            if len(out) == limit:
                break
    return out


def prompt(block_ids: list[int], tail: int, per: int = BLOCK) -> list[int]:
    """``per`` tokens per block id (from the id alone), then ``tail`` tokens of a partial
    block."""
    tokens: list[int] = []
    for h in block_ids:
        base = (h * 2654435761) % 50000
        tokens.extend((base + j * 7919) % 50000 for j in range(per))
    tokens.extend(50000 + j for j in range(tail))
    return tokens


# --- the step loop ------------------------------------------------------------------------


@dataclass
class Record:
    """What the offloader returned during one step."""

    step: int
    hits: list[tuple[str, int | None, bool]] = field(default_factory=list)
    meta: dict | None = None
    stats: object = None
    events: list = field(default_factory=list)
    finished: list[tuple[str, object]] = field(default_factory=list)
    pending_stores: bool | None = None
    boundary: object = None
    # The drained stats' save-outcome counters: (name, labels) -> count.
    outcomes: dict = field(default_factory=dict)
    # What the step's engine did that the comparison must see happen, by name: "aligned_hits"
    # (CPU hits of requests whose length is a multiple of the hash block), "gpu_preemptions",
    # "aborts", "resets" (mid-run), "late_reports" (store events reported late),
    # "stale_reports" (reports naming events not in flight).
    counts: dict = field(default_factory=dict)
    reset: bool | None = None


def _meta(m) -> dict:
    return {
        "load_event": m.load_event,
        "load_gpu_blocks": list(m.load_gpu_blocks),
        "load_cpu_blocks": list(m.load_cpu_blocks),
        "load_event_to_reqs": {k: list(v) for k, v in m.load_event_to_reqs.items()},
        "store_event": m.store_event,
        "store_gpu_blocks": list(m.store_gpu_blocks),
        "store_cpu_blocks": list(m.store_cpu_blocks),
        "need_flush": m.need_flush,
    }


def _stats(s) -> object:
    data = getattr(s, "data", s)
    return repr(data)


def _outcomes(s) -> dict:
    series = s.data["data"].get(MetricName.SAVE_OUTCOMES, {})
    return {(MetricName.SAVE_OUTCOMES, labels): value for labels, value in series.items()}


class _Req:
    def __init__(self, rid: str, tokens: list[int], decode: int, hasher):
        self.req = Request(
            request_id=rid,
            prompt_token_ids=tokens,
            sampling_params=SamplingParams(max_tokens=decode),
            pooling_params=None,
            mm_features=None,
            block_hasher=hasher,
        )
        self.decode_left = decode
        self.loading = False
        self.scheduled_once = False
        self.resumed = False
        self.need = 0


def run(
    scheduler_cls: Callable,
    requests: list[list[int]],
    shape: Shape,
    record: bool = True,
) -> Iterator[Record]:
    """Runs the requests to completion, yielding one ``Record`` per step."""
    cfg = vllm_config(shape)
    kcfg = kv_cache_config(
        shape.gpu_blocks,
        shape.hybrid,
        shape.mamba_first,
        shape.sliding_window,
        shape.attention_chunk,
        shape.hash_block,
    )
    # The groups a request's GPU blocks are counted in, with their block sizes: the attention
    # group (a Mamba group's blocks are a fixed reserve), or both attention groups of a local
    # or fine layout.
    if shape.sliding_window or shape.attention_chunk:
        counted = ((0, BLOCK), (1, BLOCK))
    elif shape.hybrid:
        counted = ((1 if shape.mamba_first else 0, shape.hash_block),)
    elif shape.hash_block < BLOCK:
        counted = ((0, BLOCK), (1, shape.hash_block))
    else:
        counted = ((0, BLOCK),)
    reserve = MAMBA_RESERVE if shape.hybrid else 0

    def blocks_for(tokens: int) -> int:
        return sum(-(-tokens // size) for _, size in counted) + reserve

    sched = scheduler_cls(
        vllm_config=cfg,
        kv_cache_config=kcfg,
        cpu_capacity_bytes=BYTES_PER_BLOCK * shape.cpu_blocks,
        scheduler_block_size=BLOCK,
        hash_block_size=shape.hash_block,
        lazy_offload=shape.lazy,
    )
    kvm = KVCacheManager(
        kcfg,
        max_model_len=1 << 16,
        scheduler_block_size=BLOCK,
        hash_block_size=shape.hash_block,
        max_in_flight_tokens=shape.step_tokens,
        use_eagle=shape.eagle,
    )
    sched.bind_gpu_block_pool(kvm.block_pool)
    chunk = _splitter(shape, kvm)
    hasher = get_request_block_hasher(shape.hash_block, sha256)
    # A partial tail shorter than a hash block (none for every ``aligned_every``-th prompt).
    tail = min(5, shape.hash_block - 1)

    k = shape.aligned_every

    def tail_of(i: int) -> int:
        return 0 if k and i % k == k - 1 else 1 + i % tail

    if k:
        requests = [
            requests[i - k] if i % k == k - 1 and i >= k else ids
            for i, ids in enumerate(requests)
        ]
    waiting = deque(
        _Req(
            f"r{i}",
            prompt(ids, tail_of(i), shape.hash_block),
            shape.decode_tokens,
            hasher,
        )
        for i, ids in enumerate(requests)
    )
    for r in waiting:
        # A request whose whole length does not fit the GPU pool would never be admitted.
        need = blocks_for(r.req.num_tokens + r.decode_left)
        if need > shape.gpu_blocks - 1:
            raise ValueError(
                f"request {r.req.request_id} needs {need} GPU blocks; the pool has "
                f"{shape.gpu_blocks - 1} besides the null block"
            )
    running: list[_Req] = []
    loading: dict[str, _Req] = {}
    # Transfers reported by the workers: step -> (finished_recving, {store_event: count}).
    reports: dict[int, tuple[set[str], dict[int, int]]] = {}
    finished_last: set[str] = set()
    # Requests finished in this step (the next step's output names them).
    done: set[str] = set()

    def finish(r: _Req, rec: Record, into: set[str]) -> None:
        req = r.req
        block_ids = kvm.get_block_ids_for_computed_tokens(
            request_id=req.request_id,
            num_computed_tokens=req.num_computed_tokens,
        )
        res = sched.request_finished_all_groups(req, block_ids)
        rec.finished.append((req.request_id, res))
        kvm.free(req)
        into.add(req.request_id)

    # Store events issued so far (a disordered report names the last completed one again).
    issued: list[int] = []
    step = 0
    idle = 0
    # Once every request finished, ``drain`` more steps deliver the last reports (lazy
    # offloading keeps storing while the GPU's cached blocks outnumber the CPU's).
    while idle <= shape.drain:
        if not (waiting or running or loading):
            idle += 1
        rec = Record(step)
        # Worker reports due now (from earlier steps' metadata).
        due = reports.pop(step, None)
        if due is not None and shape.disorder_every and due[1]:
            # Reports of an event never issued and of one long completed.
            due[1][1 << 40 | step] = 1
            if len(issued) > 8:
                due[1].setdefault(issued[-8], 1)
            _count(rec, "stale_reports")
        if due is not None:
            sched.update_connector_output(
                KVConnectorOutput(
                    finished_recving=set(due[0]),
                    kv_connector_worker_meta=SimpleCPUOffloadWorkerMetadata(
                        completed_store_events=dict(due[1])
                    ),
                )
            )
        # The step begins (the Mamba group forgets the states it cached in the last one);
        # requests whose loads finished cache their blocks and run.
        kvm.new_step_starts()
        if due is not None:
            for rid in sorted(due[0]):
                r = loading.pop(rid, None)
                if r is not None:
                    kvm.cache_blocks(r.req, r.req.num_computed_tokens)
                    r.loading = False
                    running.append(r)
        budget = shape.step_tokens
        done = set()
        new_reqs: list[NewRequestData] = []
        cached_ids: list[str] = []
        cached_blocks: list = []
        resumed: set[str] = set()
        num_tokens: dict[str, int] = {}
        preempted: set[str] = set()

        def preempt(r: _Req) -> None:
            # Preemption, as vLLM's engine preempts: the request loses its GPU blocks and its
            # progress and goes back to the front of the queue.
            running.remove(r)
            kvm.free(r.req)
            r.req.status = RequestStatus.PREEMPTED
            r.req.num_computed_tokens = 0
            r.req.num_preemptions += 1
            r.scheduled_once = False
            r.resumed = True
            preempted.add(r.req.request_id)
            waiting.appendleft(r)

        if shape.preempt_every and step % shape.preempt_every == shape.preempt_every - 1:
            # The last running request that was scheduled.
            victims = [r for r in running if r.scheduled_once]
            if len(running) >= 2 and victims:
                preempt(victims[-1])
        if shape.abort_every and step % shape.abort_every == shape.abort_every - 1:
            # A client aborts a request in its prefill: vLLM's engine finishes it as it
            # finishes any request (the connector sees its computed blocks), and frees it.
            gone = next(
                (r for r in running if r.scheduled_once and r.req.num_computed_tokens
                 < r.req.num_prompt_tokens),
                None,
            )
            if gone is not None:
                running.remove(gone)
                # Between two steps: this step's output names it.
                finish(gone, rec, finished_last)
                _count(rec, "aborts")
        # Running requests: the next prefill chunk or one decode token.
        i = -1
        while i + 1 < len(running):
            i += 1
            r = running[i]
            if budget == 0:
                break
            req = r.req
            left = req.num_tokens - req.num_computed_tokens
            if left == 0:
                continue
            n = chunk(req, min(left, shape.chunk_tokens, budget), 0)
            if n == 0:
                continue
            new_blocks = kvm.allocate_slots(req, n)
            while new_blocks is None and shape.overcommit:
                # No free GPU block: preempt the last running request not yet scheduled in
                # this step (one scheduled before its first step after a load never is).
                later = [o for o in running[i + 1:] if o.scheduled_once]
                if not later:
                    break
                preempt(later[-1])
                _count(rec, "gpu_preemptions")
                new_blocks = kvm.allocate_slots(req, n)
            if new_blocks is None:
                # Lazy offloading pins cached GPU blocks until their store completes: the
                # request waits for the pins to go.
                continue
            budget -= n
            num_tokens[req.request_id] = n
            if not r.scheduled_once:
                # First scheduled after its load: vLLM's engine calls the connector again,
                # with no external tokens.
                r.scheduled_once = True
                sched.update_state_after_alloc(req, kvm.get_blocks(req.request_id), 0)
                _schedule_first(r, kvm, new_reqs, cached_ids, cached_blocks, resumed)
            else:
                cached_ids.append(req.request_id)
                cached_blocks.append(new_blocks.get_block_ids(allow_none=True))
        # Admission.
        while waiting and budget > 0 and len(running) + len(loading) < shape.max_seqs:
            r = waiting[0]
            req = r.req
            need = blocks_for(req.num_tokens + r.decode_left)
            # Blocks the admitted requests will still allocate stay reserved for them (a
            # local group's nulled entries count as allocated: their blocks were).
            reserved = 0
            for o in (*running, *loading.values()):
                ids = kvm.get_block_ids(o.req.request_id)
                reserved += o.need - sum(len(ids[g]) for g, _ in counted)
            if shape.overcommit:
                reserved = 0
                need = blocks_for(min(req.num_tokens, shape.chunk_tokens))
            if kvm.block_pool.get_num_free_blocks() - reserved < need:
                break
            r.need = need
            computed, n_local, req.shared_prefix_boundary = kvm.get_computed_blocks(req)
            ext, is_async = sched.get_num_new_matched_tokens(req, n_local)
            rec.hits.append((req.request_id, ext, is_async))
            if ext and req.num_tokens % shape.hash_block == 0:
                _count(rec, "aligned_hits")
            ext = ext or 0
            if ext > 0:
                blocks = kvm.allocate_slots(
                    req,
                    0,
                    n_local,
                    computed,
                    num_external_computed_tokens=ext,
                    delay_cache_blocks=True,
                )
                if blocks is None:
                    break
                waiting.popleft()
                sched.update_state_after_alloc(req, kvm.get_blocks(req.request_id), ext)
                req.num_computed_tokens = n_local + ext
                loading[req.request_id] = r
                r.loading = True
                r.scheduled_once = False
                continue
            n = min(req.num_tokens - n_local, shape.chunk_tokens, budget)
            n = chunk(req, n, n_local)
            if n == 0:
                break
            blocks = kvm.allocate_slots(req, n, n_local, computed)
            if blocks is None:
                break
            waiting.popleft()
            sched.update_state_after_alloc(req, kvm.get_blocks(req.request_id), 0)
            req.num_computed_tokens = n_local
            budget -= n
            num_tokens[req.request_id] = n
            r.scheduled_once = True
            running.append(r)
            _schedule_first(r, kvm, new_reqs, cached_ids, cached_blocks, resumed)
        # Requests that loaded are scheduled as new requests (vLLM's engine does so).
        out = SchedulerOutput(
            scheduled_new_reqs=new_reqs,
            scheduled_cached_reqs=CachedRequestData(
                req_ids=cached_ids,
                resumed_req_ids=resumed,
                new_token_ids=[[] for _ in cached_ids],
                all_token_ids={},
                new_block_ids=cached_blocks,
                num_computed_tokens=[0] * len(cached_ids),
                num_output_tokens=[0] * len(cached_ids),
            )
            if cached_ids
            else CachedRequestData.make_empty(),
            num_scheduled_tokens=num_tokens,
            total_num_scheduled_tokens=sum(num_tokens.values()),
            scheduled_spec_decode_tokens={},
            scheduled_encoder_inputs={},
            preempted_req_ids=preempted,
            finished_req_ids=finished_last,
            free_encoder_mm_hashes=[],
        )
        # The Mamba states the manager cached this step, handed to the connector as vLLM's
        # scheduler hands them (every request still known to it may name its own).
        handoffs = kvm.take_boundary_state_offloads()
        known = {o.req.request_id for o in (*running, *loading.values(), *waiting)}
        out.kv_connector_block_state = KVConnectorBlockState(
            req_ids=set(num_tokens) | {rid for rid in handoffs if rid in known},
            resolve_block_ids=kvm.get_block_ids,
            boundary_state_offloads=handoffs,
        )
        # A fine-grained Mamba hit copied its state to a block of its own (copy-on-write): as
        # vLLM's engine scheduler does, the step takes the copies and releases the blocks the
        # manager retained for them (the copy runs with the step).
        _, retained = kvm.take_kv_cache_block_copies()
        kvm.block_pool.free_blocks(retained)
        meta = sched.build_connector_meta(out)
        if record:
            rec.meta = _meta(meta)
        # The workers run the step's transfers and report them in the next step's output
        # (worker 0; worker 1 a step later: a store completes once every worker reported).
        # A report due at step t is read before step t is scheduled, as vLLM's engine reads
        # step t-1's output.
        if meta.load_event >= 0:
            recv = set(meta.load_event_to_reqs.get(meta.load_event, []))
            reports.setdefault(step + 2, (set(), {}))[0].update(recv)
        if meta.store_event >= 0:
            k = shape.disorder_every
            late = 2 if k and meta.store_event % k == k - 1 else 0
            if late:
                _count(rec, "late_reports")
            issued.append(meta.store_event)
            for w in range(shape.world_size):
                stores = reports.setdefault(step + 2 + w + late, (set(), {}))[1]
                stores[meta.store_event] = stores.get(meta.store_event, 0) + 1
        # The model ran: computed tokens advance, decode emits a token, finished requests go.
        finished_last = done
        still: list[_Req] = []
        for r in running:
            req = r.req
            n = num_tokens.get(req.request_id, 0)
            req.num_computed_tokens += n
            if n and req.num_computed_tokens == req.num_tokens:
                if r.decode_left == 0:
                    finish(r, rec, done)
                    continue
                req.append_output_token_ids([7 + r.decode_left])
                r.decode_left -= 1
            still.append(r)
        running = still
        if record:
            stats = sched.get_stats()
            rec.stats = _stats(stats)
            rec.outcomes = _outcomes(stats)
            rec.events = [repr(e) for e in sched.take_events()]
            rec.pending_stores = sched.has_pending_stores()
            rec.boundary = repr(sched.get_boundary_store_stats())
        if idle > shape.drain:
            # The last step: the connector's reset (vLLM's reset_prefix_cache path).
            rec.reset = sched.reset()
        elif shape.reset_every and step % shape.reset_every == shape.reset_every - 1:
            rec.reset = sched.reset()
            _count(rec, "resets")
        yield rec
        step += 1
        if step > 100000:
            raise RuntimeError("the step loop did not drain")


def _count(rec: Record, what: str) -> None:
    rec.counts[what] = rec.counts.get(what, 0) + 1


def _splitter(shape: Shape, kvm: KVCacheManager) -> Callable[[Request, int, int], int]:
    """The prefill chunk cut of vLLM's engine scheduler (``Scheduler._mamba_block_aligned_
    split``, vLLM's own function on the few settings it reads): ``(request, tokens,
    local_computed)`` -> the chunk's tokens. In a hybrid model (Mamba ``align`` mode) a chunk
    that does not reach the prompt's end is cut back to a block boundary and stops at the
    prompt's last cacheable boundary, at its hash-aligned checkpoint when hits are
    fine-grained, and at a shared prefix's junction, so that a Mamba state is written at each
    of them (0 when no boundary is reached); otherwise chunks are not cut."""
    if not shape.hybrid:
        return lambda req, n, local: n
    partial = shape.hash_block < BLOCK and kvm.coordinator.enable_partial_hash_hits
    engine = SimpleNamespace(
        cache_config=SimpleNamespace(block_size=BLOCK),
        block_size=BLOCK,
        hash_block_size=shape.hash_block,
        mamba_partial_cache_hit=partial,
        use_eagle_block_drop=shape.eagle,
        num_hash_lookahead_tokens=0,
        mamba_has_prefill_checkpoint_blocks=False,
        mamba_prefill_checkpoint_alignment=None,
        max_num_scheduled_tokens=shape.step_tokens,
        scheduler_config=SimpleNamespace(long_prefill_token_threshold=0),
        mamba_shared_prefix_checkpoint=partial and kvm.mamba_shared_prefix_checkpoint,
    )
    split = _vllm_split()
    return lambda req, n, local: split(engine, req, n, local)


def _vllm_split() -> Callable:
    """vLLM's ``Scheduler._mamba_block_aligned_split``, compiled from its own source file
    (the engine scheduler's module imports far more than the torch-free stubs provide)."""
    path = importlib.util.find_spec("vllm.v1.core.sched.scheduler").origin
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Scheduler")
    fn = next(
        n for n in cls.body
        if isinstance(n, ast.FunctionDef) and n.name == "_mamba_block_aligned_split"
    )
    scope = {
        "Request": Request,
        "get_mamba_prefill_checkpoint_position": get_mamba_prefill_checkpoint_position,
        "is_mamba_prefill_checkpoint_valid": is_mamba_prefill_checkpoint_valid,
    }
    exec(compile(ast.Module([fn], type_ignores=[]), path, "exec"), scope)
    return scope["_mamba_block_aligned_split"]


def _schedule_first(r, kvm, new_reqs, cached_ids, cached_blocks, resumed) -> None:
    """A request's first step after admission: a new request, or a resumed one (after a
    preemption) with its whole block table."""
    req = r.req
    if r.resumed:
        r.resumed = False
        resumed.add(req.request_id)
        cached_ids.append(req.request_id)
        cached_blocks.append(kvm.get_block_ids(req.request_id))
    else:
        new_reqs.append(_new_req(req, kvm))


def _new_req(req: Request, kvm: KVCacheManager) -> NewRequestData:
    return NewRequestData(
        req_id=req.request_id,
        prompt_token_ids=None,
        mm_features=[],
        sampling_params=None,
        pooling_params=None,
        block_ids=kvm.get_block_ids(req.request_id),
        num_computed_tokens=req.num_computed_tokens,
        lora_request=None,
    )
