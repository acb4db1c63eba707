"""``kvtier.simple.SimpleCPUOffloadScheduler`` on layouts with sliding-window and chunked-local
groups, against vLLM 0.33.0's own scheduler, each on its own real vLLM GPU ``BlockPool``, fed
the same calls (``GroupsTwin``): every plan, stats payload, boundary count, KV event, CPU pool
key and GPU pool state compared call by call.

First vLLM's six chunked-local lookups (its ``test_chunked_local_cpu_lookup_requires_chunk_
aligned_prefix``, at this suite's block of 4 tokens), with the CPU pool filled by real stores.
Then the event payload of a request's first block when the eager scan reads a stale table
entry whose block another request reused. Then random runs (``LayoutDriver``): a small scheduler admits requests with local prefixes and CPU
hits (taking all or part of them, or failing the allocation), prefills in chunks, decodes,
drops blocks that left a sliding window or a chunk as vLLM's managers do (the block is freed,
still hashed, and its table entry becomes the null block), hands off Mamba states, preempts,
finishes, aborts, reports stores and loads over several steps and resets."""

from __future__ import annotations

import random
import re
from types import SimpleNamespace as NS

import pytest

from test_simple_hybrid import GroupsTwin, _attention, _ring
from test_simple_scheduler import (
    BS,
    Req,
    _mamba,
    block_hashes,
    step_output,
    worker_output,
    worker_round,
)
from vllm.v1.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    MambaSpec,
    SlidingWindowSpec,
)


def _window(tokens: int) -> SlidingWindowSpec:
    return SlidingWindowSpec(
        block_size=BS, num_kv_heads=1, head_size=8, dtype="f16", sliding_window=tokens
    )


def _chunked(tokens: int) -> ChunkedLocalAttentionSpec:
    return ChunkedLocalAttentionSpec(
        block_size=BS, num_kv_heads=1, head_size=8, dtype="f16", attention_chunk_size=tokens
    )


@pytest.mark.parametrize(
    ("local_blocks", "cached_chunk_blocks", "external_blocks"),
    [(0, 4, 4), (0, 5, 5), (1, 4, 0), (1, 5, 0), (4, 4, 0), (4, 5, 1)],
)
def test_chunked_local_lookup_needs_a_chunk_aligned_prefix_as_in_vllm(
    local_blocks, cached_chunk_blocks, external_blocks
):
    """A chunk of 4 blocks: a lookup after a local prefix that is not chunk-aligned finds
    nothing; otherwise the hit needs the chunked group's blocks from its last chunk's start."""
    t = GroupsTwin([_attention(), _chunked(4 * BS)], cpu_bytes=100 * 32, num_cpu_blocks=32)
    a = Req("a", list(range(5 * BS + 1)))
    ta = t.alloc(5)
    ta[1][:] = t.alloc(5)[t.att]
    t.admit(a, ta, 0)
    for i in range(5):
        t.cache(ta[0][i], a.block_hashes[i], 0, (i + 1) * BS)
    for i in range(cached_chunk_blocks):
        t.cache(ta[1][i], a.block_hashes[i], 1, (i + 1) * BS)
    a.num_computed_tokens = 5 * BS
    meta = t.schedule(a, ta, 1)
    assert len(meta.store_gpu_blocks) == 5 + cached_chunk_blocks
    t.call("update_connector_output", worker_output(stores={meta.store_event: 1}))
    (_, _), (kv, _) = t.sides
    free = kv.cpu_block_pool.get_num_free_blocks()
    b = Req("b", list(range(5 * BS + 1)))
    got = t.call("get_num_new_matched_tokens", b, local_blocks * BS)
    assert got == (external_blocks * BS, external_blocks > 0)
    t.call("request_finished", b, [])
    assert kv.cpu_block_pool.get_num_free_blocks() == free


def test_first_block_stored_from_a_reused_table_entry():
    """vLLM's connector keeps the block ids the scheduler output gave it: a sliding-window
    block freed (``remove_skipped_blocks``) before the scan reached it, then reused and hashed
    by another request, is stored under that request's hash, with the scanned request's
    tokens in its ``BlockStored`` event."""
    t = GroupsTwin([_attention(), _window(BS)], cpu_bytes=100 * 32, gpu=8, num_cpu_blocks=8)
    a = Req("a", list(range(2 * BS + 1)))
    ta = t.alloc(3)
    ta[1][:] = t.alloc(3)[t.att]
    t.admit(a, ta, 0)
    t.schedule(a, ta, 2 * BS)
    for g in (0, 1):
        for i in range(2):
            t.cache(ta[g][i], a.block_hashes[i], g, (i + 1) * BS)
    a.num_computed_tokens = 2 * BS
    # The window (4 tokens) no longer covers block 0: it is freed, still hashed, and the
    # next allocation of the pool's last two free blocks takes it for request b.
    t.free([[ta[1][0]]])
    b = Req("b", list(range(100, 100 + BS)))
    tb = t.alloc(2)
    assert tb[t.att][1] == ta[1][0]
    t.cache(ta[1][0], b.block_hashes[0], 1, BS)
    out = step_output(cached=[("a", None, False)], num_scheduled={"a": 1})
    t.call("build_connector_meta", out)


def _skipped_blocks(spec, num_computed_tokens: int) -> int:
    """The leading blocks vLLM's manager for ``spec`` frees once ``num_computed_tokens`` are
    computed (``get_num_skipped_tokens``, whole blocks); Mamba keeps its last state only."""
    if isinstance(spec, SlidingWindowSpec):
        return max(0, num_computed_tokens - spec.sliding_window + 1) // BS
    if isinstance(spec, ChunkedLocalAttentionSpec):
        chunk = spec.attention_chunk_size
        return num_computed_tokens // chunk * chunk // BS
    if isinstance(spec, MambaSpec):
        return max(0, num_computed_tokens // BS - 1)
    return 0


def _output(new, cached, scheduled, finished, preempted, handoffs):
    """A ``SchedulerOutput`` with per-group tables: ``new`` (req_id, tables), ``cached``
    (req_id, new ids per group or None, resumed), ``handoffs`` {req_id: entries}."""
    return NS(
        scheduled_new_reqs=[NS(req_id=r, block_ids=tuple(map(list, t))) for r, t in new],
        scheduled_cached_reqs=NS(
            req_ids=[r for r, _, _ in cached],
            new_block_ids=[None if t is None else tuple(map(list, t)) for _, t, _ in cached],
            resumed_req_ids={r for r, _, resumed in cached if resumed},
        ),
        num_scheduled_tokens=dict(scheduled),
        finished_req_ids=set(finished),
        preempted_req_ids=set(preempted) or None,
        kv_connector_block_state=NS(boundary_state_offloads=handoffs),
    )


class LayoutDriver:
    """A small stand-in for vLLM's scheduler and KV-cache manager around ``GroupsTwin``, for
    any layout of full-attention, sliding-window, chunked-local, Mamba and ring groups."""

    def __init__(self, specs, seed: int, lazy: bool = False):
        self.rng = random.Random(seed)
        self.specs = specs
        # GPU blocks for a few long requests in every group; a CPU pool of 12 blocks a
        # prefix-cacheable group, so that it evicts.
        gpu = 40 * len(specs)
        cpu = 12 * sum(1 for s in specs if s.prefix_cacheable)
        self.t = GroupsTwin(specs, cpu_bytes=100 * gpu * len(specs), lazy=lazy, gpu=gpu,
                            num_cpu_blocks=cpu)
        self.prefixes = [[self.rng.randrange(256) for _ in range(32)] for _ in range(5)]
        self.waiting: list[Req] = []
        self.loading: dict[str, Req] = {}
        self.running: dict[str, Req] = {}
        self.finished_last: list[str] = []
        self.preempted_now: list[str] = []
        self.stores: dict[int, int] = {}
        self.loads: dict[int, list[str]] = {}
        self.count = 0
        self.stored_groups: set[int] = set()
        self.seen = {"store": 0, "load": 0, "hit": 0, "partial": 0, "retry": 0, "preempt": 0,
                     "reset": 0, "abort": 0, "local": 0, "nulled_flush": 0, "events": 0}

    # --- the GPU side ---------------------------------------------------------------------

    def pools(self):
        return [pool for _, pool in self.t.sides]

    def alloc(self, n: int) -> list[int]:
        got = [[b.block_id for b in pool.get_new_blocks(n)] for pool in self.pools()]
        assert got[0] == got[1]
        return got[0]

    def free(self, ids: list[int]):
        for pool in self.pools():
            pool.free_blocks([pool.blocks[b] for b in ids if b])

    def free_blocks(self) -> int:
        return self.pools()[1].get_num_free_blocks()

    def hash(self, r: Req, g: int, i: int):
        """Caches table entry ``i`` of group ``g`` under the request's ``i``-th hash."""
        block = r.tables[g][i]
        if block and i < len(r.block_hashes):
            if self.pools()[1].blocks[block].block_hash is None:
                self.t.cache(block, r.block_hashes[i], g, (i + 1) * BS)

    def grow(self, r: Req, upto_tokens: int) -> list[list[int]]:
        """Extends every table to cover ``upto_tokens``, null where the group's manager skips
        blocks at the request's computed tokens; returns each group's new ids."""
        blocks = -(-upto_tokens // BS)
        added: list[list[int]] = [[] for _ in self.specs]
        for g, spec in enumerate(self.specs):
            if not spec.prefix_cacheable:
                if not r.tables[g]:
                    added[g] = self.alloc(1)
                    r.tables[g] += added[g]
                continue
            skip = _skipped_blocks(spec, r.num_computed_tokens)
            while len(r.tables[g]) < blocks:
                i = len(r.tables[g])
                new = 0 if i < skip else self.alloc(1)[0]
                r.tables[g].append(new)
                added[g].append(new)
        return added

    def drop_skipped(self, r: Req):
        """vLLM's ``remove_skipped_blocks``: frees what left a window, chunk or Mamba state,
        whether or not the eager scan has passed it (the scan then reads the stale id in the
        connector's table, a block another request may have reused and hashed)."""
        for g, spec in enumerate(self.specs):
            skip = _skipped_blocks(spec, r.num_computed_tokens) if spec.prefix_cacheable else 0
            gone = [b for b in r.tables[g][:skip] if b]
            if gone:
                self.free(gone[::-1])
                r.tables[g][:skip] = [0] * skip

    def release(self, r: Req):
        for g in reversed(range(len(self.specs))):
            self.free(r.tables[g][::-1])
        r.tables = [[] for _ in self.specs]

    def blocks_needed(self, r: Req, upto_tokens: int) -> int:
        blocks = -(-upto_tokens // BS)
        return sum(max(0, blocks - len(t)) for t in r.tables) + len(self.specs)

    # --- requests -------------------------------------------------------------------------

    def new_request(self):
        self.count += 1
        rng = self.rng
        prefix = rng.choice(self.prefixes)[: rng.randrange(4, 33)]
        tail = [rng.randrange(256) for _ in range(rng.randrange(1, 9))]
        r = Req(f"r{self.count}", prefix + tail)
        r.target = r.num_tokens + rng.randrange(1, 12)
        r.skip_reading_prefix_cache = rng.random() < 0.05
        r.tables, r.fresh = [[] for _ in self.specs], True
        self.waiting.append(r)

    def admit(self, r: Req, scheduled: dict, new: list, cached: list) -> bool:
        rng, t = self.rng, self.t
        full = (r.num_tokens - 1) // BS
        local = rng.randrange(1, full) if full > 1 and rng.random() < 0.3 else 0
        computed = local * BS
        ext, _ = t.call("get_num_new_matched_tokens", r, computed)
        take = ext if rng.random() < 0.8 else rng.randrange(0, ext // BS + 1) * BS
        self.seen["hit"] += ext > 0
        self.seen["partial"] += take < ext
        if self.blocks_needed(r, r.num_tokens) > self.free_blocks() - 4 or rng.random() < 0.1:
            self.seen["retry"] += 1
            return False  # allocation failed: the request stays waiting, its hit pinned
        self.seen["local"] += local > 0
        r.num_computed_tokens = computed + take
        self.grow(r, r.num_tokens)
        for g, spec in enumerate(self.specs):
            if spec.prefix_cacheable and not isinstance(spec, MambaSpec):
                for i in range(local):
                    self.hash(r, g, i)
            elif isinstance(spec, MambaSpec) and local:
                self.hash(r, g, local - 1)
        t.admit(r, r.tables, take)
        if take:
            r.loaded = False
            self.loading[r.request_id] = r
            return True
        self.schedule_prefill(r, scheduled, new, cached)
        return True

    def schedule_prefill(self, r: Req, scheduled: dict, new: list, cached: list):
        n = min(r.num_tokens - r.num_computed_tokens, 8)
        scheduled[r.request_id] = max(n, 1)
        if r.fresh:
            new.append((r.request_id, [list(x) for x in r.tables]))
        else:
            cached.append((r.request_id, [list(x) for x in r.tables], True))
        r.fresh = False
        self.running[r.request_id] = r

    def cache_full(self, r: Req, upto_tokens: int):
        for g, spec in enumerate(self.specs):
            if spec.prefix_cacheable and not isinstance(spec, MambaSpec):
                for i in range(min(upto_tokens // BS, len(r.tables[g]))):
                    self.hash(r, g, i)

    def finish(self, r: Req):
        positional = [
            g for g, s in enumerate(self.specs)
            if s.prefix_cacheable and not isinstance(s, MambaSpec)
        ]
        self.seen["nulled_flush"] += any(0 in r.tables[g] for g in positional)
        self.t.call("request_finished_all_groups", r, tuple(list(x) for x in r.tables))
        self.release(r)
        del self.running[r.request_id]
        self.finished_last.append(r.request_id)

    def preempt(self, r: Req):
        self.seen["preempt"] += 1
        self.release(r)
        r.num_computed_tokens = 0
        del self.running[r.request_id]
        self.preempted_now.append(r.request_id)
        self.waiting.append(r)

    def handoffs(self) -> dict:
        """Mamba states at the last confirmed block boundary of some running requests (most
        of them hashed first), and now and then one for a request that just finished."""
        rng = self.rng
        mamba = [g for g, s in enumerate(self.specs) if isinstance(s, MambaSpec)]
        out: dict[str, list] = {}
        if not mamba or self.t.sides[1][0]._lazy_mode:
            return out
        for r in self.running.values():
            i = r.num_computed_tokens // BS - 1
            if i < 0 or rng.random() < 0.4:
                continue
            for g in mamba:
                if i < len(r.tables[g]) and r.tables[g][i]:
                    if rng.random() < 0.8:
                        self.hash(r, g, i)
                    out.setdefault(r.request_id, []).append((g, r.tables[g][i], (i + 1) * BS))
        if self.finished_last and rng.random() < 0.3:
            out[self.finished_last[0]] = [(mamba[0], 1, BS)]
        return out

    # --- one step -------------------------------------------------------------------------

    def step(self):
        t, rng = self.t, self.rng
        scheduled, new, cached = {}, [], []
        for r in list(self.running.values()):
            if r.num_computed_tokens >= r.num_tokens:
                if r.num_tokens >= r.target:
                    continue
                r.all_token_ids.append(rng.randrange(256))
                r.block_hashes = block_hashes(r.all_token_ids)
            n = min(r.num_tokens - r.num_computed_tokens, 8)
            if self.blocks_needed(r, r.num_computed_tokens + n) > self.free_blocks():
                self.preempt(r)
                continue
            added = self.grow(r, r.num_computed_tokens + n)
            scheduled[r.request_id] = n
            cached.append((r.request_id, added if any(added) or rng.random() < 0.5 else None,
                           False))
        if len(self.waiting) < 3:
            self.new_request()
        for r in list(self.waiting):
            if self.admit(r, scheduled, new, cached):
                self.waiting.remove(r)
        for rid, r in list(self.loading.items()):
            if r.loaded:
                del self.loading[rid]
                self.schedule_prefill(r, scheduled, new, cached)
        for rid, n in scheduled.items():
            r = self.running[rid]
            self.cache_full(r, r.num_computed_tokens + n)
        out = _output(new, cached, scheduled, self.finished_last, self.preempted_now,
                      self.handoffs())
        meta = t.call("build_connector_meta", out)
        self.finished_last, self.preempted_now = [], []
        if meta.store_event >= 0:
            self.stores[meta.store_event] = 1
            self.seen["store"] += 1
        if meta.load_event >= 0:
            self.seen["load"] += 1
            self.loads[meta.load_event] = list(meta.load_event_to_reqs[meta.load_event])
        for rid, n in scheduled.items():
            r = self.running[rid]
            r.num_computed_tokens += n
            self.drop_skipped(r)
        worker_round(t, rng, self.stores, self.loads, self.loading, 0.6)
        for r in list(self.running.values()):
            if r.num_computed_tokens >= r.target or rng.random() < 0.03:
                self.finish(r)
        if self.running and rng.random() < 0.06:
            self.preempt(rng.choice(list(self.running.values())))
        if self.waiting and rng.random() < 0.05:
            r = self.waiting.pop(rng.randrange(len(self.waiting)))
            t.call("request_finished", r, [])
            self.release(r)
            self.seen["abort"] += 1
        if self.loading and rng.random() < 0.08:
            r = self.loading.pop(rng.choice(list(self.loading)))
            t.call("request_finished_all_groups", r, tuple(list(x) for x in r.tables))
            self.release(r)
            self.seen["abort"] += 1
        events = t.call("take_events")
        self.seen["events"] += len(events)
        for e in events:
            if e.startswith("BlockStored("):
                self.stored_groups.add(int(re.search(r"group_idx=(\d+)", e).group(1)))
        if rng.random() < 0.02:
            self.seen["reset"] += 1
            t.call("reset")


_LAYOUTS = {
    # A sliding window of 2 blocks (cdiv(8 - 1, 4)), after full attention.
    "attention-window8": (lambda: [_attention(), _window(2 * BS)], False),
    # A window of 13 tokens (3 blocks needed, 4 held), in lazy mode.
    "window13-attention-lazy": (lambda: [_window(13), _attention()], True),
    # A chunk of 4 blocks; two chunked groups of one spec, looked up together by vLLM.
    "attention-chunk16-chunk16": (lambda: [_attention(), _chunked(4 * BS), _chunked(4 * BS)],
                                  False),
    # Window, Mamba, a ring group, and two window groups of one spec.
    "window8-attention-mamba-window8-ring": (
        lambda: [_window(2 * BS), _attention(), _mamba(), _window(2 * BS), _ring()], False),
    # Full attention, a window and a chunk together.
    "attention-window12-chunk8": (lambda: [_attention(), _window(3 * BS), _chunked(2 * BS)],
                                  False),
    # A chunk of a block and a half: asked again at its own answer it may answer less, so
    # vLLM's single pass (two spec groups) and its loop (three) decide.
    "attention-chunk6": (lambda: [_attention(), _chunked(6)], False),
    "attention-window8-chunk6": (lambda: [_attention(), _window(2 * BS), _chunked(6)], False),
}


@pytest.mark.parametrize("layout", list(_LAYOUTS))
def test_random_runs_on_window_and_chunk_layouts_match_vllm(layout):
    specs, lazy = _LAYOUTS[layout]
    d = LayoutDriver(specs(), seed=sum(map(ord, layout)), lazy=lazy)
    for _ in range(250):
        d.step()
    d.t.call("get_stats")
    wanted = ["store", "load", "hit", "partial", "retry", "preempt", "abort", "local",
              "nulled_flush", "events"]
    assert all(d.seen[k] for k in wanted), d.seen
    # Every prefix-cacheable group's blocks were stored (their BlockStored events name them).
    assert d.stored_groups == {g for g, s in enumerate(d.specs) if s.prefix_cacheable}


def test_layouts_with_window_and_chunk_groups_are_accepted_with_vllms_names():
    for specs in (s for s, _ in _LAYOUTS.values()):
        t = GroupsTwin(specs(), cpu_bytes=100 * 32, num_cpu_blocks=8)
        (ref, _), (kv, _) = t.sides
        assert kv.fa_gidx == next(
            i for i, s in enumerate(t.specs) if isinstance(s, FullAttentionSpec)
        )
        assert kv.group_block_sizes == ref.group_block_sizes


def test_one_kind_of_two_specs_beside_an_unaligned_chunk_is_refused():
    """kvtier looks groups of one kind and window up together; vLLM only groups of one spec.
    The two agree but beside a chunked group whose chunk is not a multiple of the block."""
    other_heads = SlidingWindowSpec(
        block_size=BS, num_kv_heads=2, head_size=8, dtype="f16", sliding_window=2 * BS
    )
    with pytest.raises(ValueError, match="groups 1 and 2 are of one kind with different specs"):
        GroupsTwin([_attention(), _window(2 * BS), other_heads, _chunked(6)],
                   cpu_bytes=100 * 32, num_cpu_blocks=8)
    # Beside a chunk of whole blocks, or with equal specs, the layout is taken.
    GroupsTwin([_attention(), _window(2 * BS), other_heads, _chunked(2 * BS)],
               cpu_bytes=100 * 32, num_cpu_blocks=8)
    GroupsTwin([_attention(), _window(2 * BS), _window(2 * BS), _chunked(6)],
               cpu_bytes=100 * 32, num_cpu_blocks=8)
