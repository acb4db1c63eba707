"""kvtier's SimpleCPUOffloadScheduler against vLLM 0.33.0's, step by step on the shared traces.

Both schedulers run the same engine steps (``simple_driver``: each its own vLLM
``KVCacheManager`` and ``BlockPool``, the same admissions, chunks, decode tokens, worker
reports two workers strong), so any difference is the scheduler's. Compared at every step:
the CPU hits ``get_num_new_matched_tokens`` returns, the whole ``build_connector_meta``
result, the drained ``get_stats()`` payload, the KV events ``take_events()`` returns and the
``request_finished_all_groups`` results, ``has_pending_stores()`` and
``get_boundary_store_stats()``; after the last step, ``reset()``. Configurations: the first
requests of small-a.kvtrace and of mooncake-synthetic.jsonl, eager and lazy offloading, a CPU
pool smaller than the GPU's and one larger, a preemption every 13 steps, KV-cache events on;
each on a dense model (one full-attention group) and on a hybrid one (a full-attention group
and a Mamba group in ``align`` mode, whose states reach the offloader as vLLM's manager hands
them off), and the hybrid one with its groups in the other order too. Then local layouts: a
full-attention group beside a sliding-window group of a 49-token window, or beside a
chunked-local group of 64-token chunks, on fewer requests of both traces (vLLM's manager
nulls and frees the blocks that left the window or chunk, and its hits carry null blocks
there; KVTIER_SIMPLE_LOCAL_REQUESTS sets how many, 0 the whole trace). Then, on as many
requests, hashes finer than the block and EAGLE: a hybrid model whose attention blocks (and
hashes) are 8 tokens beside 16-token Mamba blocks (vLLM's partial hash hits: hits ending
inside a block, mid-block loads), the same with 4-token hashes and EAGLE's block drop, a dense
model with attention groups of 16- and 8-token blocks (blocks stored with the finer hashes
inside them), and a dense model with EAGLE. Every fourth prompt ends on a hash-block boundary
and repeats the one four before, so that a hit can reach the lookup's cap (where EAGLE looks
one hash block past it).

Then the hardened runs, on as many requests as the local layouts: the GPU pool overcommitted
(admission asks for a first chunk's blocks only, and a running request that finds no free block
preempts the ones after it), a request aborted in its prefill every 17 steps, the connector's
reset() every 29 steps with requests in flight, every fifth store event reported two steps
late, every report also naming an event never issued and one completed, and a CPU pool between
the two above (it evicts, and still hits). Each of these is counted and must happen.
"""

from __future__ import annotations

import os

import pytest

import simple_driver as driver
from vllm.v1.simple_kv_offload.manager import (
    SimpleCPUOffloadScheduler as VllmScheduler,
)

try:
    from kvtier.simple import SimpleCPUOffloadScheduler as KvtierScheduler
except ImportError as e:  # the class is not built into this package
    KvtierScheduler = None
    _MISSING = str(e)

# The repository's copies of the shared traces.
TRACES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "tests", "data")

# Requests taken from the start of each trace (KVTIER_SIMPLE_REQUESTS=0: the whole traces,
# 1,000 and 2,886 requests, some 30 s a scheduler over the eight configurations).
_N = int(os.environ.get("KVTIER_SIMPLE_REQUESTS", "300")) or 10**9
PREFIX = {"small-a": _N, "mooncake": _N}
# Every 13th step preempts a running request.
PREEMPT_EVERY = 13
# Every 4th prompt ends on a hash-block boundary (the others a few tokens past one).
ALIGNED_EVERY = 4


def _requests(trace: str, model: str = "dense", n: int | None = None) -> list[list[int]]:
    if n is None:
        n = _N_LOCAL if model in LOCAL or model in FINE else PREFIX[trace]
    if trace == "small-a":
        return driver.kvtrace_requests(os.path.join(TRACES, "small-a.kvtrace"), n)
    return driver.mooncake_requests(os.path.join(TRACES, "mooncake-synthetic.jsonl"), n)


# Requests of each trace the local layouts run (some 10 s for all their cases; 0: the whole
# traces, some 9 minutes).
_N_LOCAL = int(os.environ.get("KVTIER_SIMPLE_LOCAL_REQUESTS", "80")) or 10**9
# The local layouts' window and chunk, in tokens: a window of three blocks and a token (a
# hit needs three contiguous blocks, and a block leaves the window one token after filling
# the fourth), chunks of four blocks; the traces' prompts are longer than both.
WINDOW = 49
CHUNK = 64
# A local layout's request (and one of two attention groups) is admitted for its whole
# length in both groups: a larger GPU pool, so that small-a's longest request fits beside the
# blocks lazy offloading keeps pinned (with 160 blocks, one of 143 never does).
LOCAL_GPU_BLOCKS = 256


# The model: dense, hybrid (attention group 0, Mamba group 1), or hybrid with the Mamba group
# first.
MODELS = ("dense", "hybrid", "mamba-first")
LOCAL = ("window", "chunked")
# The dense model's geometries: (hash block size, EAGLE).
# "fine": a hybrid model whose attention blocks (and hashes) are finer than its Mamba
# blocks; "groups": a dense one with two attention groups of different block sizes.
FINE = {
    "fine8": (8, False),
    "fine4-eagle": (4, True),
    "groups8": (8, False),
    "eagle": (16, True),
}

CASES = [
    (trace, lazy, cpu, model)
    for model in MODELS
    for trace in (("small-a",) if model == "mamba-first" else ("small-a", "mooncake"))
    for lazy in (False, True)
    for cpu in (48, 512)
] + [
    (trace, lazy, cpu, model)
    for model in (*LOCAL, *FINE)
    for trace in ("small-a", "mooncake")
    for lazy in (False, True)
    for cpu in (48, 512)
]


def _ids(case) -> str:
    trace, lazy, cpu, model = case
    return f"{model}-{trace}-{'lazy' if lazy else 'eager'}-cpu{cpu}"


def _shape(case) -> driver.Shape:
    _, lazy, cpu, model = case
    hash_block, eagle = FINE.get(model, (driver.BLOCK, False))
    return driver.Shape(
        lazy=lazy,
        cpu_blocks=cpu,
        preempt_every=PREEMPT_EVERY,
        kv_events=True,
        hybrid=model in ("hybrid", "mamba-first") or model.startswith("fine"),
        mamba_first=model == "mamba-first",
        sliding_window=WINDOW if model == "window" else 0,
        attention_chunk=CHUNK if model == "chunked" else 0,
        gpu_blocks=(
            LOCAL_GPU_BLOCKS if model in (*LOCAL, "groups8") else driver.Shape().gpu_blocks
        ),
        hash_block=hash_block,
        eagle=eagle,
        aligned_every=ALIGNED_EVERY,
    )


# The hardened runs: models, CPU pool (blocks), and what each adds to the engine.
HARD_MODELS = ("dense", "hybrid", "fine4-eagle", "window")
HARD_CPU = 256
HARD = dict(overcommit=True, abort_every=17, reset_every=29, disorder_every=5)
HARD_CASES = [
    (trace, lazy, HARD_CPU, model)
    for model in HARD_MODELS
    for trace in ("small-a", "mooncake")
    for lazy in (False, True)
]


def _records(cls, case):
    return list(driver.run(cls, _requests(case[0], case[3]), _shape(case)))


def _outcomes(records) -> dict[str, int]:
    """The save outcomes the run's drained stats counted, by outcome."""
    total: dict[str, int] = {}
    for r in records:
        for (name, labels), value in r.outcomes.items():
            total[labels[0]] = total.get(labels[0], 0) + value
    return total


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_driver_exercises_the_offloader(case):
    """The comparison below is not vacuous: on vLLM's scheduler every configuration runs
    every request to its end, stores, flushes after preemptions and emits KV events, and the
    CPU pool larger than the GPU's loads CPU hits back."""
    recs = _records(VllmScheduler, case)
    stored = sum(len(r.meta["store_gpu_blocks"]) for r in recs)
    loaded = sum(len(r.meta["load_gpu_blocks"]) for r in recs)
    hits = sum(1 for r in recs for _, n, _ in r.hits if n)
    finished = sum(len(r.finished) for r in recs)
    flushes = sum(r.meta["need_flush"] for r in recs)
    assert finished == len(_requests(case[0], case[3]))
    events = sum(len(r.events) for r in recs)
    assert stored > 0 and flushes > 0 and events > 0
    if case[2] > _shape(case).gpu_blocks:
        assert hits > 0 and loaded > 0
    outcomes = _outcomes(recs)
    if case[3] in ("dense", *LOCAL, "groups8", "eagle") or case[1]:
        # No Mamba group, or lazy offloading, which stores no hand-off.
        assert outcomes == {}
    else:
        # vLLM's manager handed states off, and the offloader stored them; those a CPU hit
        # loaded back were already cached when the loading request handed them off again.
        assert outcomes.get("stored", 0) > 0
        if case[2] > driver.Shape().gpu_blocks:
            assert outcomes.get("skipped_already_cached", 0) > 0


class _NullCounting(VllmScheduler):
    """vLLM's scheduler, counting the null entries of the finished requests' local groups."""

    nulls = 0

    def request_finished_all_groups(self, request, block_ids):
        type(self).nulls += sum(1 for b in block_ids[1] if b == 0)
        return super().request_finished_all_groups(request, block_ids)


@pytest.mark.parametrize("model", LOCAL)
def test_local_layouts_null_blocks(model):
    """In the local layouts vLLM's manager did null blocks (left the window or the chunk)
    in the tables the offloader saw, and a CPU hit loaded blocks back."""
    _NullCounting.nulls = 0
    case = ("small-a", False, 512, model)
    recs = _records(_NullCounting, case)
    assert _NullCounting.nulls > 0
    assert sum(len(r.meta["load_gpu_blocks"]) for r in recs) > 0


@pytest.mark.skipif(KvtierScheduler is None, reason="kvtier.simple is not built in")
@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_kvtier_matches_vllm_step_by_step(case):
    reqs = _requests(case[0], case[3])
    want = driver.run(VllmScheduler, reqs, _shape(case))
    got = driver.run(KvtierScheduler, reqs, _shape(case))
    n = 0
    for w, g in zip(want, got, strict=True):
        for what in (
            "hits", "meta", "stats", "events", "finished", "pending_stores", "boundary", "reset"
        ):
            assert getattr(g, what) == getattr(w, what), (
                f"step {w.step}: {what} differs\nvLLM:   {getattr(w, what)}\n"
                f"kvtier: {getattr(g, what)}"
            )
        n += 1
    assert n > 0


def test_finer_hashes_reach_the_offloader_in_vllm():
    """The fine geometries are live in the driver, on vLLM's scheduler: in the hybrid model
    with 8-token hashes a CPU hit ends inside a 16-token block (a partial hash hit, its Mamba
    state copied on write by vLLM's manager); with two attention groups of 16- and 8-token
    blocks, a 16-token block is stored with an 8-token hash beside its own (a secondary
    hash, or a prompt's partial last block)."""
    fine = _records(VllmScheduler, ("mooncake", False, 512, "fine8"))
    assert any(n and n % driver.BLOCK for r in fine for _, n, _ in r.hits)
    groups = _records(VllmScheduler, ("mooncake", False, 512, "groups8"))
    stored = [e for r in groups for e in r.events if e.startswith("BlockStored(")]
    assert any("block_size=8," in e and "group_idx=0," in e for e in stored)
    assert any("block_size=16," in e and "group_idx=0," in e for e in stored)


def test_eagle_drops_hit_blocks_in_vllm():
    """EAGLE's block drop is live in the driver: vLLM's scheduler finds fewer CPU hit tokens
    on the same requests with it than without it."""
    case = ("small-a", False, 512, "eagle")
    plain = driver.Shape(**{**_shape(case).__dict__, "eagle": False})
    reqs = _requests(case[0], case[3])

    def hit_tokens(shape) -> int:
        return sum(n or 0 for r in driver.run(VllmScheduler, reqs, shape) for _, n, _ in r.hits)

    assert 0 < hit_tokens(_shape(case)) < hit_tokens(plain)


def _hard_shape(case) -> driver.Shape:
    return driver.Shape(**{**_shape(case).__dict__, **HARD})


def _counts(records) -> dict[str, int]:
    total: dict[str, int] = {}
    for r in records:
        for what, n in r.counts.items():
            total[what] = total.get(what, 0) + n
    return total


@pytest.mark.skipif(KvtierScheduler is None, reason="kvtier.simple is not built in")
@pytest.mark.parametrize("case", HARD_CASES, ids=_ids)
def test_kvtier_matches_vllm_through_preemptions_aborts_resets_and_disorder(case):
    reqs = _requests(case[0], n=_N_LOCAL)
    want = list(driver.run(VllmScheduler, reqs, _hard_shape(case)))
    got = list(driver.run(KvtierScheduler, reqs, _hard_shape(case)))
    assert len(got) == len(want)
    for w, g in zip(want, got):
        for what in (
            "hits", "meta", "stats", "events", "finished", "pending_stores", "boundary", "reset"
        ):
            assert getattr(g, what) == getattr(w, what), (
                f"step {w.step}: {what} differs\nvLLM:   {getattr(w, what)}\n"
                f"kvtier: {getattr(g, what)}"
            )
    # What the run is for did happen (counted on vLLM's side; kvtier's ran the same steps).
    counts = _counts(want)
    for what in ("gpu_preemptions", "aborts", "resets", "late_reports", "stale_reports"):
        assert counts.get(what, 0) > 0, (what, counts)
    evicted = sum(1 for r in want for e in r.events if e.startswith("BlockRemoved("))
    assert evicted > 0
    assert sum(len(r.finished) for r in want) == len(reqs)
    if case[3] != "window":
        # The CPU pool evicts and still hits, and some hit reaches a hash-aligned end.
        assert sum(1 for r in want for _, n, _ in r.hits if n) > 0
        assert counts.get("aligned_hits", 0) > 0, counts


def test_hash_aligned_prompts_hit_in_the_eagle_geometry():
    """The hybrid model with 4-token hashes and EAGLE meets CPU hits of requests that end on
    a hash block (where EAGLE's lookup reaches one hash block past the cap)."""
    recs = _records(VllmScheduler, ("small-a", False, 512, "fine4-eagle"))
    assert _counts(recs).get("aligned_hits", 0) > 0
