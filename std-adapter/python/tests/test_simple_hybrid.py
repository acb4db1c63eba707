"""``kvtier.simple.SimpleCPUOffloadScheduler`` on a hybrid model (one full-attention group and
one Mamba group in ``align`` mode, the same block size) against vLLM 0.33.0's own scheduler,
each on its own real vLLM GPU ``BlockPool``, in both group orders: every answer, KV event and
CPU pool key compared call by call."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace as NS

import pytest

from test_simple_scheduler import (
    BS,
    Req,
    _mamba,
    _two_groups,
    kv_cache_config,
    step_output,
    vllm_config,
    worker_output,
)
from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id
from vllm.v1.simple_kv_offload.manager import (
    SimpleCPUOffloadScheduler as VllmScheduler,
)

from kvtier.simple import SimpleCPUOffloadScheduler as KvtierScheduler


class HybridTwin:
    """vLLM's scheduler and kvtier's on one hybrid layout, each with its own GPU pool, fed the
    same calls. ``att`` and ``mamba`` are the groups' ids."""

    def __init__(self, mamba_first: bool, num_cpu_blocks: int, dcp: int = 1, gpu: int = 16):
        # DCP shards the attention group's blocks: its spec's block is BS / dcp tokens.
        attention = kv_cache_config(16).kv_cache_groups[0].kv_cache_spec
        attention = replace(attention, block_size=BS // dcp)
        groups = (_mamba(), attention) if mamba_first else (attention, _mamba())
        self.att, self.mamba = (1, 0) if mamba_first else (0, 1)
        cfg = vllm_config(events=NS(enable_kv_cache_events=True))
        cfg.parallel_config.decode_context_parallel_size = dcp
        self.sides = []
        for cls in (VllmScheduler, KvtierScheduler):
            s = cls(cfg, _two_groups(*groups, num_blocks=gpu), 100 * gpu, BS, BS,
                    num_cpu_blocks=num_cpu_blocks)
            pool = BlockPool(gpu, True, BS)
            s.bind_gpu_block_pool(pool)
            self.sides.append((s, pool))

    def call(self, method: str, *args):
        answers = [getattr(s, method)(*args) for s, _ in self.sides]
        if method == "take_events":
            answers = [[repr(e) for e in a] for a in answers]
        assert answers[1] == answers[0], method
        self.check()
        return answers[1]

    def check(self):
        (ref, _), (kv, _) = self.sides
        ref_keys = [b.block_hash for b in ref.cpu_block_pool.blocks]
        assert [b.block_hash for b in kv.cpu_block_pool.blocks] == ref_keys
        for key in filter(None, ref_keys):
            want = ref.cpu_block_pool.cached_block_hash_to_block.get_one_block(key)
            got = kv.cpu_block_pool.cached_block_hash_to_block.get_one_block(key)
            assert got.block_id == want.block_id
        assert kv.get_boundary_store_stats() == ref.get_boundary_store_stats()
        assert kv.get_stats().data == ref.get_stats().data

    def alloc(self, att: int, mamba: list[bool]) -> tuple[list[int], list[int]]:
        """``att`` attention blocks and a Mamba table (null where ``mamba`` is False)."""
        got = []
        for _, pool in self.sides:
            a = [b.block_id for b in pool.get_new_blocks(att)]
            m = [pool.get_new_blocks(1)[0].block_id if real else 0 for real in mamba]
            got.append((a, m))
        assert got[0] == got[1]
        return got[0]

    def tables(self, a: list[int], m: list[int]) -> tuple[list[int], ...]:
        t: list[list[int]] = [[], []]
        t[self.att], t[self.mamba] = list(a), list(m)
        return tuple(t)

    def after_alloc(self, req: Req, a: list[int], m: list[int], ext: int):
        for s, pool in self.sides:
            ids = self.tables(a, m)
            s.update_state_after_alloc(
                req, KVCacheBlocks(blocks=tuple([pool.blocks[b] for b in g] for g in ids)), ext
            )
        self.check()

    def cache(self, block: int, h: bytes, group: int, num_tokens: int):
        for _, pool in self.sides:
            key = make_block_hash_with_group_id(h, group)
            pool._insert_block_hash(key, pool.blocks[block], num_tokens)

    def step(self, req: Req, a, m, tokens: int, handoffs=(), new: bool = True):
        out = step_output(num_scheduled={req.request_id: tokens})
        if new:
            out.scheduled_new_reqs = [NS(req_id=req.request_id, block_ids=self.tables(a, m))]
        else:
            out.scheduled_cached_reqs = NS(
                req_ids=[req.request_id], new_block_ids=[None], resumed_req_ids=set()
            )
        out.kv_connector_block_state = NS(
            boundary_state_offloads={
                req.request_id: [(self.mamba, b, n) for b, n in handoffs]
            } if handoffs else {}
        )
        return self.call("build_connector_meta", out)


@pytest.mark.parametrize(
    ("mamba_first", "dcp"),
    [(False, 1), (True, 1), (False, 2)],
    ids=["attention-first", "mamba-first", "attention-first-dcp2"],
)
def test_hybrid_store_hit_load_and_eviction_match_vllm(mamba_first, dcp):
    """Under DCP the attention group's blocks are sharded (its spec's block is BS / dcp), the
    Mamba group's are not: both still cover BS tokens, and vLLM's coordinator then allows
    fine-grained hits, which at equal block sizes find what block-aligned ones find."""
    t = HybridTwin(mamba_first, num_cpu_blocks=4, dcp=dcp)
    a = Req("a", list(range(9)))  # two full blocks
    fa, mb = t.alloc(2, [False, True])
    t.after_alloc(a, fa, mb, 0)
    for i, b in enumerate(fa):
        t.cache(b, a.block_hashes[i], t.att, (i + 1) * BS)
    t.cache(mb[1], a.block_hashes[1], t.mamba, 2 * BS)
    a.num_computed_tokens = 2 * BS
    # The Mamba state comes from its hand-off, the attention blocks from the positional scan.
    meta = t.step(a, fa, mb, 1, handoffs=[(mb[1], 2 * BS)])
    assert sorted(meta.store_gpu_blocks) == sorted([*fa, mb[1]])
    t.call("update_connector_output", worker_output(stores={meta.store_event: 1}))
    t.call("take_events")
    # A hit covers both blocks (the Mamba state at its end): the attention blocks load into
    # the attention table, the state into the Mamba table's last hit position.
    b = Req("b", list(range(9)))
    assert t.call("get_num_new_matched_tokens", b, 0) == (2 * BS, True)
    fb, mbb = t.alloc(3, [False, True, False])
    t.after_alloc(b, fb, mbb, 2 * BS)
    meta = t.step(b, fb, mbb, 1)
    assert sorted(meta.load_gpu_blocks) == sorted([*fb[:2], mbb[1]])
    t.call("update_connector_output", worker_output(recving=["b"]))
    t.call("request_finished_all_groups", b, t.tables(fb, mbb))
    # A second hit, released unloaded: the pins go back in group order, and the next store
    # evicts the least recently used of them first.
    c = Req("c", list(range(9)))
    assert t.call("get_num_new_matched_tokens", c, 0) == (2 * BS, True)
    t.call("request_finished", c, [])
    d = Req("d", list(range(100, 109)))
    fd, md = t.alloc(2, [])
    t.after_alloc(d, fd, md, 0)
    for i, blk in enumerate(fd):
        t.cache(blk, d.block_hashes[i], t.att, (i + 1) * BS)
    d.num_computed_tokens = 2 * BS
    meta = t.step(d, fd, md, 1)
    assert len(meta.store_cpu_blocks) == 2
    t.call("update_connector_output", worker_output(stores={meta.store_event: 1}))
    assert any("BlockRemoved" in e for e in t.call("take_events"))


@pytest.mark.parametrize("mamba_first", [False, True], ids=["attention-first", "mamba-first"])
def test_hybrid_handoff_outcomes_partial_takes_and_local_prefixes_match_vllm(mamba_first):
    t = HybridTwin(mamba_first, num_cpu_blocks=6, gpu=32)
    a = Req("a", list(range(13)))  # three full blocks
    fa, mb = t.alloc(3, [True, True, True])
    t.after_alloc(a, fa, mb, 0)
    for i, b in enumerate(fa):
        t.cache(b, a.block_hashes[i], t.att, (i + 1) * BS)
    for i in (0, 2):  # the state after block 1 is never hashed
        t.cache(mb[i], a.block_hashes[i], t.mamba, (i + 1) * BS)
    a.num_computed_tokens = 3 * BS
    # Stored, the same block again (in flight), the null block, an unhashed block, stored.
    meta = t.step(a, fa, mb, 1, handoffs=[(mb[0], BS), (mb[0], BS), (0, 0), (mb[1], 2 * BS),
                                          (mb[2], 3 * BS)])
    assert {mb[0], mb[2]} <= set(meta.store_gpu_blocks)
    t.call("update_connector_output", worker_output(stores={meta.store_event: 1}))
    t.step(a, fa, mb, 1, handoffs=[(mb[0], BS)], new=False)  # already cached
    stats = t.call("get_boundary_store_stats")
    assert (stats.published, stats.stored, stats.skipped_in_flight, stats.dropped_null_block,
            stats.dropped_not_hashed, stats.skipped_already_cached) == (6, 2, 1, 1, 1, 1)
    t.call("take_events")
    # The scheduler takes two blocks of a three-block hit: the Mamba state at the hit's end
    # is not among them, so only attention blocks load.
    b = Req("b", list(range(13)))
    assert t.call("get_num_new_matched_tokens", b, 0) == (3 * BS, True)
    fb, mbb = t.alloc(4, [False, False, True, False])
    t.after_alloc(b, fb, mbb, 2 * BS)
    meta = t.step(b, fb, mbb, 1)
    assert meta.load_gpu_blocks == fb[:2]
    t.call("update_connector_output", worker_output(recving=["b"]))
    # A hit after a one-block local prefix: two blocks, the state at block 3 loading into
    # the Mamba table's position 2.
    c = Req("c", list(range(13)))
    assert t.call("get_num_new_matched_tokens", c, BS) == (2 * BS, True)
    fc, mc = t.alloc(4, [False, False, True, False])
    t.after_alloc(c, fc, mc, 2 * BS)
    meta = t.step(c, fc, mc, 1)
    assert sorted(meta.load_gpu_blocks) == sorted([*fc[1:3], mc[2]])
    t.call("update_connector_output", worker_output(recving=["c"]))
    t.call("reset")
