"""kvtrace replays from Python through vLLM 0.33.0's CPUOffloadingManager and kvtier's, side by
side, plus kvtier's pure-Rust replayer on the same traces.

    python bench/replay.py --trace tests/data/small-b.kvtrace --generate 1000000

For each trace and policy it runs each manager in its own process (so each peak RSS is its
own), checks that the hit digests (and every count) agree, and prints µs per request,
request-blocks per second, the kvtier/vLLM ratio and the peak RSS of both, then the same
trace through ``kvtier replay --trace FILE --json``. Times are the process's CPU time over the
timed loop (wall time is printed too): on a shared machine CPU time is what stays comparable
between two runs.

The protocol is kvtrace v1's (spec/kvtrace.md): per request a ReqContext with end-token
positions (i + 1) · block_tokens, on_new_request, lookups while HIT, prepare_load of the hit
prefix; then complete_load and prepare_store of the rest; then complete_store of the keys to
store and on_request_finished. The trace is parsed, and each request's ReqContext built with
its positions, before the clock starts: the timed loop holds the manager calls and the
protocol's own bookkeeping.
Importing vLLM's modules needs the test suite's import hook (tests/conftest.py), which this
script installs.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
MASK = (1 << 64) - 1


def parse(path: str):
    """The trace's records as (op, rid, keys) tuples and its header."""
    header: dict[str, str] = {}
    keys_of: dict[str, bytes] = {}
    group0 = (0).to_bytes(4, "big")
    records = []
    with open(path) as f:
        for line in f:
            if line.startswith("#"):
                for kv in line[1:].split():
                    if "=" in kv:
                        k, v = kv.split("=", 1)
                        header[k] = v
                continue
            parts = line.split()
            if not parts:
                continue
            if parts[0] == "L":
                keys = []
                for h in parts[3:]:
                    k = keys_of.get(h)
                    if k is None:
                        k = keys_of[h] = bytes.fromhex(h) + group0
                    keys.append(k)
                records.append(("L", parts[1], keys))
            else:
                records.append((parts[0], parts[1], None))
    return header, records


def rss_kb() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def worker(args) -> None:
    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    import conftest  # noqa: F401  (the import hook for vLLM's modules)
    from vllm.v1.kv_offload.base import LookupResult, ReqContext
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

    from kvtier.vllm import KvtierOffloadingManager

    header, records = parse(args.trace[0])
    block_tokens = int(header.get("block_tokens", 16))
    capacity = args.capacity or int(header["capacity"])
    cls = KvtierOffloadingManager if args.worker == "kvtier" else CPUOffloadingManager
    m = cls(
        num_chunks=capacity,
        cache_policy=args.policy,
        store_threshold=args.store_threshold,
    )
    longest = max((len(r[2]) for r in records if r[0] == "L"), default=0)
    positions = [(i + 1) * block_tokens for i in range(longest)]
    # Each request's context with its end-token positions, as the scheduler builds it before
    # calling the manager (ReqContext.set_offload_key_position for every key).
    contexts = {}
    for op, rid, keys in records:
        if op == "L":
            ctx = contexts[rid] = ReqContext(req_id=rid)
            for key, pos in zip(keys, positions):
                ctx.set_offload_key_position(key, pos)
    # The parsed trace is hundreds of thousands of objects: keep the cyclic collector from
    # walking them during the timed loop (it would charge both managers for the trace).
    gc.collect()
    gc.freeze()
    base_rss = rss_kb()

    HIT, HIT_PENDING = LookupResult.HIT, LookupResult.HIT_PENDING
    lookup, prepare_load, complete_load = m.lookup, m.prepare_load, m.complete_load
    prepare_store, complete_store = m.prepare_store, m.complete_store
    on_new_request, on_request_finished = m.on_new_request, m.on_request_finished
    live: dict[str, list] = {}
    digest = requests = request_blocks = hit_blocks = hit_requests = 0
    stored = evicted = failures = pending = 0

    t0, c0 = time.perf_counter(), time.process_time()
    for op, rid, keys in records if not args.setup_only else ():
        if op == "L":
            ctx = contexts.pop(rid)
            on_new_request(ctx)
            k = 0
            for key in keys:
                r = lookup(key, ctx)
                if r is not HIT:
                    if r is HIT_PENDING:
                        pending += 1
                    break
                k += 1
            if k:
                prepare_load(keys[:k], ctx)
                hit_blocks += k
                hit_requests += 1
            digest = (digest * 1000003 + k) & MASK
            requests += 1
            request_blocks += len(keys)
            live[rid] = [ctx, keys, k, None]
        elif op == "S":
            st = live[rid]
            ctx, keys, k = st[0], st[1], st[2]
            if k:
                complete_load(keys[:k], ctx)
            if k < len(keys):
                out = prepare_store(keys[k:], ctx)
                if out is None:
                    failures += 1
                else:
                    stored += len(out.keys_to_store)
                    evicted += len(out.evicted_keys)
                    st[3] = out.keys_to_store
        else:
            ctx, _, _, to_store = live.pop(rid)
            if to_store:
                complete_store(to_store, ctx)
            on_request_finished(ctx)
    seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0

    if args.worker == "kvtier":
        resident = m._native.resident_chunks()
    else:
        resident = m._num_allocated_chunks - len(m._free_list)
    print(
        json.dumps(
            {
                "manager": args.worker,
                "policy": args.policy,
                "capacity": capacity,
                "requests": requests,
                "request_blocks": request_blocks,
                "hit_blocks": hit_blocks,
                "hit_requests": hit_requests,
                "stored_blocks": stored,
                "evicted_blocks": evicted,
                "store_failures": failures,
                "stopped_at_pending": pending,
                "resident_blocks": resident,
                "digest": f"{digest:016x}",
                "seconds": seconds,
                "cpu_seconds": cpu_seconds,
                "base_rss_kb": base_rss,
                "peak_rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
            }
        )
    )


COUNTS = (
    "requests",
    "request_blocks",
    "hit_blocks",
    "hit_requests",
    "stored_blocks",
    "evicted_blocks",
    "store_failures",
    "stopped_at_pending",
    "resident_blocks",
    "digest",
)


def run_worker(which: str, trace: str, policy: str, args) -> dict:
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--worker",
        which,
        "--trace",
        trace,
        "--policy",
        policy,
        "--store-threshold",
        str(args.store_threshold),
    ]
    if args.capacity:
        cmd += ["--capacity", str(args.capacity)]
    # numpy's BLAS threads would spin on the few cores a benchmark box has.
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def run_rust(trace: str, policy: str, capacity: int, args) -> dict:
    cmd = [
        args.kvtier_bin,
        "replay",
        "--trace",
        trace,
        "--policy",
        policy,
        "--capacity",
        str(capacity),
        "--store-threshold",
        str(args.store_threshold),
        "--json",
    ]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = json.loads(out)
    # The whole process's CPU time (reading the trace included), for the CPU-time ratio.
    result["cpu_seconds"] = (after.ru_utime - before.ru_utime) + (
        after.ru_stime - before.ru_stime
    )
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", action="append", default=[], help="a kvtrace file")
    p.add_argument(
        "--generate",
        type=int,
        metavar="RECORDS",
        help="also replay a trace of this many records made by gen_trace.py",
    )
    p.add_argument(
        "--gen-trace",
        default=os.path.join(ROOT, "..", "shared", "tools", "gen_trace.py"),
        help="the trace generator (spec/kvtrace.md's gen_trace.py)",
    )
    p.add_argument("--policy", default="lru,arc")
    p.add_argument("--capacity", type=int, default=0, help="default: the trace's")
    p.add_argument("--store-threshold", type=int, default=1)
    p.add_argument(
        "--kvtier-bin", default=os.path.join(ROOT, "target", "release", "kvtier")
    )
    p.add_argument("--worker", choices=["vllm", "kvtier"], help=argparse.SUPPRESS)
    # With --worker: parse and build the contexts, replay nothing (a baseline for
    # instruction counts under valgrind --tool=callgrind).
    p.add_argument("--setup-only", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return 0

    traces = list(args.trace)
    tmp = None
    if args.generate:
        tmp = tempfile.NamedTemporaryFile(suffix=".kvtrace", delete=False)
        tmp.close()
        subprocess.run(
            [sys.executable, args.gen_trace, "--ops", str(args.generate), "-o", tmp.name],
            check=True,
        )
        traces.append(tmp.name)
    ok = True
    try:
        for trace in traces:
            for policy in args.policy.split(","):
                v = run_worker("vllm", trace, policy, args)
                k = run_worker("kvtier", trace, policy, args)
                rust = run_rust(trace, policy, v["capacity"], args)
                rust_s = rust.get("replay_s", rust["wall_s"])
                same = all(v[c] == k[c] for c in COUNTS) and rust["digest"] == v["digest"]
                ok &= same
                n, blocks = v["requests"], v["request_blocks"]
                name = os.path.basename(trace)
                print(f"{name} {policy} capacity {v['capacity']}: {n} requests, "
                      f"{blocks} request-blocks, digest {v['digest']} "
                      f"({'identical' if same else 'DIFFERENT'}: vLLM {v['digest']}, "
                      f"kvtier {k['digest']}, Rust {rust['digest']})")
                for r in (v, k):
                    print(f"  {r['manager']:>6}: {r['cpu_seconds'] * 1e6 / n:8.2f} µs/request "
                          f"CPU ({r['seconds'] * 1e6 / n:.2f} wall), "
                          f"{blocks / r['cpu_seconds'] / 1e6:7.3f} M request-blocks/s, "
                          f"peak RSS {r['peak_rss_kb'] / 1024:7.1f} MiB "
                          f"(+{(r['peak_rss_kb'] - r['base_rss_kb']) / 1024:.1f} MiB "
                          f"over the parsed trace)")
                print(f"  kvtier/vLLM: {v['cpu_seconds'] / k['cpu_seconds']:.1f}x per request "
                      f"(CPU time; wall {v['seconds'] / k['seconds']:.1f}x)")
                label = "replay_s" if "replay_s" in rust else "wall_s"
                print(f"  Rust replay: {label} {rust_s:.3f} s = {rust_s * 1e6 / n:.2f} µs/request, "
                      f"{blocks / rust_s / 1e6:.3f} M request-blocks/s; process CPU "
                      f"{rust['cpu_seconds']:.3f} s (trace reading included); "
                      f"vLLM/Rust {v['cpu_seconds'] / rust['cpu_seconds']:.1f}x, "
                      f"kvtier-from-Python/Rust {k['cpu_seconds'] / rust['cpu_seconds']:.1f}x "
                      f"(CPU time)")
                if not same:
                    print("  MISMATCH:", {c: (v[c], k[c]) for c in COUNTS if v[c] != k[c]})
    finally:
        if tmp is not None:
            os.unlink(tmp.name)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
