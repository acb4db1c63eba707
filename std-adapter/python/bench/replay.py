"""kvtrace replays from Python through vLLM 0.33.0's CPUOffloadingManager and kvtier's, side by
side, plus kvtier's pure-Rust replayer on the same traces.

    python bench/replay.py --trace tests/data/small-b.kvtrace --generate 1000000

For each trace and policy it runs vLLM's manager and kvtier's from Python, each in its own
process (so each peak RSS is its own), and the same trace through kvtier's pure-Rust replayer
(``kvtier replay --trace FILE --json``, release build), checks that the hit digests (and every
count) agree, and prints for each of the three µs per request, request-blocks per second, the
speed-up over vLLM's loop and the peak RSS, side by side. ``--runs N`` repeats each run N
times (interleaved) and prints medians. The Python times are the process's CPU time over the
timed loop (wall time is printed too): on a shared machine CPU time is what stays comparable
between two runs. The Rust time is the replayer's own replay loop (``replay_s``, wall time of
a single-threaded loop, trace parsing excluded as for the Python loops) is printed beside
its row; the row itself is the whole process's CPU time, reading the trace included (an
overestimate of the loop's, but one the machine's load does not inflate).

The protocol is kvtrace v1's (docs/formats/kvtrace.md): per request a ReqContext with end-token
positions (i + 1) · block_tokens, on_new_request, lookups while HIT, prepare_load of the hit
prefix; then complete_load and prepare_store of the rest; then complete_store of the keys to
store and on_request_finished. The trace is parsed, and each request's ReqContext built with
its positions, before the clock starts: the timed loop holds the manager calls and the
protocol's own bookkeeping.
Importing vLLM's modules needs the test suite's import hook (tests/vllm_stubs.py), which this
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
    import vllm_stubs  # the import hook for vLLM's modules

    vllm_stubs.install()
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
    """``kvtier replay --json`` on the trace, plus the process's own CPU time and peak RSS."""
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
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    out = proc.stdout.read()
    proc.stdout.close()
    # wait4 reports this child's own usage (RUSAGE_CHILDREN would fold in the Python workers'
    # peak RSS).
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, cmd)
    result = json.loads(out)
    # The whole process's CPU time (reading the trace included).
    result["cpu_seconds"] = usage.ru_utime + usage.ru_stime
    result["peak_rss_kb"] = usage.ru_maxrss
    return result


def median_run(runs: list[dict], keys: tuple[str, ...]) -> dict:
    """The first run with the median of each of `keys` over `runs` (counts are equal)."""
    out = dict(runs[0])
    for k in keys:
        vals = sorted(r[k] for r in runs if k in r)
        if vals:
            out[k] = vals[len(vals) // 2]
    return out


TIMES = ("seconds", "cpu_seconds", "peak_rss_kb", "base_rss_kb", "replay_s", "wall_s")


def report(trace: str, policy: str, v: dict, k: dict, rust: dict, same: bool, runs: int):
    n, blocks = v["requests"], v["request_blocks"]
    rust_s = rust.get("replay_s", rust["wall_s"])
    name = os.path.basename(trace)
    print(f"{name} {policy} capacity {v['capacity']}: {n} requests, {blocks} request-blocks, "
          f"digest {v['digest']} ({'identical' if same else 'DIFFERENT'}: vLLM {v['digest']}, "
          f"kvtier {k['digest']}, Rust {rust['digest']})"
          + (f"; medians of {runs} runs" if runs > 1 else ""))
    rows = [
        ("vLLM 0.33.0 (Python)", v["cpu_seconds"], f"wall {v['seconds'] * 1e6 / n:.2f}", v),
        ("kvtier from Python", k["cpu_seconds"], f"wall {k['seconds'] * 1e6 / n:.2f}", k),
        ("kvtier replay (Rust)", rust["cpu_seconds"],
         f"replay loop alone {rust_s * 1e6 / n:.2f} µs/request wall", rust),
    ]
    print(f"  {'':<22}{'µs/request':>11}{'M blocks/s':>12}{'vs vLLM':>9}{'peak RSS':>12}")
    for label, secs, note, r in rows:
        over = ""
        if "base_rss_kb" in r:
            grew = (r["peak_rss_kb"] - r["base_rss_kb"]) / 1024
            over = f" ({grew:+.1f} over the parsed trace)"
        print(f"  {label:<22}{secs * 1e6 / n:11.2f}{blocks / secs / 1e6:12.3f}"
              f"{v['cpu_seconds'] / secs:8.1f}x{r['peak_rss_kb'] / 1024:8.1f} MiB{over}; {note}")
    if not same:
        print("  MISMATCH:", {c: (v[c], k[c]) for c in COUNTS if v[c] != k[c]})


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
        help="the reference harness's kvtrace generator, gen_trace.py (not in this repository)",
    )
    p.add_argument("--policy", default="lru,arc")
    p.add_argument("--capacity", type=int, default=0, help="default: the trace's")
    p.add_argument("--store-threshold", type=int, default=1)
    p.add_argument(
        "--runs", type=int, default=1, help="runs of each (medians are printed)"
    )
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
                vs, ks, rs = [], [], []
                for _ in range(max(args.runs, 1)):
                    vs.append(run_worker("vllm", trace, policy, args))
                    ks.append(run_worker("kvtier", trace, policy, args))
                    rs.append(run_rust(trace, policy, vs[-1]["capacity"], args))
                same = all(
                    v[c] == k[c] for v, k in zip(vs, ks) for c in COUNTS
                ) and all(r["digest"] == vs[0]["digest"] for r in rs)
                same &= all(v["digest"] == vs[0]["digest"] for v in vs)
                ok &= same
                v, k, rust = (median_run(x, TIMES) for x in (vs, ks, rs))
                report(trace, policy, v, k, rust, same, len(vs))
    finally:
        if tmp is not None:
            os.unlink(tmp.name)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
