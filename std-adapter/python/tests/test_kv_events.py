"""kvtier's KV-events stream against vLLM 0.33.0's own code: a pyzmq subscriber decoding with
vLLM's msgspec types reads `kvtier serve --kv-events-endpoint`, and vLLM's ZmqEventPublisher
sends batches that `kvtier events` decodes and re-encodes byte for byte.

vLLM's ``vllm.distributed.kv_events`` imports two modules this suite cannot load without
torch: ``vllm.config.kv_events`` (its package ``vllm.config`` is a stub here) and
``vllm.v1.core.kv_cache_utils`` (which pulls in the multimodal stack) for one type alias.
The first is vLLM's real file executed with a plain dataclass for its ``@config`` decorator;
the second a module holding the alias, after checking vLLM's file defines exactly that.

The ``kvtier`` binary is ``$KVTIER_BIN``, else built here with cargo (debug).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys
import threading
import time
import types
import urllib.request

import msgspec
import pytest
import zmq

ROOT = pathlib.Path(__file__).resolve().parents[3]
TRACE = ROOT / "tests" / "data" / "small-a.kvtrace"
END_SEQ = (-1).to_bytes(8, "big", signed=True)


def _vllm_kv_events():
    spec = importlib.util.find_spec("vllm.v1")
    root = pathlib.Path(spec.submodule_search_locations[0]).parent
    utils = (root / "v1" / "core" / "kv_cache_utils.py").read_text()
    assert "ExternalBlockHash: TypeAlias = bytes | int\n" in utils
    alias = types.ModuleType("vllm.v1.core.kv_cache_utils")
    alias.ExternalBlockHash = bytes | int
    sys.modules.setdefault(alias.__name__, alias)
    path = root / "config" / "kv_events.py"
    source = path.read_text()
    decorator = "from vllm.config.utils import config\n"
    assert decorator in source
    cfg = types.ModuleType("vllm.config.kv_events")
    cfg.config = dataclasses.dataclass
    sys.modules[cfg.__name__] = cfg
    exec(compile(source.replace(decorator, ""), str(path), "exec"), cfg.__dict__)
    import vllm.distributed.kv_events as kv_events

    return kv_events


ke = _vllm_kv_events()


def _kvtier_bin() -> str:
    if os.environ.get("KVTIER_BIN"):
        return os.environ["KVTIER_BIN"]
    subprocess.run(
        ["cargo", "build", "-q", "-p", "kvtier-cli", "--bin", "kvtier"], cwd=ROOT, check=True
    )
    target = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    return str(target / "debug" / "kvtier")


@pytest.fixture(scope="module")
def kvtier_bin() -> str:
    return _kvtier_bin()


def _expected(trace: str, policy: str, capacity: int) -> dict[str, str]:
    lines = (ROOT / "tests" / "data" / "expected.tsv").read_text().splitlines()
    head = lines[0].split("\t")
    for line in lines[1:]:
        row = dict(zip(head, line.split("\t")))
        if (row["trace"], row["policy"], row["capacity"], row["store_threshold"]) == (
            trace,
            policy,
            str(capacity),
            "1",
        ):
            return row
    raise LookupError(trace)


def _header(path: pathlib.Path) -> dict[str, str]:
    out = {}
    with path.open("rb") as f:
        for raw in f:
            if not raw.startswith(b"#"):
                break
            k, _, v = raw[1:].decode().strip().partition("=")
            out[k] = v
    return out


def _replay(ctx: zmq.Context, endpoint: str, start: int) -> list[list[bytes]]:
    """Asks the ROUTER socket for every batch from `start`; the frames up to the end marker."""
    d = ctx.socket(zmq.DEALER)
    d.RCVTIMEO = 10_000
    d.connect(endpoint)
    d.send_multipart([b"", start.to_bytes(8, "big")])
    got = []
    while True:
        frames = d.recv_multipart()
        if frames[2] == END_SEQ:
            assert frames == [b"", b"", END_SEQ, b""]
            break
        assert frames[0] == b""
        got.append(frames[1:])
    d.close(linger=0)
    return got


def _scrape(addr: str) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://{addr}/metrics", timeout=10).read().decode()
    return {
        m.group(1): float(m.group(2))
        for m in re.finditer(r"^(kvtier_kv_events_\w+) (\S+)$", text, re.M)
    }


def test_serve_stream_decodes_with_vllm_and_replays_to_a_late_joiner(kvtier_bin):
    """Every CPU-tier event of small-a (LRU, 1,024 chunks) reaches a subscriber using vLLM's
    decoder, gapless; a late joiner replays from 0 through the ROUTER socket and gets the same
    batches; stored minus removed hashes is the resident set, and the totals are the replay's."""
    expected = _expected("small-a.kvtrace", "lru", 1024)
    block_tokens = int(_header(TRACE)["block_tokens"])
    decoder = msgspec.msgpack.Decoder(type=ke.KVEventBatch)
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv")
    # tcp://127.0.0.1:PORT is a connect endpoint under vLLM's rule: the subscriber binds it.
    sub.bind("tcp://127.0.0.1:0")
    endpoint = sub.getsockopt_string(zmq.LAST_ENDPOINT)
    serve = subprocess.Popen(
        [kvtier_bin, "serve", "--trace", str(TRACE), "--policy", "lru", "--capacity", "1024",
         "--listen", "127.0.0.1:0", "--rate", "1000",
         "--kv-events-endpoint", endpoint, "--kv-events-replay-endpoint", "tcp://127.0.0.1:0",
         "--kv-events-topic", "kv"],
        stderr=subprocess.PIPE, text=True,
    )
    try:
        metrics_line = serve.stderr.readline()
        events_line = serve.stderr.readline()
        addr = re.search(r"http://(\S+)/metrics", metrics_line).group(1)
        m = re.search(r"kv events on (\S+) \(replay (tcp://\S+)\)", events_line)
        assert m and m.group(1) == endpoint, events_line
        replay_endpoint = m.group(2)
        # The subscriber keeps reading while the replay runs: libzmq sends a SUB socket's
        # subscription to a new peer only from inside a call on that socket.
        done: list[str] = []
        reader = threading.Thread(target=lambda: done.append(serve.stderr.readline()))
        reader.start()
        sub.RCVTIMEO = 200
        live = []
        quiet_since = None
        while quiet_since is None or time.monotonic() - quiet_since < 1.5:
            try:
                live.append(sub.recv_multipart())
                quiet_since = None
            except zmq.Again:
                if done and quiet_since is None:
                    quiet_since = time.monotonic()
        reader.join()
        counts = re.search(r"(\d+) stored, (\d+) evicted", done[0])
        assert counts, done
        assert (counts.group(1), counts.group(2)) == (
            expected["stored_blocks"], expected["evicted_blocks"]
        )
        # As with vLLM, batches sent before the subscription reached the publisher are not
        # delivered (the replay socket is there for them); the rest arrive without a gap.
        assert live, "no message reached the subscriber"
        seqs = [int.from_bytes(f[1], "big") for f in live]
        assert all(len(f) == 3 and f[0] == b"kv" and len(f[1]) == 8 for f in live)
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "a gap in the sequence"

        # Joining late: the replay from 0 holds every batch (10,000 steps are buffered).
        replayed = _replay(ctx, replay_endpoint, 0)
        assert [int.from_bytes(f[1], "big") for f in replayed] == list(range(seqs[-1] + 1))
        assert len(replayed) >= 8, "a paced replay of 1 s publishes a batch every 100 ms or less"
        by_seq = {int.from_bytes(f[1], "big"): f for f in replayed}
        for f, s in zip(live, seqs):
            assert by_seq[s] == f, f"replayed batch {s} differs from the live one"
        assert _replay(ctx, replay_endpoint, seqs[-1]) == [replayed[-1]]
        assert _replay(ctx, replay_endpoint, seqs[-1] + 1) == []

        resident: set[int] = set()
        stored = removed = 0
        for topic, _, payload in replayed:
            batch = decoder.decode(payload)
            assert batch.data_parallel_rank == 0 and batch.ts > 1.6e9
            for e in batch.events:
                if isinstance(e, ke.BlockStored):
                    assert (e.medium, e.block_size, e.parent_block_hash, e.token_ids) == (
                        ke.MEDIUM_CPU, block_tokens, None, [],
                    )
                    assert e.group_idx == 0 and len(e.block_hashes) == 1
                    h = e.block_hashes[0]
                    assert isinstance(h, int) and h not in resident, "stored while resident"
                    resident.add(h)
                    stored += 1
                else:
                    assert isinstance(e, ke.BlockRemoved), e
                    assert (e.medium, e.group_idx) == (ke.MEDIUM_CPU, 0)
                    for h in e.block_hashes:
                        assert h in resident, "removed while not resident"
                        resident.remove(h)
                        removed += 1
        assert (stored, removed) == (
            int(expected["stored_blocks"]), int(expected["evicted_blocks"])
        )
        assert len(resident) == int(expected["resident_blocks"])

        total_events = sum(len(decoder.decode(f[2]).events) for f in replayed)
        assert _scrape(addr) == {
            "kvtier_kv_events_published_batches_total": float(len(replayed)),
            "kvtier_kv_events_published_events_total": float(total_events),
            "kvtier_kv_events_dropped_total": 0.0,
            "kvtier_kv_events_replay_requests_total": 3.0,
        }
    finally:
        serve.terminate()
        serve.wait(timeout=10)
        ctx.destroy(linger=0)


def test_simple_offloader_stream_decodes_with_vllm(kvtier_bin):
    """`serve --offloader simple` publishes the simple offloader's events (small-a, 300 GPU
    blocks, 64 CPU blocks): every buffered batch decodes with vLLM's decoder and has the shape
    of vLLM's SimpleCPUOffloadScheduler events; a hash is stored only when absent and removed
    only when present, and what stays is the CPU prefix cache the replay ends with."""
    decoder = msgspec.msgpack.Decoder(type=ke.KVEventBatch)
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.bind("tcp://127.0.0.1:0")
    endpoint = sub.getsockopt_string(zmq.LAST_ENDPOINT)
    serve = subprocess.Popen(
        [kvtier_bin, "serve", "--trace", str(TRACE), "--offloader", "simple",
         "--gpu-blocks", "300", "--capacity", "64", "--listen", "127.0.0.1:0",
         "--kv-events-endpoint", endpoint, "--kv-events-replay-endpoint", "tcp://127.0.0.1:0"],
        stderr=subprocess.PIPE, text=True,
    )
    try:
        serve.stderr.readline()
        events_line = serve.stderr.readline()
        m = re.search(r"kv events on (\S+) \(replay (tcp://\S+)\)", events_line)
        assert m and m.group(1) == endpoint, events_line
        done = serve.stderr.readline()
        cached = re.search(r"(\d+) CPU blocks cached of (\d+)", done)
        assert cached, done
        # The replay is over; the publisher thread may still be sending its last batches.
        deadline = time.monotonic() + 10
        replayed = _replay(ctx, m.group(2), 0)
        while time.monotonic() < deadline:
            time.sleep(0.3)
            again = _replay(ctx, m.group(2), 0)
            if len(again) == len(replayed):
                break
            replayed = again
        seqs = [int.from_bytes(f[1], "big") for f in replayed]
        assert seqs == list(range(len(seqs))) and len(seqs) > 100, seqs[:5]

        resident: set[int] = set()
        stored = removed = with_parent = 0
        for _, _, payload in replayed:
            for e in decoder.decode(payload).events:
                if isinstance(e, ke.BlockStored):
                    assert (e.medium, e.block_size, e.token_ids, e.group_idx) == (
                        ke.MEDIUM_CPU, 16, [], 0,
                    )
                    assert (e.kv_cache_spec_kind, e.locality) == ("full_attention", "LOCAL")
                    assert e.kv_cache_spec_sliding_window is None
                    assert len(e.block_hashes) == 1
                    h = e.block_hashes[0]
                    assert h not in resident, "stored while resident"
                    resident.add(h)
                    stored += 1
                    with_parent += e.parent_block_hash is not None
                else:
                    assert isinstance(e, ke.BlockRemoved), e
                    assert (e.medium, e.group_idx, e.locality) == (ke.MEDIUM_CPU, 0, "LOCAL")
                    (h,) = e.block_hashes
                    assert h in resident, "removed while not resident"
                    resident.remove(h)
                    removed += 1
        assert stored > 100 and removed > 10 and with_parent > 0
        assert len(resident) == int(cached.group(1))
    finally:
        serve.terminate()
        serve.wait(timeout=10)
        ctx.destroy(linger=0)


def _hexed(v):
    """msgspec's builtins of a batch with bytes as hex (how `kvtier events` shows bytes)."""
    if isinstance(v, bytes):
        return v.hex()
    if isinstance(v, (list, tuple)):
        return [_hexed(x) for x in v]
    if isinstance(v, dict):
        return {k: _hexed(x) for k, x in v.items()}
    return v


def _vllm_batches():
    sha = bytes(range(32))
    return [
        ke.KVEventBatch(ts=1.5, events=[
            ke.BlockStored(block_hashes=[5, 2**64 - 1], parent_block_hash=7, token_ids=[1, 2, 3],
                           block_size=16, lora_id=None, medium=ke.MEDIUM_CPU, lora_name=None,
                           group_idx=0),
            ke.BlockRemoved(block_hashes=[5], medium=ke.MEDIUM_CPU, group_idx=0),
            ke.AllBlocksCleared(),
        ]),
        ke.KVEventBatch(ts=1_700_000_000.25, events=[
            ke.BlockStored(block_hashes=[sha, b"\x00"], parent_block_hash=sha, token_ids=[2**40],
                           block_size=65_536, lora_id=-1, medium=ke.MEDIUM_STORAGE,
                           lora_name="adapter", extra_keys=[("adapter", "img", 0), None],
                           group_idx=70_000, kv_cache_spec_kind="full_attention",
                           kv_cache_spec_sliding_window=128, locality="LOCAL", ownership="tier2",
                           session_id="s1", lookahead_token_ids=[[1, 2], [3]]),
            ke.BlockRemoved(block_hashes=[sha], medium=None, group_idx=1, locality="REMOTE",
                            ownership="tier2"),
        ], data_parallel_rank=3),
        ke.KVEventBatch(ts=2.0, events=[
            ke.BlockStored(block_hashes=[], parent_block_hash=None, token_ids=[], block_size=0,
                           lora_id=300, medium=None, lora_name=None),
        ]),
    ]


def test_vllm_publisher_batches_decode_in_kvtier_byte_for_byte(kvtier_bin, tmp_path):
    """vLLM's own ZmqEventPublisher sends batches that `kvtier events` reads back: the same
    values as msgspec's builtins of the batch, and kvtier's encoder gives back the very bytes
    (the batch array, map16 for BlockStored, the omitted defaults, every integer width)."""
    batches = _vllm_batches()
    events = subprocess.Popen(
        [kvtier_bin, "events", "--bind", "--endpoint", "tcp://127.0.0.1:0", "--topic", "kv",
         "--count", str(len(batches))],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        bound = re.search(r"bound (tcp://\S+)", events.stderr.readline()).group(1)
        # A tcp://HOST:PORT endpoint makes vLLM's PUB socket connect to the subscriber.
        publisher = ke.ZmqEventPublisher(data_parallel_rank=0, endpoint=bound, topic="kv")
        time.sleep(1.0)  # the connection and the subscription, before the first message
        for b in batches:
            publisher.publish(b)
        out, _ = events.communicate(timeout=30)
        publisher.shutdown()
    finally:
        if events.poll() is None:
            events.kill()
    lines = [json.loads(line) for line in out.splitlines()]
    assert [line["seq"] for line in lines] == [0, 1, 2]
    assert all(line["topic"] == "kv" and line["reencodes"] for line in lines)
    for line, b in zip(lines, batches):
        # publish() filled the rank of the batches that had none.
        assert b.data_parallel_rank in (0, 3)
        assert line["batch"] == _hexed(msgspec.to_builtins(b, builtin_types=(bytes,)))
