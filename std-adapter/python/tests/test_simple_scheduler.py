"""``kvtier.simple.SimpleCPUOffloadScheduler`` against vLLM 0.33.0's own
``SimpleCPUOffloadScheduler``, each on its own real vLLM GPU ``BlockPool``.

Hand-computed scenarios check kvtier's answers against values worked out from vLLM's rules;
the twin runs feed both managers identical inputs (the same request objects, the same
scheduler outputs, the same GPU-side operations on two identical pools) and compare every
answer, metadata, stats payload, boundary counter and both GPU pools after every call.
"""

from __future__ import annotations

import hashlib
import random
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
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
    MambaSpec,
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

# The connector, as vLLM's factory finds it (its first import touches stubbed modules: done
# here, at collection).
from kvtier.vllm import KvtierSimpleCPUOffloadConnector

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
        self.mm_features = []
        self.cache_salt = None
        self.prompt_embeds = None

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


def worker_round(t, rng, stores: dict, loads: dict, loading: dict, p_store: float) -> None:
    """Workers report some stores, each with probability ``p_store`` (one worker's report at
    a time: ``stores`` counts the reports an event still waits for), and some loads (half);
    a request whose load is reported is marked loaded in ``loading``."""
    reports = {e: 1 for e in stores if rng.random() < p_store}
    recving = []
    for e in [e for e in loads if rng.random() < 0.5]:
        recving += loads.pop(e)
    for e in reports:
        stores[e] -= 1
        if not stores[e]:
            del stores[e]
    t.call("update_connector_output", worker_output(recving, reports or None))
    for rid in recving:
        if rid in loading:
            loading[rid].loaded = True


def worker_output(recving=(), stores=None):
    # vLLM passes a set; an ordered one keeps a run the same from process to process (a set
    # of strings iterates in an order that varies with hash randomisation).
    return KVConnectorOutput(
        finished_recving=list(dict.fromkeys(recving)) or None,
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
                 cpu_bytes=None, max_num_batched_tokens=16, events=False):
        cfg = kv_cache_config(num_gpu_blocks)
        vc = vllm_config(world_size, max_num_batched_tokens,
                         NS(enable_kv_cache_events=True) if events else None)
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
        if method == "take_events":
            answers = [list(a) for a in answers]
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


def _mamba(block_size: int = BS, mode: str = "align") -> MambaSpec:
    return MambaSpec(
        block_size=block_size, shapes=((1, 1),), dtypes=("f32",), mamba_cache_mode=mode
    )


def _two_groups(first, second, num_blocks: int = 16) -> KVCacheConfig:
    base = kv_cache_config(num_blocks)
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=base.kv_cache_tensors,
        kv_cache_groups=[KVCacheGroupSpec(["l0"], first), KVCacheGroupSpec(["l1"], second)],
    )


def test_unsupported_configurations_raise():
    attention = kv_cache_config(16).kv_cache_groups[0].kv_cache_spec
    cross = CrossAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype="f16")
    with pytest.raises(ValueError, match="group 1 is a prefix-cacheable CrossAttentionSpec"):
        KvtierScheduler(vllm_config(), _two_groups(attention, cross), 800, BS, BS)
    with pytest.raises(ValueError, match="groups are MambaSpec, MambaSpec"):
        KvtierScheduler(vllm_config(), _two_groups(_mamba(), _mamba()), 800, BS, BS)
    with pytest.raises(ValueError, match="'align' cache mode only; group 1's is 'all'"):
        KvtierScheduler(vllm_config(), _two_groups(attention, _mamba(mode="all")), 800, BS, BS)
    with pytest.raises(ValueError, match="not a multiple of group 1's block size 8"):
        KvtierScheduler(vllm_config(), _two_groups(attention, _mamba(2 * BS)), 800, BS, BS)
    # A Mamba block twice the attention block, the scheduler's the larger: fine-grained hits
    # in eager mode only, as vLLM's coordinator decides.
    for lazy in (False, True):
        kv = KvtierScheduler(
            vllm_config(), _two_groups(attention, _mamba(2 * BS)), 800, 2 * BS, BS, lazy
        )
        assert kv.group_block_sizes == (BS, 2 * BS)
        assert kv.cpu_coordinator.enable_partial_hash_hits is not lazy
    # Either order of the two groups is accepted, and so is a sliding-window group.
    for groups in ((attention, _mamba()), (_mamba(), attention)):
        kv = KvtierScheduler(vllm_config(), _two_groups(*groups), 800, BS, BS)
        assert kv.fa_gidx == groups.index(attention)
    assert KvtierScheduler(vllm_config(), kv_cache_config(16, groups=2), 800, BS, BS).fa_gidx == 0
    with pytest.raises(ValueError, match="block size"):
        KvtierScheduler(vllm_config(), kv_cache_config(16), 800, 2 * BS, BS)
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


# --- twin runs: a small random scheduler drives both managers ------------------------------


class Driver:
    """A small stand-in for vLLM's scheduler around the twin managers: admission with GPU
    prefix hits and CPU lookups (sometimes taking fewer external tokens than offered, or
    retrying after a failed allocation), chunked prefill, decode, preemption and resumption,
    finishing, boundary hand-offs, worker reports split over steps, and resets."""

    def __init__(self, seed: int, lazy: bool, world_size: int, events: bool = False):
        self.rng = random.Random(seed)
        self.events = events
        self.world = world_size
        # A GPU pool smaller than the CPU pool, so that prefixes leave the GPU first.
        self.t = Twin(num_gpu_blocks=24, lazy=lazy, world_size=world_size,
                      cpu_bytes=40 * BYTES_PER_BLOCK, max_num_batched_tokens=16,
                      events=events)
        self.prefixes = [[self.rng.randrange(256) for _ in range(24)] for _ in range(6)]
        self.waiting: list[Req] = []
        self.loading: dict[str, Req] = {}  # admitted, waiting for their load
        self.running: dict[str, Req] = {}
        self.finished_last: list[str] = []
        self.preempted_now: list[str] = []
        self.stores: dict[int, int] = {}  # event -> reports still due
        self.loads: dict[int, list[str]] = {}
        self.count = 0
        self.seen_events = 0
        self.seen = {"store": 0, "load": 0, "hit": 0, "partial": 0, "retry": 0,
                     "preempt": 0, "reset": 0, "abort": 0}

    def new_request(self):
        self.count += 1
        prefix = self.rng.choice(self.prefixes)[: self.rng.randrange(4, 25)]
        tail = [self.rng.randrange(256) for _ in range(self.rng.randrange(1, 9))]
        r = Req(f"r{self.count}", prefix + tail)
        r.target = r.num_tokens + self.rng.randrange(1, 10)
        r.skip_reading_prefix_cache = self.rng.random() < 0.05
        r.table, r.fresh = [], True
        self.waiting.append(r)

    def admit(self, r: Req, scheduled: dict, new: list, cached: list) -> bool:
        t = self.t
        ref_pool = t.sides[0][1]
        local = []
        for h in r.block_hashes[: (r.num_tokens - 1) // BS]:
            got = ref_pool.get_cached_block(h, [0])
            if not got:
                break
            local.append(got[0].block_id)
        computed = len(local) * BS
        ext, _ = t.call("get_num_new_matched_tokens", r, computed)
        take = ext if self.rng.random() < 0.8 else self.rng.randrange(0, ext // BS + 1) * BS
        self.seen["hit"] += ext > 0
        self.seen["partial"] += take < ext
        need = -(-r.num_tokens // BS) - len(local)
        idle = sum(1 for b in local if t.gpu.blocks[b].ref_cnt == 0)
        if need > t.gpu.get_num_free_blocks() - idle - 2 or self.rng.random() < 0.1:
            self.seen["retry"] += 1
            return False  # allocation failed: the request stays waiting, its hit pinned
        t.touch(local)
        ids = t.alloc(need)
        r.table = local + ids
        r.num_computed_tokens = computed
        t.after_alloc(r, r.table, take)
        if take:
            r.num_computed_tokens = computed + take
            r.loaded = False
            self.loading[r.request_id] = r
            return True
        self.schedule_prefill(r, scheduled, new, cached)
        return True

    def schedule_prefill(self, r: Req, scheduled: dict, new: list, cached: list):
        n = min(r.num_tokens - r.num_computed_tokens, 8)
        scheduled[r.request_id] = max(n, 1)
        if r.fresh:
            new.append((r.request_id, r.table))
        else:
            cached.append((r.request_id, list(r.table), True))
        r.fresh = False
        self.running[r.request_id] = r

    def cache_full(self, r: Req, upto_tokens: int):
        pool = self.t.sides[0][1]
        for i in range(min(upto_tokens // BS, len(r.block_hashes), len(r.table))):
            b = r.table[i]
            if pool.blocks[b].block_hash is None:
                self.t.cache(b, r.block_hashes[i], (i + 1) * BS)

    def finish(self, r: Req):
        self.t.call("request_finished_all_groups", r, (list(r.table),))
        self.t.free(r.table[::-1])
        del self.running[r.request_id]
        self.finished_last.append(r.request_id)

    def preempt(self, r: Req):
        self.seen["preempt"] += 1
        self.t.free(r.table[::-1])
        r.table, r.num_computed_tokens = [], 0
        del self.running[r.request_id]
        self.preempted_now.append(r.request_id)
        self.waiting.append(r)

    def step(self, prepare: bool = False):
        """One step; with ``prepare``, the step's ``prepare_store_specs`` instead of its
        ``build_connector_meta`` (both answers in ``self.prepared``, the twins no longer
        alike after it: vLLM's leaves its stores in no event)."""
        t, rng = self.t, self.rng
        scheduled, new, cached = {}, [], []
        # Running requests: prefill chunks and decodes.
        for r in list(self.running.values()):
            if r.request_id in self.preempted_now:
                continue
            if r.num_computed_tokens >= r.num_tokens:
                if r.num_tokens >= r.target:
                    continue
                r.all_token_ids.append(rng.randrange(256))
                r.block_hashes = block_hashes(r.all_token_ids)
            n = min(r.num_tokens - r.num_computed_tokens, 8)
            grow = -(-(r.num_computed_tokens + n) // BS) - len(r.table)
            if grow > t.gpu.get_num_free_blocks():
                self.preempt(r)
                continue
            add = t.alloc(grow) if grow > 0 else []
            r.table += add
            scheduled[r.request_id] = n
            cached.append((r.request_id, add or None, False))
        if len(self.waiting) < 3:
            self.new_request()
        for r in list(self.waiting):
            if self.admit(r, scheduled, new, cached):
                self.waiting.remove(r)
        for rid, r in list(self.loading.items()):
            if getattr(r, "loaded", False):
                del self.loading[rid]
                self.schedule_prefill(r, scheduled, new, cached)
        for rid, n in scheduled.items():
            r = self.running[rid]
            self.cache_full(r, r.num_computed_tokens + n)
        handoffs = None
        if not self.t.kv._lazy_mode and rng.random() < 0.3 and self.running:
            r = rng.choice(list(self.running.values()))
            handoffs = {r.request_id: [rng.choice(r.table), 0]}
            if self.finished_last:
                handoffs[self.finished_last[0]] = [1]
        out = step_output(new, cached, scheduled, self.finished_last, self.preempted_now,
                          handoffs)
        if prepare:
            self.prepared = [s.prepare_store_specs(out) for s, _ in t.sides]
            return
        meta = t.call("build_connector_meta", out)
        self.finished_last, self.preempted_now = [], []
        if meta.store_event >= 0:
            self.stores[meta.store_event] = self.world
            self.seen["store"] += 1
        if meta.load_event >= 0:
            self.seen["load"] += 1
            self.loads[meta.load_event] = list(meta.load_event_to_reqs[meta.load_event])
        for rid, n in scheduled.items():
            self.running[rid].num_computed_tokens += n
        worker_round(t, rng, self.stores, self.loads, self.loading, 0.5)
        # Finish, preempt, reset.
        for r in list(self.running.values()):
            if r.num_computed_tokens >= r.target or rng.random() < 0.03:
                self.finish(r)
        if self.running and rng.random() < 0.08:
            self.preempt(rng.choice(list(self.running.values())))
        # Aborts: a waiting request (its hit may be pinned) and a request whose load is in
        # flight (its GPU blocks stay pinned by the load until the worker reports it).
        if self.waiting and rng.random() < 0.05:
            r = self.waiting.pop(rng.randrange(len(self.waiting)))
            t.call("request_finished", r, [])
            self.seen["abort"] += 1
        if self.loading and rng.random() < 0.1:
            rid = rng.choice(list(self.loading))
            r = self.loading.pop(rid)
            t.call("request_finished_all_groups", r, (list(r.table),))
            t.free(r.table[::-1])
            self.seen["abort"] += 1
        if rng.random() < 0.3:
            t.call("get_stats")
        if self.events:
            self.seen_events += len(t.call("take_events"))
        if rng.random() < 0.03:
            self.seen["reset"] += 1
            t.call("reset")


@pytest.mark.parametrize("lazy", [False, True])
@pytest.mark.parametrize("world_size", [1, 2])
@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("events", [False, True])
def test_twin_runs_agree_call_by_call(seed, lazy, world_size, events):
    d = Driver(seed, lazy, world_size, events)
    for _ in range(150):
        d.step()
    d.t.call("get_stats")
    # The run exercised stores, hits, loads, partial takes and retries.
    assert all(d.seen.values()), d.seen
    assert d.seen_events > 0 if events else d.seen_events == 0


@pytest.mark.parametrize("lazy", [False, True])
@pytest.mark.parametrize("events", [False, True])
def test_prepare_store_specs_answers_as_vllms(lazy, events):
    """``prepare_store_specs`` (the store half of ``build_connector_meta``) at the end of
    random runs: kvtier's answers equal vLLM's (GPU and CPU blocks, requests, the payloads
    of every block), and kvtier's next ``build_connector_meta`` issues the prepared stores
    (vLLM's leaves them in no event)."""
    stored = payloads = handoffs = 0
    for seed in range(40):
        d = Driver(100 + seed, lazy, 1, events)
        for _ in range(d.rng.randrange(4, 60)):
            d.step()
        d.step(prepare=True)
        want, got = d.prepared
        assert got == want, seed
        gpu, cpu, req_ids, meta = got
        stored += bool(gpu)
        assert meta is None if lazy or not events else len(meta) == len(gpu)
        payloads += sum(1 for m in meta or () if m)
        handoffs += sum(1 for m in meta or () if not m)
        assert (req_ids == []) if lazy else len(set(req_ids)) == len(req_ids)
        kv = d.t.kv
        plan = kv.build_connector_meta(step_output([], [], {}, [], [], None))
        if gpu:
            # After that step's own stores and the flushes queued before them.
            assert list(plan.store_gpu_blocks[-len(gpu):]) == gpu
            assert list(plan.store_cpu_blocks[-len(cpu):]) == cpu
    assert stored > 10
    if events and not lazy:
        assert payloads > 0 and handoffs > 0


def test_readme_connector_example_runs(capsys):
    import os
    import re

    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
    text = open(os.path.join(root, "docs", "simple-offloader.md")).read()
    (code,) = re.findall(r"```python\n(.*?)```", text, re.S)
    exec(compile(code, "docs/simple-offloader.md", "exec"), {})
    out = capsys.readouterr().out.splitlines()
    # Blocks 1 and 2 (the first free GPU blocks) go to CPU blocks 1 and 2; 32 of the 33
    # tokens then hit (the last is always recomputed); the pool of 8 CPU blocks (8 · 64 KiB
    # of budget) holds them, cached and free, beside its null block.
    assert out[0] == "kvtier.simple"
    assert out[1] == "store 0 [1, 2] -> [1, 2]"
    assert out[2] == "hit (32, True)"
    data = eval(out[3])
    assert data[MetricName.USED_BLOCKS] == {(): 3}  # the null block and b's two pinned hits
    assert data[MetricName.INFO] == {("cpu", "false", "false", "8"): 1}


def test_the_connector_is_vllms_with_kvtiers_manager():
    from vllm.distributed.kv_transfer.kv_connector.v1.simple_cpu_offload_connector import (
        SimpleCPUOffloadConnector,
        SimpleCPUOffloadScheduler,
    )

    assert issubclass(KvtierSimpleCPUOffloadConnector, SimpleCPUOffloadConnector)
    # vLLM's module name is pointed at kvtier's class only while one connector is built.
    assert SimpleCPUOffloadScheduler is VllmScheduler


def test_interned_keys_are_swept_to_what_the_cpu_pool_holds():
    """More distinct GPU keys than one sweep period (4,096): the interner frees the keys the
    CPU pool no longer holds, and what it holds is still found."""
    t = Twin(num_gpu_blocks=8, lazy=True, max_num_batched_tokens=8, cpu_bytes=4 * BYTES_PER_BLOCK)
    (ref, ref_pool), (kv, kv_pool) = t.sides
    for i in range(4500):
        tokens = list(i.to_bytes(4, "big"))
        r = Req(f"r{i}", tokens + [0])
        ids = t.alloc(1)
        t.cache(ids[0], r.block_hashes[0], BS)
        t.free(ids)  # cached and free: the lazy walk stores it
        meta = t.call("build_connector_meta", step_output())
        if meta.store_event >= 0:
            t.call("update_connector_output", worker_output(stores={meta.store_event: 1}))
    # The CPU pool (3 usable blocks) holds the last stored keys; the interner holds at most
    # those plus one sweep period of newer ones.
    assert kv._native.interned_keys() <= 4096 + kv.num_cpu_blocks
    last = Req("again", list((4499).to_bytes(4, "big")) + [0])
    assert t.call("get_num_new_matched_tokens", last, 0) == (4, True)


@pytest.mark.parametrize(
    "kwargs, blocks",
    [
        # The disk budget sizes the pool: 2,000 bytes over 100 per GPU block.
        ({"disk_capacity_bytes": 2000, "use_page_cache": True}, 20),
        ({"num_cpu_blocks": 5}, 5),
        # The workers' aligned count is used as is, even above the budget.
        ({"aligned_num_cpu_blocks": 30}, 30),
        ({"num_cpu_blocks": 6, "aligned_num_cpu_blocks": 30}, 6),
    ],
)
def test_pool_sizes_and_the_disk_backend_match_vllm(kwargs, blocks):
    cfg, vc = kv_cache_config(16), vllm_config()
    ref = VllmScheduler(vc, cfg, 800, BS, BS, **kwargs)
    kv = KvtierScheduler(vc, cfg, 800, BS, BS, **kwargs)
    assert kv.num_cpu_blocks == ref.num_cpu_blocks == blocks
    assert kv.kv_event_medium == ref.kv_event_medium
    for s in (ref, kv):
        s.bind_gpu_block_pool(BlockPool(16, True, BS))
    assert kv.get_stats().data == ref.get_stats().data


def connector_config(pp: int = 1, **extra):
    return NS(
        kv_transfer_config=NS(kv_connector_extra_config={"cpu_bytes_to_use": 800, **extra}),
        cache_config=NS(enable_prefix_caching=True, block_size=BS, prefix_match_unit=None,
                        simple_cpu_offload_num_blocks=None),
        parallel_config=NS(world_size=1, pipeline_parallel_size=pp,
                           decode_context_parallel_size=1),
        scheduler_config=NS(max_num_batched_tokens=16, max_num_seqs=8),
        model_config=NS(max_model_len=4096), speculative_config=None, kv_events_config=None,
        num_prefill_lookahead_tokens=0)


def test_the_connector_needs_num_cpu_blocks_under_pipeline_parallelism():
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    with pytest.raises(ValueError, match="num_cpu_blocks"):
        KvtierSimpleCPUOffloadConnector(
            connector_config(pp=2), KVConnectorRole.SCHEDULER, kv_cache_config(16))
    c = KvtierSimpleCPUOffloadConnector(
        connector_config(pp=2, num_cpu_blocks=4), KVConnectorRole.SCHEDULER,
        kv_cache_config(16))
    assert c.scheduler_manager.num_cpu_blocks == 4


def test_max_requests_bounds_the_tracked_requests():
    vc = connector_config(kvtier_max_requests=2)
    kv = KvtierScheduler(vc, kv_cache_config(16), 800, BS, BS)
    pool = BlockPool(16, True, BS)
    kv.bind_gpu_block_pool(pool)
    for i in range(2):
        kv.update_state_after_alloc(Req(f"r{i}", [i] * 5), KVCacheBlocks(blocks=([],)), 0)
    with pytest.raises(RuntimeError, match="kvtier_max_requests"):
        kv.update_state_after_alloc(Req("r2", [2] * 5), KVCacheBlocks(blocks=([],)), 0)
    kv.request_finished(Req("r0", []), [])
    kv.update_state_after_alloc(Req("r2", [2] * 5), KVCacheBlocks(blocks=([],)), 0)
    assert kv._native.mapped_requests() == 2


# --- cpu_block_pool: vLLM's BlockPool names over kvtier's CPU pool ------------------------


def cpu_state(s) -> list:
    pool = s.cpu_block_pool
    blocks = [(b.block_id, b.ref_cnt, b.block_hash, b.is_null) for b in pool.blocks]
    return blocks, pool.get_num_free_blocks()


def store_now(t: Twin, req: Req, blocks: int) -> list[int]:
    """Computes ``blocks`` full blocks of ``req`` and completes their eager store; returns
    the CPU blocks they went to."""
    prefill(t, req, blocks)
    meta = t.call("build_connector_meta", step_output(cached=[(req.request_id, [], False)],
                                                      num_scheduled={req.request_id: 1}))
    t.call("update_connector_output", worker_output(stores={meta.store_event: 1}))
    return meta.store_cpu_blocks


def test_cpu_block_pool_touch_then_free_moves_blocks_to_the_lru_tail():
    t = Twin()  # 8 CPU blocks: the null block and 7 free
    (ref, _), (kv, _) = t.sides
    assert cpu_state(kv) == cpu_state(ref)
    a, b = Req("a", list(range(9))), Req("b", list(range(100, 109)))
    assert store_now(t, a, 2) == [1, 2]
    assert store_now(t, b, 2) == [3, 4]
    # Free queue now 5 6 7 (never used), then the stored blocks 1 2 3 4 in completion order.
    assert cpu_state(kv) == cpu_state(ref)
    for s in (ref, kv):
        pool = s.cpu_block_pool
        hit = [pool.cached_block_hash_to_block.get_one_block(
            make_block_hash_with_group_id(h, 0)) for h in a.block_hashes[:2]]
        assert [blk.block_id for blk in hit] == [1, 2]
        assert [blk.block_hash for blk in hit] == [
            make_block_hash_with_group_id(h, 0) for h in a.block_hashes[:2]]
        pool.touch(hit)
        assert [blk.ref_cnt for blk in hit] == [1, 1]
        assert pool.get_num_free_blocks() == 5
    assert cpu_state(kv) == cpu_state(ref)
    for s in (ref, kv):
        pool = s.cpu_block_pool
        pool.free_blocks([pool.blocks[1], pool.blocks[2]])
    assert cpu_state(kv) == cpu_state(ref)
    # Queue 5 6 7 3 4 1 2: four new blocks take 5 6 7 and b's first block, 3.
    c = Req("c", list(range(200, 217)))
    assert store_now(t, c, 4) == [5, 6, 7, 3]
    assert cpu_state(kv) == cpu_state(ref)
    for s in (ref, kv):
        cached = s.cpu_block_pool.cached_block_hash_to_block
        found = [cached.get_one_block(make_block_hash_with_group_id(h, 0))
                 for h in (*a.block_hashes[:2], *b.block_hashes[:2])]
        assert [None if f is None else f.block_id for f in found] == [1, 2, None, 4]
        # A key of another group is never cached.
        assert cached.get_one_block(make_block_hash_with_group_id(a.block_hashes[0], 1)) is None


def test_cpu_block_pool_refuses_bad_pins_and_changes_nothing():
    t = Twin()
    a = Req("a", list(range(9)))
    store_now(t, a, 2)
    kv = t.kv
    pool = kv.cpu_block_pool
    before = cpu_state(kv)
    # Block 1 is referenced once by the touch, block 3 never: vLLM would drive 3 below 0.
    pool.touch([pool.blocks[1]])
    with pytest.raises(ValueError, match="3"):
        pool.free_blocks([pool.blocks[1], pool.blocks[3]])
    assert pool.blocks[1].ref_cnt == 1
    pool.free_blocks([pool.blocks[1]])
    assert cpu_state(kv) == before
    with pytest.raises(ValueError):
        kv._native.cpu_pool().touch([kv.num_cpu_blocks])
    with pytest.raises(IndexError):
        kv._native.cpu_pool().ref_cnt(kv.num_cpu_blocks)
    assert cpu_state(kv) == before


def test_an_unknown_store_event_leaves_the_reports_valid_ones_completing():
    # vLLM ignores a report of an event it never issued (its guard against stale events) and
    # completes the report's others.
    t = Twin(events=True)
    a = Req("a", list(range(9)))
    prefill(t, a, 2)
    meta = t.call("build_connector_meta", step_output(cached=[("a", [], False)],
                                                      num_scheduled={"a": 1}))
    assert meta.store_event == 0
    t.call("update_connector_output", worker_output(stores={7: 1, 0: 1, 1 << 40: 3}))
    assert not t.kv.has_pending_stores()
    assert len(t.call("take_events")) > 0


def test_a_missing_table_at_finish_raises_type_error_as_vllm_does():
    t = Twin()
    a = Req("a", list(range(9)))
    prefill(t, a, 2)
    for s, _ in t.sides:
        with pytest.raises(TypeError):
            s.request_finished_all_groups(a, (None,))
    t.check()
    # A request with no store state reads no table, on either side.
    t.call("request_finished_all_groups", Req("b", list(range(5))), (None,))


def test_a_second_thread_calls_the_scheduler_without_a_panic():
    # The scheduler is not tied to the thread that made it: another thread's call runs (and a
    # call into a busy scheduler raises RuntimeError, as the manager's does), never a
    # PanicException (which `except Exception` does not catch).
    import threading

    t = Twin()
    a = Req("a", list(range(9)))
    prefill(t, a, 2)
    got: list[object] = []

    def work():
        try:
            got.append(t.kv.get_num_new_matched_tokens(Req("c", list(range(9))), 0))
            got.append(t.kv.has_pending_stores())
            got.append(t.kv.cpu_block_pool.get_num_free_blocks())
        except BaseException as e:  # noqa: BLE001 (the test is what it raises)
            got.append(e)

    th = threading.Thread(target=work)
    th.start()
    th.join()
    want = [
        t.sides[0][0].get_num_new_matched_tokens(Req("c", list(range(9))), 0),
        t.sides[0][0].has_pending_stores(),
        t.sides[0][0].cpu_block_pool.get_num_free_blocks(),
    ]
    assert got == want
