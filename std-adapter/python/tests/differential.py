"""Random operation sequences applied to vLLM's CPUOffloadingManager and to kvtier's, side by
side, comparing every answer.

A sequence is a function of its seed: the pool size, key shapes, requests, and every call.
Calls follow the scheduler's protocol, plus the misuse vLLM's manager tolerates (completing a
store twice or for unknown keys, failing a store of ready keys, touching absent keys,
finishing a request twice or never, using a request without ``on_new_request``, reusing a
finished request after a reset, completing transfers from before a reset). A call on which
vLLM's manager asserts ends the sequence once both raised the same exception type, because
vLLM has then half-applied the call.

Not generated, because kvtier deliberately differs there (docs/vllm.md, "Known differences",
each checked in ``test_plugin.py``): a store offer naming a key twice, a call where only
some keys have an end-token position, a store or load for a request after its
``on_request_finished`` in the same cache generation.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np
from vllm.v1.kv_offload.base import ReqContext, make_offload_key
from vllm.v1.kv_offload.cpu.common import CPUOffloadingInfo
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

from kvtier.vllm import KvtierOffloadingManager


@dataclass
class Config:
    policy: str
    store_threshold: int
    enable_events: bool = True
    max_tracker_size: int = 64_000


@dataclass
class Request:
    ctx: ReqContext
    keys: list[bytes]
    pins: list[bytes] = field(default_factory=list)
    finished_gen: int | None = None


class Mismatch(AssertionError):
    pass


def _outcome(fn, *args):
    try:
        return "ok", fn(*args)
    except (AssertionError, ValueError) as e:
        return "raised", type(e)


def _same_spec(a, b) -> bool:
    return (
        type(a) is type(b)
        and a.block_ids.dtype == b.block_ids.dtype
        and np.array_equal(a.block_ids, b.block_ids)
    )


def _same(name: str, a, b) -> bool:
    if name in ("prepare_load",):
        return _same_spec(a, b)
    if name == "prepare_store":
        if a is None or b is None:
            return a is None and b is None
        return (
            a.keys_to_store == b.keys_to_store
            and a.evicted_keys == b.evicted_keys
            and _same_spec(a.store_spec, b.store_spec)
        )
    return a == b


class Pair:
    """vLLM's manager and kvtier's, called alike."""

    def __init__(self, cfg: Config, num_chunks: int, info):
        kwargs = dict(
            num_chunks=num_chunks,
            cache_policy=cfg.policy,
            enable_events=cfg.enable_events,
            store_threshold=cfg.store_threshold,
            max_tracker_size=cfg.max_tracker_size,
            info=info,
        )
        self.vllm = CPUOffloadingManager(**kwargs)
        self.kvtier = KvtierOffloadingManager(**kwargs)
        self.calls = 0
        self.log: list[str] = []

    def call(self, name: str, *args):
        """Calls both; returns vLLM's answer, or raises StopIteration when both asserted."""
        self.calls += 1
        self.log.append(name)
        a = _outcome(getattr(self.vllm, name), *args)
        b = _outcome(getattr(self.kvtier, name), *args)
        if a[0] != b[0] or (a[0] == "raised" and a[1] is not b[1]):
            raise Mismatch(f"{name}{args!r}: vLLM {a!r}, kvtier {b!r}")
        if a[0] == "raised":
            raise StopIteration
        if not _same(name, a[1], b[1]):
            raise Mismatch(f"{name}{args!r}: vLLM {a[1]!r}, kvtier {b[1]!r}")
        return a[1]

    def compare_drains(self) -> None:
        self.calls += 1
        ev_a, ev_b = list(self.vllm.take_events()), list(self.kvtier.take_events())
        if ev_a != ev_b:
            raise Mismatch(f"take_events: vLLM {ev_a!r}, kvtier {ev_b!r}")
        st_a, st_b = self.vllm.get_stats().reduce(), self.kvtier.get_stats().reduce()
        if st_a != st_b:
            raise Mismatch(f"get_stats().reduce(): vLLM {st_a!r}, kvtier {st_b!r}")
        if self.vllm.config_info() != self.kvtier.config_info():
            raise Mismatch("config_info differs")


def run_sequence(seed: int, cfg: Config) -> Pair:
    """Runs one sequence; raises Mismatch on the first difference."""
    rng = random.Random(seed)
    num_chunks = rng.choice([0, 1, 2, 3, 4, 5, 8, 12])
    info = (
        CPUOffloadingInfo(
            cpu_num_chunks=num_chunks,
            cpu_blocks_per_chunk=1,
            cpu_kv_cache_size_bytes=num_chunks * 4096,
            cpu_kv_cache_size_tokens=None,
        )
        if rng.random() < 0.5
        else None
    )
    pair = Pair(cfg, num_chunks, info)
    hash_len = rng.choice([8, 16, 32])
    hashes = [rng.randbytes(hash_len) for _ in range(rng.randint(4, 16))]
    groups = rng.choice([1, 1, 2])
    pool = [make_offload_key(h, g) for h in hashes for g in range(groups)]
    requests: list[Request] = []
    generation = 0
    stores: list[list[bytes]] = []
    serial = 0

    def usable() -> list[Request]:
        return [r for r in requests if r.finished_gen != generation]

    try:
        for _ in range(rng.randint(20, 120)):
            op = rng.choices(
                [
                    "new",
                    "lookup",
                    "load",
                    "complete_load",
                    "store",
                    "complete_store",
                    "touch",
                    "finish",
                    "drop",
                    "reset",
                    "drain",
                ],
                weights=[10, 4, 8, 6, 16, 14, 4, 8, 2, 1, 4],
            )[0]
            if op == "new" or not requests:
                serial += 1
                ctx = ReqContext(req_id=f"r{serial}")
                n = rng.randint(1, 6)
                chain = rng.sample(hashes, min(n, len(hashes)))
                keys = []
                with_positions = rng.random() < 0.8
                for i, h in enumerate(chain):
                    for g in range(groups):
                        k = make_offload_key(h, g)
                        keys.append(k)
                        if with_positions:
                            ctx.set_offload_key_position(k, (i + 1) * 16)
                requests.append(Request(ctx, keys))
                if rng.random() < 0.8:
                    pair.call("on_new_request", ctx)
            elif op == "lookup":
                req = rng.choice(requests)
                pair.call("lookup", rng.choice(pool), req.ctx)
            elif op == "load":
                live = usable()
                if not live:
                    continue
                req = rng.choice(live)
                hits = [
                    k
                    for k in req.keys
                    if pair.call("lookup", k, req.ctx).name == "HIT"
                ]
                keys = rng.sample(hits, rng.randint(0, len(hits)))
                misses = [k for k in req.keys if k not in hits]
                if misses and rng.random() < 0.03:
                    keys.append(rng.choice(misses))  # absent or pending: vLLM asserts
                pair.call("prepare_load", keys, req.ctx)
                req.pins.extend(keys)
            elif op == "complete_load":
                pinned = [r for r in requests if r.pins]
                misuse = rng.random() < 0.01
                if not pinned and not misuse:
                    continue
                if pinned and not misuse:
                    req = rng.choice(pinned)
                    keys = rng.sample(req.pins, rng.randint(1, len(req.pins)))
                    for k in keys:
                        req.pins.remove(k)
                else:
                    req = rng.choice(requests)
                    keys = [rng.choice(pool)]  # misuse: vLLM asserts unless pinned
                pair.call("complete_load", keys, req.ctx)
            elif op == "store":
                live = usable()
                if not live:
                    continue
                req = rng.choice(live)
                keys = rng.sample(req.keys, rng.randint(0, len(req.keys)))
                if rng.random() < 0.5:
                    keys = [k for k in req.keys if k in keys]  # head to tail
                out = pair.call("prepare_store", keys, req.ctx)
                if out is not None and out.keys_to_store:
                    stores.append(out.keys_to_store)
            elif op == "complete_store":
                req = rng.choice(requests)
                if stores and rng.random() < 0.95:
                    keys = stores.pop(rng.randrange(len(stores)))
                    if rng.random() < 0.1:
                        stores.append(keys)  # completed twice later
                else:
                    keys = rng.sample(pool, rng.randint(1, min(3, len(pool))))
                pair.call("complete_store", keys, req.ctx, rng.random() < 0.9)
            elif op == "touch":
                req = rng.choice(requests)
                keys = rng.sample(pool, rng.randint(0, min(4, len(pool))))
                pair.call("touch", keys, req.ctx)
            elif op == "finish":
                req = rng.choice(requests)
                pair.call("on_request_finished", req.ctx)
                req.finished_gen = generation
                req.pins.clear()  # their loads are never completed: stays pinned
            elif op == "drop":
                requests.remove(rng.choice(requests))
            elif op == "reset":
                pair.call("reset_cache")
                generation += 1
                stores.clear()
                for r in requests:
                    r.pins.clear()
            elif op == "drain":
                pair.compare_drains()
            # Lookups change nothing: check every key's state after every call.
            probe = requests[0].ctx if requests else ReqContext(req_id="probe")
            for k in pool:
                pair.call("lookup", k, probe)
        pair.compare_drains()
    except StopIteration:
        pass
    return pair
