"""The simple offloader's scheduler side: vLLM 0.33.0's SimpleCPUOffloadScheduler against
kvtier's, on the same engine steps.

    python bench/simple.py [--requests 400] [--runs 5] [--trace small-a|mooncake]
                           [--layout dense|hybrid|window|chunked]

Both run the differential test's step loop (tests/simple_driver.py: vLLM's KVCacheManager as
the GPU side, the same admissions, chunks, decode tokens and worker reports); only the calls
into the scheduler are timed (``get_num_new_matched_tokens``, ``update_state_after_alloc``,
``build_connector_meta``, ``update_connector_output``, ``request_finished_all_groups``,
``get_stats``, ``take_events``), each with ``time.perf_counter_ns`` around it, so the GPU
side's and the driver's own time is left out. Runs alternate between the two schedulers;
the medians over ``--runs`` runs and their ratio are printed per configuration (eager and
lazy, two CPU capacities, a preemption every 13 steps, KV events on: the differential
test's shapes; ``--layout``: its models, ``dense`` one full-attention group, ``hybrid`` a
Mamba group in ``align`` mode beside it (``--hybrid`` says the same), ``window`` a
sliding-window group of a 49-token window beside it, ``chunked`` a chunked-local group of
64-token chunks beside it, the last two on the test's larger GPU pool). The step records of both are compared too: a run whose results differ is
reported as such, not timed as if it were the same work.
Importing vLLM's modules needs the test suite's import hook (tests/vllm_stubs.py).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

import simple_driver as driver  # noqa: E402
from vllm.v1.simple_kv_offload.manager import (  # noqa: E402
    SimpleCPUOffloadScheduler as VllmScheduler,
)

_METHODS = (
    "get_num_new_matched_tokens",
    "update_state_after_alloc",
    "build_connector_meta",
    "update_connector_output",
    "request_finished_all_groups",
    "get_stats",
    "take_events",
)

# The layouts' engine shapes (test_simple_differential.py's).
LAYOUTS = {
    "dense": {},
    "hybrid": {"hybrid": True},
    "window": {"sliding_window": 49, "gpu_blocks": 256},
    "chunked": {"attention_chunk": 64, "gpu_blocks": 256},
}


def timed(cls, clock: list[int]):
    """A constructor of ``cls`` whose scheduler calls add their time to ``clock[0]``."""

    def make(**kwargs):
        t = time.perf_counter_ns()
        sched = cls(**kwargs)
        clock[0] += time.perf_counter_ns() - t
        for name in _METHODS:
            method = getattr(sched, name)

            def wrapper(*a, _m=method, **k):
                t0 = time.perf_counter_ns()
                try:
                    return _m(*a, **k)
                finally:
                    clock[0] += time.perf_counter_ns() - t0

            setattr(sched, name, wrapper)
        return sched

    return make


def one(cls, reqs, shape):
    clock = [0]
    gc.collect()
    recs = list(driver.run(timed(cls, clock), reqs, shape))
    return clock[0] / 1e9, recs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", choices=("small-a", "mooncake"), default="small-a")
    ap.add_argument(
        "--traces", default=os.path.join(HERE, "..", "..", "..", "tests", "data")
    )
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument(
        "--layout", choices=tuple(LAYOUTS), default="dense", help="the model's KV-cache groups"
    )
    ap.add_argument("--hybrid", action="store_true", help="the same as --layout hybrid")
    args = ap.parse_args()
    if args.hybrid:
        if args.layout not in ("dense", "hybrid"):
            ap.error("--hybrid is --layout hybrid")
        args.layout = "hybrid"
    try:
        from kvtier.simple import SimpleCPUOffloadScheduler as KvtierScheduler
    except ImportError as e:
        raise SystemExit(f"kvtier.simple is not available: {e}")
    if args.trace == "small-a":
        reqs = driver.kvtrace_requests(
            os.path.join(args.traces, "small-a.kvtrace"), args.requests
        )
    else:
        reqs = driver.mooncake_requests(
            os.path.join(args.traces, "mooncake-synthetic.jsonl"), args.requests
        )
    print(
        f"{args.trace} ({args.layout}): {len(reqs)} requests, "
        f"{sum(map(len, reqs))} request-blocks, "
        f"{args.runs} runs each, scheduler-call time (median)"
    )
    print(f"{'mode':6} {'cpu':>5} {'steps':>6} {'vLLM s':>8} {'kvtier s':>9} {'ratio':>6}  same")
    for lazy in (False, True):
        for cpu in (48, 512):
            shape = driver.Shape(
                lazy=lazy,
                cpu_blocks=cpu,
                preempt_every=13,
                kv_events=True,
                **LAYOUTS[args.layout],
            )
            tv, tk = [], []
            same = True
            steps = 0
            for _ in range(args.runs):
                t, want = one(VllmScheduler, reqs, shape)
                tv.append(t)
                t, got = one(KvtierScheduler, reqs, shape)
                tk.append(t)
                steps = len(want)
                same = same and [vars(r) for r in want] == [vars(r) for r in got]
            mv, mk = statistics.median(tv), statistics.median(tk)
            print(
                f"{'lazy' if lazy else 'eager':6} {cpu:5} {steps:6} {mv:8.3f} {mk:9.3f} "
                f"{mv / mk:6.2f}  {'yes' if same else 'NO (results differ)'}"
            )


if __name__ == "__main__":
    main()
