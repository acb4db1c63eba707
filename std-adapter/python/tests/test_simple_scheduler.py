"""``kvtier.simple.SimpleCPUOffloadScheduler`` against vLLM 0.33.0's own
``SimpleCPUOffloadScheduler``, each on its own real vLLM GPU ``BlockPool``.

Hand-computed scenarios check kvtier's answers against values worked out from vLLM's rules;
the twin runs feed both managers identical inputs (the same request objects, the same
scheduler outputs, the same GPU-side operations on two identical pools) and compare every
answer, metadata, stats payload, boundary counter and both GPU pools after every call.
"""

from __future__ import annotations

import hashlib
import sys
from types import SimpleNamespace as NS

import pytest

# test_kv_events.py, when collected first, stands a module holding one type alias in for
# vLLM's kv_cache_utils (setdefault); this suite needs vLLM's real module.
_utils = sys.modules.get("vllm.v1.core.kv_cache_utils")
if _utils is not None and getattr(_utils, "__file__", None) is None:
    del sys.modules["vllm.v1.core.kv_cache_utils"]

from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
    SlidingWindowSpec,
)
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.simple_kv_offload.manager import (
    SimpleCPUOffloadScheduler as VllmScheduler,
)
from vllm.v1.simple_kv_offload.metadata import (
    SimpleCPUOffloadMetadata,
    SimpleCPUOffloadWorkerMetadata,
)
from vllm.v1.simple_kv_offload.metrics import MetricName

from kvtier.simple import SimpleCPUOffloadScheduler as KvtierScheduler

BS = 4
BYTES_PER_BLOCK = 100


def kv_cache_config(num_blocks: int, groups: int = 1) -> KVCacheConfig:
    specs = [FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype="f16")]
    if groups > 1:
        specs.append(
            SlidingWindowSpec(
                block_size=BS, num_kv_heads=1, head_size=8, dtype="f16", sliding_window=8
            )
        )
    size = BYTES_PER_BLOCK * num_blocks
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[
            KVCacheTensor(
                size=size,
                layers=[f"l{g}" for g in range(groups)],
                layer_stride=size,
                block_stride=BYTES_PER_BLOCK,
                offset=0,
            )
        ],
        kv_cache_groups=[KVCacheGroupSpec([f"l{g}"], s) for g, s in enumerate(specs)],
    )


def vllm_config(world_size: int = 1, max_num_batched_tokens: int = 16, events=None):
    return NS(
        kv_events_config=events,
        parallel_config=NS(decode_context_parallel_size=1, world_size=world_size),
        model_config=NS(max_model_len=4096),
        max_in_flight_tokens=4096,
        speculative_config=None,
        num_prefill_lookahead_tokens=0,
        scheduler_config=NS(max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=8),
        kv_transfer_config=None,
    )


# vLLM registers its KV-cache specs (through the stubbed platform) on first use: done once
# here, at collection, so that no test touches a stub.
VllmScheduler(vllm_config(), kv_cache_config(8), 400, BS, BS)


def block_hashes(tokens: list[int], parent: bytes = b"") -> list[bytes]:
    """Chained 32-byte hashes of the full blocks of ``tokens`` (vLLM's shape: bytes)."""
    out = []
    for i in range(len(tokens) // BS):
        parent = hashlib.sha256(parent + bytes(tokens[i * BS : (i + 1) * BS])).digest()
        out.append(parent)
    return out


class Req:
    """The attributes of vLLM's ``Request`` that the simple offloader reads."""

    def __init__(self, req_id: str, tokens: list[int]):
        self.request_id = req_id
        self.all_token_ids = list(tokens)
        self.num_prompt_tokens = len(tokens)
        self.block_hashes = block_hashes(tokens)
        self.num_computed_tokens = 0
        self.num_output_placeholders = 0
        self.skip_reading_prefix_cache = False
        self.lora_request = None

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)


def step_output(new=(), cached=(), num_scheduled=None, finished=(), preempted=(), handoffs=None):
    """A ``SchedulerOutput`` as the simple offloader reads it. ``new``: (req_id, block_ids);
    ``cached``: (req_id, new block ids or None, resumed)."""
    return NS(
        scheduled_new_reqs=[NS(req_id=r, block_ids=(list(b),)) for r, b in new],
        scheduled_cached_reqs=NS(
            req_ids=[r for r, _, _ in cached],
            new_block_ids=[None if b is None else (list(b),) for _, b, _ in cached],
            resumed_req_ids={r for r, _, resumed in cached if resumed},
        ),
        num_scheduled_tokens=dict(num_scheduled or {}),
        finished_req_ids=set(finished),
        preempted_req_ids=set(preempted) or None,
        kv_connector_block_state=(
            None
            if handoffs is None
            else NS(
                boundary_state_offloads={
                    r: [(0, b, 0) for b in bs] for r, bs in handoffs.items()
                }
            )
        ),
    )


def worker_output(recving=(), stores=None):
    return KVConnectorOutput(
        finished_recving=set(recving) or None,
        kv_connector_worker_meta=(
            None
            if stores is None
            else SimpleCPUOffloadWorkerMetadata(completed_store_events=dict(stores))
        ),
    )


def gpu_state(pool: BlockPool):
    blocks = [(b.ref_cnt, b.block_hash, b.block_hash_num_tokens) for b in pool.blocks]
    queue = [b.block_id for b in pool.free_block_queue.iter_blocks_after(None)]
    return blocks, queue


class Twin:
    """vLLM's scheduler and kvtier's on identical inputs, each with its own GPU pool."""

    def __init__(self, num_gpu_blocks=16, num_cpu_blocks=None, lazy=False, world_size=1,
                 cpu_bytes=None, max_num_batched_tokens=16):
        cfg = kv_cache_config(num_gpu_blocks)
        vc = vllm_config(world_size, max_num_batched_tokens)
        cpu_bytes = cpu_bytes if cpu_bytes is not None else 8 * BYTES_PER_BLOCK
        self.sides = []
        for cls in (VllmScheduler, KvtierScheduler):
            s = cls(vc, cfg, cpu_bytes, BS, BS, lazy_offload=lazy,
                    num_cpu_blocks=num_cpu_blocks)
            pool = BlockPool(num_gpu_blocks, True, BS)
            s.bind_gpu_block_pool(pool)
            self.sides.append((s, pool))
        self.check()

    @property
    def kv(self) -> KvtierScheduler:
        return self.sides[1][0]

    @property
    def gpu(self) -> BlockPool:
        return self.sides[1][1]

    def check(self):
        (ref, ref_pool), (kv, kv_pool) = self.sides
        assert gpu_state(kv_pool) == gpu_state(ref_pool)
        assert kv._native.cpu_free_blocks() == ref.cpu_block_pool.get_num_free_blocks()
        assert kv.has_pending_stores() == ref.has_pending_stores()
        assert kv.get_boundary_store_stats() == ref.get_boundary_store_stats()
        assert kv.num_cpu_blocks == ref.num_cpu_blocks

    def call(self, method: str, *args):
        """Calls ``method`` on both with the same arguments; returns kvtier's answer."""
        answers = [getattr(s, method)(*args) for s, _ in self.sides]
        if method == "get_stats":
            answers = [a.data for a in answers]
        assert answers[1] == answers[0], method
        self.check()
        return answers[1]

    def alloc(self, n: int) -> list[int]:
        got = [[b.block_id for b in pool.get_new_blocks(n)] for _, pool in self.sides]
        assert got[0] == got[1]
        return got[0]

    def cache(self, block_id: int, h: bytes, num_tokens: int):
        for _, pool in self.sides:
            pool._insert_block_hash(
                make_block_hash_with_group_id(h, 0), pool.blocks[block_id], num_tokens
            )

    def free(self, ids: list[int]):
        for _, pool in self.sides:
            pool.free_blocks([pool.blocks[b] for b in ids])

    def touch(self, ids: list[int]):
        for _, pool in self.sides:
            pool.touch([pool.blocks[b] for b in ids])

    def after_alloc(self, req: Req, ids: list[int], num_external_tokens: int):
        for s, pool in self.sides:
            blocks = KVCacheBlocks(blocks=([pool.blocks[b] for b in ids],))
            s.update_state_after_alloc(req, blocks, num_external_tokens)
        self.check()

    def evict(self, ids: list[int]):
        for _, pool in self.sides:
            pool.evict_blocks(set(ids))


def stats_of(s) -> dict:
    return s.get_stats().data["data"]


# --- hand-computed scenarios -------------------------------------------------------------


def test_idle_stats_count_the_null_block():
    kv = KvtierScheduler(vllm_config(), kv_cache_config(16), 8 * BYTES_PER_BLOCK, BS, BS)
    # 16 GPU blocks in 1600 bytes: 800 bytes hold 8 blocks, one of them the null block.
    assert kv.num_cpu_blocks == 8
    assert stats_of(kv) == {
        MetricName.USED_BLOCKS: {(): 1},
        MetricName.PENDING_STORE_BLOCKS: {(): 0},
        MetricName.INFO: {("cpu", "false", "false", "8"): 1},
    }
    assert kv.take_events() == []
    assert not kv.has_pending_stores()


def prefill(t: Twin, req: Req, blocks: int):
    """Allocates and computes ``blocks`` full blocks of ``req`` over two steps (vLLM stores
    a block one step after it is computed)."""
    ids = t.alloc(blocks)
    t.after_alloc(req, ids, 0)
    meta = t.call("build_connector_meta", step_output(new=[(req.request_id, ids)],
                                                      num_scheduled={req.request_id: 4 * blocks}))
    assert meta.store_event == -1  # nothing confirmed computed yet
    for i, b in enumerate(ids):
        t.cache(b, req.block_hashes[i], (i + 1) * BS)
    req.num_computed_tokens = BS * blocks
    return ids


def test_eager_store_completes_after_every_worker_reported():
    t = Twin(world_size=2)
    a = Req("a", list(range(9)))  # two full blocks and one token
    ids = prefill(t, a, 2)
    meta = t.call("build_connector_meta", step_output(cached=[("a", [], False)],
                                                      num_scheduled={"a": 1}))
    # Both GPU blocks go to the first two free CPU blocks (1 and 2; 0 is the null block).
    assert (meta.store_event, meta.store_gpu_blocks, meta.store_cpu_blocks) == (0, ids, [1, 2])
    assert [t.gpu.blocks[b].ref_cnt for b in ids] == [2, 2]
    data = stats_of(t.kv)
    assert data[MetricName.USED_BLOCKS] == {(): 3}
    assert data[MetricName.PENDING_STORE_BLOCKS] == {(): 2}
    t.call("update_connector_output", worker_output(stores={0: 1}))
    assert t.kv.has_pending_stores()  # one of two workers
    t.call("update_connector_output", worker_output(stores={0: 1}))
    assert not t.kv.has_pending_stores()
    assert [t.gpu.blocks[b].ref_cnt for b in ids] == [1, 1]
    assert stats_of(t.kv)[MetricName.PENDING_STORE_BLOCKS] == {(): 0}
    t.call("get_stats")


def test_hit_load_and_its_completion():
    t = Twin()
    a = Req("a", list(range(9)))
    ids = prefill(t, a, 2)
    t.call("build_connector_meta", step_output(cached=[("a", [], False)], num_scheduled={"a": 1}))
    t.call("update_connector_output", worker_output(stores={0: 1}))
    t.call("request_finished_all_groups", a, (ids,))
    t.free(ids[::-1])
    t.evict(ids)  # the GPU copies are gone; the CPU pool still has both blocks
    b = Req("b", list(range(9)))
    # 9 tokens: at most 8 can hit (the last is recomputed), two full blocks.
    assert t.call("get_num_new_matched_tokens", b, 0) == (8, True)
    new = t.alloc(3)
    t.after_alloc(b, new, 8)
    meta = t.call("build_connector_meta", step_output(new=[("b", new)], num_scheduled={"b": 1}))
    assert (meta.load_event, meta.load_gpu_blocks, meta.load_cpu_blocks) == (0, new[:2], [1, 2])
    assert meta.load_event_to_reqs == {0: ["b"]}
    t.call("get_stats")
    t.call("update_connector_output", worker_output(recving=["b"]))
    data = stats_of(t.kv)
    assert data[MetricName.LOAD_BLOCKS] == {(): 2}
    meta = t.call("build_connector_meta", step_output())
    assert meta.load_event_to_reqs == {}


def test_lazy_mode_stores_the_free_queue_near_eviction():
    t = Twin(lazy=True, max_num_batched_tokens=8)
    # target_free = 2 * cdiv(8, 4) = 4 blocks of the free queue's front per step.
    assert t.kv._target_free == 4
    a = Req("a", list(range(13)))
    ids = t.alloc(3)
    t.after_alloc(a, ids, 0)
    for i, b in enumerate(ids):
        t.cache(b, a.block_hashes[i], (i + 1) * BS)
    # The walk covers 4 free blocks a step from its cursor: 4-7 now (a holds 1-3).
    meta = t.call("build_connector_meta", step_output(new=[("a", ids)], num_scheduled={"a": 12}))
    assert meta.store_event == -1
    t.call("request_finished_all_groups", a, (ids,))
    t.free(ids[::-1])
    # The free queue is now 4..15 (never used), then 3, 2, 1 (cached, freed in reverse).
    for _ in range(2):  # 8-11, 12-15: no hash
        meta = t.call("build_connector_meta", step_output())
        assert meta.store_event == -1
    meta = t.call("build_connector_meta", step_output())
    assert (meta.store_event, meta.store_gpu_blocks, meta.store_cpu_blocks) == (0, [3, 2, 1], [1, 2, 3])
    meta = t.call("build_connector_meta", step_output())
    assert meta.store_event == -1  # the cursor is at the queue's end
    t.call("update_connector_output", worker_output(stores={0: 1}))
    # Cached CPU blocks are free (evictable): the pool reports only the null block used,
    # and a request with a's 13 tokens finds its three blocks.
    assert stats_of(t.kv)[MetricName.USED_BLOCKS] == {(): 1}
    assert t.call("get_num_new_matched_tokens", Req("b", list(range(13))), 0) == (12, True)


def test_reset_waits_for_in_flight_stores():
    t = Twin()
    a = Req("a", list(range(9)))
    ids = prefill(t, a, 2)
    meta = t.call("build_connector_meta", step_output(cached=[("a", [], False)],
                                                      num_scheduled={"a": 1}))
    assert meta.store_event == 0
    assert t.call("reset") is False  # event 0 is still being copied
    t.call("update_connector_output", worker_output(stores={0: 1}))
    # The abandoned store only released its pins: nothing was cached on the CPU.
    assert t.kv._native.cpu_free_blocks() == t.kv.num_cpu_blocks - 1
    assert t.call("reset") is True
    assert t.call("get_boundary_store_stats").published == 0


def test_unsupported_configurations_raise():
    with pytest.raises(ValueError, match="one KV-cache group"):
        KvtierScheduler(vllm_config(), kv_cache_config(16, groups=2), 800, BS, BS)
    with pytest.raises(ValueError, match="block size"):
        KvtierScheduler(vllm_config(), kv_cache_config(16), 800, 2 * BS, BS)
    with pytest.raises(ValueError, match="enable_kv_cache_events"):
        KvtierScheduler(vllm_config(events=NS(enable_kv_cache_events=True)),
                        kv_cache_config(16), 800, BS, BS)
    with pytest.raises(ValueError, match="local offload capacity 8"):
        KvtierScheduler(vllm_config(), kv_cache_config(16), 800, BS, BS, num_cpu_blocks=9)


def test_request_ids_and_keys_stay_bounded():
    t = Twin(num_gpu_blocks=32)
    for i in range(40):
        r = Req(f"r{i}", [i % 5] * 9)
        t.call("get_num_new_matched_tokens", r, 0)
        ids = t.alloc(3)
        t.after_alloc(r, ids, 0)
        t.call("build_connector_meta", step_output(new=[(r.request_id, ids)],
                                                   num_scheduled={r.request_id: 9}))
        for j, b in enumerate(ids[:2]):
            t.cache(b, r.block_hashes[j], (j + 1) * BS)
        r.num_computed_tokens = 9
        meta = t.call("build_connector_meta", step_output(cached=[(r.request_id, [], False)],
                                                          num_scheduled={r.request_id: 1}))
        if meta.store_event >= 0:
            t.call("update_connector_output", worker_output(stores={meta.store_event: 1}))
        t.call("request_finished_all_groups", r, (ids,))
        t.free(ids[::-1])
    assert t.kv._native.mapped_requests() == 0
    assert t.kv._requests == {}
