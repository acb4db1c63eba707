"""``kvtier.simple.SimpleCPUOffloadScheduler`` on a hybrid model (one full-attention group and
one Mamba group in ``align`` mode, the same block size) against vLLM 0.33.0's own scheduler,
each on its own real vLLM GPU ``BlockPool``, in both group orders: every answer, KV event and
CPU pool key compared call by call. Then either layout with groups that are not
prefix-cacheable (ring groups, ``CircularBufferSpec``) among its groups, compared the same way,
and the layouts kvtier refuses where vLLM's scheduler would build a different coordinator."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace as NS

import pytest

from test_simple_scheduler import (
    BS,
    BYTES_PER_BLOCK,
    Req,
    gpu_state,
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
from vllm.v1.kv_cache_interface import (
    CircularBufferSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
    MambaSpec,
)
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


def _ring(block_size: int = BS // 2, sharded: bool = False) -> CircularBufferSpec:
    """A ring group's spec: one block per request, not prefix-cacheable."""
    return CircularBufferSpec(
        block_size=block_size, num_kv_heads=1, head_size=8, head_size_v=0, dtype="f16",
        dcp_sharded=sharded,
    )


def _attention() -> FullAttentionSpec:
    return kv_cache_config(16).kv_cache_groups[0].kv_cache_spec


def _layout(specs, num_blocks: int, tensor_bytes=None) -> KVCacheConfig:
    """One group per spec, each with its own tensor (``tensor_bytes[i]`` bytes per block;
    vLLM sizes the CPU pool from the first tensor alone)."""
    per_block = tensor_bytes or [BYTES_PER_BLOCK] * len(specs)
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[
            KVCacheTensor(size=b * num_blocks, layers=[f"l{i}"], layer_stride=b * num_blocks,
                          block_stride=b, offset=0)
            for i, b in enumerate(per_block)
        ],
        kv_cache_groups=[KVCacheGroupSpec([f"l{i}"], spec) for i, spec in enumerate(specs)],
    )


class GroupsTwin(HybridTwin):
    """vLLM's scheduler and kvtier's on a layout of any groups, each with its own GPU pool;
    a request's tables are given whole (one list per group, in group order)."""

    def __init__(self, specs, cpu_bytes: int, *, lazy: bool = False, lookahead: int = 0,
                 gpu: int = 32, tensor_bytes=None, num_cpu_blocks=None):
        self.specs = list(specs)
        self.att = next(i for i, s in enumerate(specs) if type(s) is FullAttentionSpec)
        self.mamba = next((i for i, s in enumerate(specs) if isinstance(s, MambaSpec)), None)
        self.scratch = [i for i, s in enumerate(specs) if not s.prefix_cacheable]
        cfg = vllm_config(events=NS(enable_kv_cache_events=True))
        cfg.num_prefill_lookahead_tokens = lookahead
        layout = _layout(specs, gpu, tensor_bytes)
        self.sides = []
        for cls in (VllmScheduler, KvtierScheduler):
            s = cls(cfg, layout, cpu_bytes, BS, BS, lazy_offload=lazy,
                    num_cpu_blocks=num_cpu_blocks)
            pool = BlockPool(gpu, True, BS)
            s.bind_gpu_block_pool(pool)
            self.sides.append((s, pool))
        (ref, _), (kv, _) = self.sides
        for name in ("num_cpu_blocks", "fa_gidx", "fa_block_size", "group_block_sizes",
                     "prefix_cacheable_group_ids", "_target_free"):
            assert getattr(kv, name) == getattr(ref, name), name

    def check(self):
        super().check()
        (_, ref_pool), (_, kv_pool) = self.sides
        assert gpu_state(kv_pool) == gpu_state(ref_pool)

    def alloc(self, att: int, mamba=(), scratch: bool = True) -> tuple[list[int], ...]:
        """``att`` attention blocks, a Mamba table (null where ``mamba`` is False) and, with
        ``scratch``, one block for each group that is not prefix-cacheable."""
        got = []
        for _, pool in self.sides:
            t: list[list[int]] = [[] for _ in self.specs]
            t[self.att] = [b.block_id for b in pool.get_new_blocks(att)]
            if self.mamba is not None:
                t[self.mamba] = [pool.get_new_blocks(1)[0].block_id if m else 0 for m in mamba]
            for g in self.scratch if scratch else ():
                t[g] = [pool.get_new_blocks(1)[0].block_id]
            got.append(tuple(t))
        assert got[0] == got[1]
        return got[0]

    def admit(self, req: Req, tables, ext: int):
        for s, pool in self.sides:
            blocks = tuple([pool.blocks[b] for b in g] for g in tables)
            s.update_state_after_alloc(req, KVCacheBlocks(blocks=blocks), ext)
        self.check()

    def hash_attention(self, req: Req, tables, n: int):
        for i in range(n):
            self.cache(tables[self.att][i], req.block_hashes[i], self.att, (i + 1) * BS)

    def schedule(self, req: Req, tables, tokens: int, handoffs=(), new: bool = True):
        out = step_output(num_scheduled={req.request_id: tokens})
        if new:
            out.scheduled_new_reqs = [NS(req_id=req.request_id, block_ids=tuple(tables))]
        else:
            out.scheduled_cached_reqs = NS(
                req_ids=[req.request_id], new_block_ids=[None], resumed_req_ids=set()
            )
        out.kv_connector_block_state = NS(
            boundary_state_offloads={req.request_id: list(handoffs)} if handoffs else {}
        )
        return self.call("build_connector_meta", out)

    def free(self, tables):
        """Returns a finished request's blocks to both GPU pools, tail first (vLLM's order)."""
        for _, pool in self.sides:
            blocks = [pool.blocks[b] for g in tables for b in g if b]
            pool.free_blocks(reversed(blocks))
        self.check()


_SCRATCH_LAYOUTS = {
    "attention-ring": lambda: [_attention(), _ring()],
    "ring-attention-ring": lambda: [_ring(), _attention(), _ring(BS)],
    "attention-mamba-ring": lambda: [_attention(), _mamba(), _ring(1)],
    "ring-mamba-attention": lambda: [_ring(), _mamba(), _attention()],
}


@pytest.mark.parametrize("layout", list(_SCRATCH_LAYOUTS))
def test_groups_not_prefix_cacheable_are_left_out_as_in_vllm(layout):
    """Stores, hits, loads, the finish-time flush, hand-offs (one naming a ring group's block,
    which vLLM classifies like any other: unhashed), events and stats all match vLLM's, and no
    ring block is ever stored or loaded."""
    t = GroupsTwin(_SCRATCH_LAYOUTS[layout](), cpu_bytes=100 * 32, num_cpu_blocks=8)
    hybrid = t.mamba is not None
    a = Req("a", list(range(13)))  # three full blocks
    ta = t.alloc(3, [False, False, True])
    rings = {b for g in t.scratch for b in ta[g]}
    t.admit(a, ta, 0)
    t.hash_attention(a, ta, 2)
    handoffs = [(g, b, 0) for g in t.scratch for b in ta[g]]
    if hybrid:
        t.cache(ta[t.mamba][2], a.block_hashes[2], t.mamba, 3 * BS)
        handoffs.append((t.mamba, ta[t.mamba][2], 3 * BS))
    a.num_computed_tokens = 2 * BS  # the third block is not computed yet
    meta = t.schedule(a, ta, 1, handoffs=handoffs)
    assert not rings & set(meta.store_gpu_blocks)
    assert t.call("get_boundary_store_stats").dropped_not_hashed == len(t.scratch)
    t.call("update_connector_output", worker_output(stores={meta.store_event: 1}))
    t.call("take_events")
    # The third attention block is computed and hashed; the finish-time flush stores it.
    a.num_computed_tokens = 3 * BS
    t.hash_attention(a, ta, 3)
    t.call("request_finished_all_groups", a, ta)
    meta = t.call("build_connector_meta", step_output(finished=["a"]))
    assert meta.store_gpu_blocks == [ta[t.att][2]]
    t.call("update_connector_output", worker_output(stores={meta.store_event: 1}))
    t.call("take_events")
    t.free(ta)
    # A hit on all three blocks (in a hybrid model up to the Mamba state held) loads into the
    # attention table (and the Mamba table), never into a ring block.
    b = Req("b", list(range(13)))
    assert t.call("get_num_new_matched_tokens", b, 0) == (3 * BS, True)
    tb = t.alloc(4, [False, False, True, False])
    t.admit(b, tb, 3 * BS)
    meta = t.schedule(b, tb, 1)
    want = [*tb[t.att][:3], *([tb[t.mamba][2]] if hybrid else [])]
    assert sorted(meta.load_gpu_blocks) == sorted(want)
    t.call("update_connector_output", worker_output(recving=["b"]))
    # A hit after a one-block local prefix, released unloaded.
    c = Req("c", list(range(13)))
    assert t.call("get_num_new_matched_tokens", c, BS) == (2 * BS, True)
    t.call("request_finished", c, [])
    t.call("request_finished_all_groups", b, tb)
    t.call("build_connector_meta", step_output(finished=["b"]))
    t.call("get_stats")
    t.call("take_events")
    assert t.call("reset") is True
    assert any("AllBlocksCleared" in e for e in t.call("take_events"))


def test_ring_group_in_lazy_mode_matches_vllm():
    """Lazy mode: the target counts the prefix-cacheable groups only, and the free-queue walk
    passes over the ring blocks (they are never hashed)."""
    t = GroupsTwin([_ring(), _attention()], cpu_bytes=100 * 8, lazy=True, gpu=8, num_cpu_blocks=6)
    a = Req("a", list(range(13)))
    ta = t.alloc(3)
    t.admit(a, ta, 0)
    t.hash_attention(a, ta, 3)
    t.call("request_finished", a, [])
    t.free(ta)
    meta = t.call("build_connector_meta", step_output())
    assert sorted(meta.store_gpu_blocks) == sorted(ta[t.att])
    t.call("update_connector_output", worker_output(stores={meta.store_event: 1}))
    events = t.call("take_events")
    assert len(events) == 3 and all("group_idx=1" in e for e in events)
    b = Req("b", list(range(13)))
    assert t.call("get_num_new_matched_tokens", b, 0) == (3 * BS, True)
    tb = t.alloc(4)
    t.admit(b, tb, 3 * BS)
    meta = t.call("build_connector_meta", step_output())
    assert sorted(meta.load_gpu_blocks) == sorted(tb[t.att][:3])


@pytest.mark.parametrize(
    ("specs", "stored"),
    [
        (lambda: [_attention()], 2),
        (lambda: [_attention(), _ring()], 3),
        (lambda: [_mamba(), _attention()], 3),
    ],
    ids=["dense", "attention-ring", "mamba-attention"],
)
def test_prefill_lookahead_is_held_back_only_in_a_dense_model_as_in_vllm(specs, stored):
    """With 3 prefill lookahead tokens, vLLM's coordinator for one group holds the last 2
    computed tokens back from the eager scan; its coordinator for several groups (a ring
    group included) does not."""
    t = GroupsTwin(specs(), cpu_bytes=100 * 32, lookahead=3, num_cpu_blocks=8)
    a = Req("a", list(range(13)))
    ta = t.alloc(3, [False, False, False])
    t.admit(a, ta, 0)
    t.hash_attention(a, ta, 3)
    a.num_computed_tokens = 3 * BS
    meta = t.schedule(a, ta, 1)
    assert len(meta.store_gpu_blocks) == stored


def test_cpu_pool_is_sized_from_the_first_tensor_as_in_vllm():
    """vLLM divides the budget by the first KV-cache tensor's size, a ring group's included."""
    for tensor_bytes in ([10, BYTES_PER_BLOCK], [BYTES_PER_BLOCK, 10]):
        t = GroupsTwin([_ring(), _attention()], cpu_bytes=100 * 32, tensor_bytes=tensor_bytes)
        assert t.sides[1][0].num_cpu_blocks == 32 * 100 * 32 // (32 * tensor_bytes[0])


class _FullScratchSpec(FullAttentionSpec):
    """A full-attention kind of spec that is not prefix-cacheable."""

    @property
    def prefix_cacheable(self) -> bool:
        return False


def test_layouts_vllm_builds_differently_are_refused():
    cfg = vllm_config()
    with pytest.raises(ValueError, match="not a multiple of group 1's block size 3"):
        KvtierScheduler(cfg, _layout([_attention(), _ring(3)], 16), 800, BS, BS)
    with pytest.raises(AssertionError):  # vLLM's coordinator refuses it too
        VllmScheduler(cfg, _layout([_attention(), _ring(3)], 16), 800, BS, BS)
    # A prefix-cacheable group left out of KV transfer: vLLM would look it up but never
    # store it.
    layout = _layout([_attention(), _ring()], 16)
    layout.kv_cache_groups[0].enable_kv_transfer = False
    with pytest.raises(ValueError, match="enable_kv_transfer=False"):
        KvtierScheduler(cfg, layout, 800, BS, BS)
    # vLLM's fa_gidx would name the scratch group.
    scratch = _FullScratchSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype="f16")
    with pytest.raises(ValueError, match="group 0 \\(_FullScratchSpec\\) comes first"):
        KvtierScheduler(cfg, _layout([scratch, _attention()], 16), 800, BS, BS)
    assert VllmScheduler(cfg, _layout([scratch, _attention()], 16), 800, BS, BS).fa_gidx == 0
    # Under DCP a hybrid coordinator refuses a sharded group other than full attention.
    dcp = vllm_config()
    dcp.parallel_config.decode_context_parallel_size = 2
    attention = replace(_attention(), block_size=BS // 2)
    with pytest.raises(ValueError, match="sharded CircularBufferSpec"):
        KvtierScheduler(dcp, _layout([attention, _ring(1, sharded=True)], 16), 800, BS, BS)
    with pytest.raises(AssertionError):
        VllmScheduler(dcp, _layout([attention, _ring(1, sharded=True)], 16), 800, BS, BS)
    t = GroupsTwin([_attention(), _ring()], cpu_bytes=800)
    # A retention interval with no sliding-window or Mamba group is refused by both.
    layout = _layout([_attention(), _ring()], 16)
    layout.prefix_cache_retention_interval = 2 * BS
    for cls in (VllmScheduler, KvtierScheduler):
        with pytest.raises(ValueError, match="prefix_cache_retention_interval"):
            cls(cfg, layout, 800, BS, BS)
    # No prefix-cacheable group at all.
    with pytest.raises(ValueError, match="prefix-cacheable groups are none"):
        KvtierScheduler(cfg, _layout([_ring(), _ring()], 16), 800, BS, BS)
    assert t.sides[1][0].prefix_cacheable_group_ids == (0,)
