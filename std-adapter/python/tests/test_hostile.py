"""Careless and hostile arguments: every bad call raises an ordinary Python exception (never a
Rust panic, never a crash) and changes nothing.

Two kvtier managers built alike run the same random protocol, each with its own request
contexts; between its calls one of them also receives bad calls: keys that are not bytes
(unhashable, or offered for storing: a hashable one is a key no chunk has, as in vLLM),
key lists that are not iterable or raise half-way, contexts of the wrong shape, positions
that are not integers in 0..2^63, bytes subclasses whose ``__hash__`` raises, callbacks into
the busy manager, and more. Every bad call must raise one of the exceptions a Python caller
handles (``TypeError``, ``ValueError``, ``AssertionError``, ``AttributeError``,
``OverflowError``, ``RuntimeError`` for a manager called from inside its own call, or the
error of the caller's own object), and afterwards the two managers must keep answering alike,
call for call: had a bad call changed the manager, their lookups, chunk ids, victims, events,
stats or live requests would part.

Also: a key whose ``__eq__`` calls back into the busy manager, threads meeting inside one
manager (the call that finds it busy raises RuntimeError and changes nothing), and what a
manager returned (an event iterator, a ``counts`` snapshot, its bound ``lookup``) outliving it.
test_hostile_vllm.py compares hostile calls with vLLM's own manager.
"""

from __future__ import annotations

import gc
import os
import random
import threading
import time

import numpy as np
import pytest
from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key

from kvtier.vllm import KvtierOffloadingManager

SEQUENCES = int(os.environ.get("KVTIER_HOSTILE_SEQUENCES", "1000"))

# What a bad call may raise: Python's own errors for bad values and types, the error a
# caller's object raised, or (for a call made from inside another call on the same manager)
# the RuntimeError of a manager already in use.
ALLOWED = (TypeError, ValueError, AssertionError, AttributeError, OverflowError, RuntimeError)


class Boom(Exception):
    """Raised by the caller's own objects (iterables, hashes) half-way through a call."""


class HashRaises(bytes):
    def __hash__(self):
        raise Boom("hash")


class Reenters:
    """Calls back into the manager under test from inside a call (a key's ``__hash__``, a
    position's ``__index__``): the manager is busy, so the inner call fails, and so does the
    outer one."""

    manager: KvtierOffloadingManager | None = None

    @classmethod
    def poke(cls):
        assert cls.manager is not None
        cls.manager.lookup(b"x" * 20, ReqContext(req_id="inner"))


class HashReenters(bytes):
    def __hash__(self):
        Reenters.poke()
        return bytes.__hash__(self)


class IndexReenters:
    def __index__(self):
        Reenters.poke()
        return 16


def _absent_key(k) -> bool:
    """Whether `k` is a hashable key that is not bytes (and so, for vLLM's dicts and kvtier,
    a key no chunk has: the pool's keys are 12 to 36 bytes long)."""
    if isinstance(k, bytes):
        return False
    try:
        hash(k)
    except TypeError:
        return False
    return True


def _raising(keys):
    yield from keys
    raise Boom("iterable")


class Per:
    """An argument that differs between the two managers (each has its own contexts)."""

    def __init__(self, good, bad):
        self.sides = (good, bad)


class Twin:
    """Two managers built alike."""

    def __init__(self, rng: random.Random):
        kwargs = dict(
            num_chunks=rng.choice([1, 2, 3, 4, 6, 8]),
            cache_policy=rng.choice(["lru", "arc"]),
            enable_events=True,
            store_threshold=rng.choice([0, 0, 2]),
            max_tracker_size=rng.choice([3, 64_000]),
        )
        self.good = KvtierOffloadingManager(**kwargs)
        self.bad = KvtierOffloadingManager(**kwargs)
        self.log: list[str] = []

    def both(self, name, *args):
        """Calls both managers alike; returns the two answers."""
        self.log.append(name)
        return [
            getattr(m, name)(*(a.sides[side] if isinstance(a, Per) else a for a in args))
            for side, m in enumerate((self.good, self.bad))
        ]


def _spec_ids(spec):
    return spec.block_ids.tolist()


def _same(a, b, what: str, log: list[str]) -> None:
    assert a == b, f"{what} differs after {log[-12:]}: {a!r} vs {b!r}"


def _positions_ctx(keys, bad_at: int | None = None, bad=None) -> ReqContext:
    ctx = ReqContext(req_id="hostile")
    for i, k in enumerate(keys):
        ctx.set_offload_key_position(k, bad if i == bad_at else (i + 1) * 16)
    return ctx


def _hostile(rng: random.Random, m: KvtierOffloadingManager, ctx: ReqContext, keys) -> str:
    """One bad call on `m` (with `ctx`, a live request's context, where the call takes one);
    returns its description. Each is built to fail, and must fail with an allowed error."""
    keys = list(keys)
    bad_key = rng.choice(
        [None, 5, 2.5, "a str", bytearray(b"abcd"), memoryview(b"abcd"), [b"x"], object(),
         HashRaises(b"h" * 20), HashReenters(b"r" * 20)]
    )
    Reenters.manager = m
    at = rng.randint(0, len(keys))
    mixed = keys[:at] + [bad_key] + keys[at:]
    with_keys = ["prepare_store", "prepare_load", "complete_load", "complete_store", "touch"]
    with_ctx = ["prepare_store", "prepare_load", "on_new_request", "on_request_finished"]
    shape = rng.choice(["bad key", "bad key", "not iterable", "raising iterable",
                        "bad context", "bad positions", "bad state", "bad flag"])
    if shape == "bad key":
        method = rng.choice(with_keys + ["lookup"])
        args = (bad_key, ctx) if method == "lookup" else (mixed, ctx)
    elif shape == "not iterable":
        method = rng.choice(with_keys)
        args = (rng.choice([5, None, 3.5, object()]), ctx)
    elif shape == "raising iterable":
        method = rng.choice(with_keys)
        args = (_raising(keys), ctx)
    elif shape == "bad context":
        method = rng.choice(with_ctx)
        bad_ctx = rng.choice([None, 7, object(), "ctx"])
        args = (bad_ctx,) if method.startswith("on_") else (keys, bad_ctx)
    elif shape == "bad positions":
        # Every key has a position, one of them not an integer in 0..2^63.
        method = rng.choice(["prepare_store", "prepare_load"])
        bad = rng.choice([-1, 2**63, 2**64 + 5, 1.5, "16", b"16", IndexReenters()])
        args = (keys, _positions_ctx(keys, rng.randrange(len(keys)), bad))
    elif shape == "bad state":
        # A context whose scratch dict is not a dict; or, for a call that reads positions,
        # whose position map is not a dict.
        method = rng.choice(with_ctx)
        bad_ctx = _positions_ctx(keys)
        if method.startswith("on_") or rng.random() < 0.5:
            object.__setattr__(bad_ctx, "_state", [])
        else:
            object.__setattr__(bad_ctx, "_offload_key_positions", ["not", "a", "dict"])
        args = (bad_ctx,) if method.startswith("on_") else (keys, bad_ctx)
    else:
        method = "complete_store"
        args = (keys, ctx, rng.choice(["yes", 1.0, None, [True]]))
    desc = f"{method} with {shape} ({bad_key!r} at {at})" if shape == "bad key" else \
        f"{method} with {shape}"
    if shape == "bad key" and _absent_key(bad_key) and method in ("lookup", "touch",
                                                                  "complete_store"):
        # As vLLM's dicts take it: a hashable key that is not bytes is one no chunk has,
        # which these calls answer or pass over (alone, so that nothing else is touched).
        answer = getattr(m, method)(*((bad_key, ctx) if method == "lookup" else ([bad_key], ctx)))
        assert answer is (LookupResult.MISS if method == "lookup" else None), desc
        return desc + " (accepted: a key no chunk has)"
    try:
        getattr(m, method)(*args)
    except ALLOWED + (Boom,):
        return desc
    except BaseException as e:  # a Rust panic surfaces as pyo3's PanicException
        pytest.fail(f"{desc} raised {type(e).__module__}.{type(e).__name__}: {e}")
    pytest.fail(f"{desc} was accepted")


def run(seed: int) -> int:
    rng = random.Random(seed)
    t = Twin(rng)
    pool = [make_offload_key(rng.randbytes(rng.choice([8, 16, 32])), rng.randint(0, 1))
            for _ in range(rng.randint(3, 10))]
    live: list[tuple[Per, list[bytes], list[bytes]]] = []
    hostile = 0
    for step in range(rng.randint(20, 80)):
        op = rng.choices(["new", "load", "store", "finish", "touch", "drain", "hostile"],
                         weights=[6, 6, 8, 4, 2, 3, 10])[0]
        if op == "new" or not live:
            keys = rng.sample(pool, rng.randint(1, len(pool)))
            ctxs = (ReqContext(req_id=f"g{step}"), ReqContext(req_id=f"b{step}"))
            if rng.random() < 0.8:
                for c in ctxs:
                    for i, k in enumerate(keys):
                        c.set_offload_key_position(k, (i + 1) * 16)
            t.both("on_new_request", Per(*ctxs))
            live.append((Per(*ctxs), keys, []))
        elif op == "load":
            ctxs, keys, pins = rng.choice(live)
            hits = []
            for k in keys:
                a, b = t.both("lookup", k, ctxs)
                _same(a, b, "lookup", t.log)
                if a.name != "HIT":
                    break
                hits.append(k)
            if hits:
                a, b = t.both("prepare_load", hits, ctxs)
                _same(_spec_ids(a), _spec_ids(b), "prepare_load chunk ids", t.log)
                pins.extend(hits)
        elif op == "store":
            ctxs, keys, pins = rng.choice(live)
            if pins:
                t.both("complete_load", list(pins), ctxs)
                pins.clear()
            offer = keys[rng.randint(0, len(keys) - 1):]
            a, b = t.both("prepare_store", offer, ctxs)
            _same(a is None, b is None, "prepare_store None", t.log)
            if a is not None:
                _same(a.keys_to_store, b.keys_to_store, "keys_to_store", t.log)
                _same(a.evicted_keys, b.evicted_keys, "evicted_keys", t.log)
                _same(_spec_ids(a.store_spec), _spec_ids(b.store_spec), "store chunk ids",
                      t.log)
                if a.keys_to_store:
                    t.both("complete_store", a.keys_to_store, ctxs, rng.random() < 0.85)
        elif op == "finish":
            ctxs, keys, pins = live.pop(rng.randrange(len(live)))
            if pins:
                t.both("complete_load", list(pins), ctxs)
            t.both("on_request_finished", ctxs)
        elif op == "touch":
            ctxs, keys, _ = rng.choice(live)
            t.both("touch", rng.sample(keys, rng.randint(0, len(keys))), ctxs)
        elif op == "drain":
            _same(list(t.good.take_events()), list(t.bad.take_events()), "events", t.log)
            _same(t.good.get_stats().reduce(), t.bad.get_stats().reduce(), "stats", t.log)
        else:
            ctxs, keys, _ = rng.choice(live)
            t.log.append(_hostile(rng, t.bad, ctxs.sides[1], keys))
            hostile += 1
    probe = ReqContext(req_id="probe")
    _same([t.good.lookup(k, probe) for k in pool], [t.bad.lookup(k, probe) for k in pool],
          "final lookups", t.log)
    _same(list(t.good.take_events()), list(t.bad.take_events()), "final events", t.log)
    _same(t.good.get_stats().reduce(), t.bad.get_stats().reduce(), "final stats", t.log)
    _same(t.good.live_requests(), t.bad.live_requests(), "live requests", t.log)
    return hostile


def test_bad_calls_raise_python_errors_and_change_nothing():
    total = sum(run(seed) for seed in range(SEQUENCES))
    # The sequences did make bad calls (about one step in four).
    assert total > 5 * SEQUENCES


@pytest.mark.parametrize(
    "kwargs, error",
    [
        (dict(num_chunks=-1), ValueError),
        (dict(num_chunks=2**32), ValueError),
        (dict(num_chunks=2**80), OverflowError),
        (dict(num_chunks="8"), TypeError),
        (dict(num_chunks=8, cache_policy="lfu"), ValueError),
        (dict(num_chunks=8, cache_policy=None), TypeError),
        (dict(num_chunks=8, max_tracker_size=2**40, store_threshold=2), ValueError),
        (dict(num_chunks=8, store_threshold="2"), TypeError),
    ],
)
def test_bad_constructor_arguments_are_clear_errors(kwargs, error):
    with pytest.raises(error):
        KvtierOffloadingManager(**kwargs)


def test_numpy_integers_are_accepted_as_positions():
    # A scheduler may compute positions with NumPy: they are integers, as vLLM reads them.
    m = KvtierOffloadingManager(num_chunks=4)
    ctx = ReqContext(req_id="a")
    keys = [make_offload_key(bytes([i]) * 16, 0) for i in range(3)]
    for i, k in enumerate(keys):
        ctx.set_offload_key_position(k, np.int64((i + 1) * 16))
    m.on_new_request(ctx)
    out = m.prepare_store(keys, ctx)
    assert out.keys_to_store == keys


class EqReenters(bytes):
    """Equal to its bytes, but its ``__eq__`` (which a dict lookup of another object with the
    same hash runs) calls back into the busy manager."""

    __hash__ = bytes.__hash__

    def __eq__(self, other):
        Reenters.poke()
        return bytes.__eq__(self, other)


def test_a_key_whose_eq_calls_back_raises_and_changes_nothing():
    ms = [KvtierOffloadingManager(num_chunks=4, enable_events=True) for _ in range(2)]
    keys = [make_offload_key(bytes([i]) * 16, 0) for i in range(3)]
    for m in ms:
        ctx = _positions_ctx(keys)
        out = m.prepare_store(keys[:2], ctx)
        m.complete_store(out.keys_to_store, ctx)
    # The position map holds the plain keys: looking up an equal object of another class runs
    # its __eq__, which finds the manager busy.
    Reenters.manager = ms[1]
    bad = _positions_ctx(keys)
    with pytest.raises(RuntimeError):
        ms[1].prepare_store([keys[0], EqReenters(keys[1]), keys[2]], bad)
    with pytest.raises(RuntimeError):
        ms[1].prepare_load([EqReenters(keys[0])], bad)
    for m in ms:
        ctx = _positions_ctx(keys)
        out = m.prepare_store(keys, ctx)
        m.complete_store(out.keys_to_store, ctx)
        m.on_request_finished(ctx)
    probe = ReqContext(req_id="probe")
    assert [ms[0].lookup(k, probe) for k in keys] == [ms[1].lookup(k, probe) for k in keys]
    assert [e.keys for e in ms[0].take_events()] == [e.keys for e in ms[1].take_events()]
    assert ms[0].get_stats().reduce() == ms[1].get_stats().reduce()
    assert ms[0].live_requests() == ms[1].live_requests()


class YieldingContext(ReqContext):
    """A context whose state lookups let other threads run (``time.sleep(0)`` releases the GIL)
    in the middle of the manager's call."""

    def get_state(self, cls):
        time.sleep(0)
        return super().get_state(cls)


def test_calls_from_several_threads_raise_when_busy_and_change_nothing():
    # Four threads share one manager. A call that finds it busy (another thread's call is
    # inside the context's get_state) raises RuntimeError and changes nothing, so each thread
    # retries it; at the end every key is stored once, as if the calls had run one by one.
    m = KvtierOffloadingManager(num_chunks=4 * 60, store_threshold=0)
    busy = [0]
    errors: list[BaseException] = []

    def retry(call):
        while True:
            try:
                return call()
            except RuntimeError:
                busy[0] += 1
                time.sleep(0)

    def work(t: int) -> None:
        try:
            for r in range(60):
                ctx = YieldingContext(req_id=f"{t}-{r}")
                k = make_offload_key(t.to_bytes(2, "big") + r.to_bytes(2, "big"), 0)
                ctx.set_offload_key_position(k, 16)
                retry(lambda: m.on_new_request(ctx))
                out = retry(lambda: m.prepare_store([k], ctx))
                assert out.keys_to_store == [k], out.keys_to_store
                retry(lambda: m.complete_store([k], ctx))
                assert retry(lambda: m.lookup(k, ctx)) is LookupResult.HIT
                retry(lambda: m.on_request_finished(ctx))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    assert busy[0] > 0  # the threads did meet inside the manager
    probe = ReqContext(req_id="probe")
    keys = [make_offload_key(t.to_bytes(2, "big") + r.to_bytes(2, "big"), 0)
            for t in range(4) for r in range(60)]
    assert all(m.lookup(k, probe) is LookupResult.HIT for k in keys)
    stats = m.get_stats().reduce()
    assert stats["vllm:kv_offload_cpu_cache_usage_perc"] == 0.0  # all idle, none pinned
    assert m._native.resident_chunks() == len(keys)
    assert m.live_requests() == 0


def test_what_a_manager_returned_outlives_it():
    m = KvtierOffloadingManager(num_chunks=4, enable_events=True, store_threshold=2)
    keys = [make_offload_key(bytes([i]) * 16, 0) for i in range(3)]
    ctx = _positions_ctx(keys)
    m.prepare_store(keys, ctx)
    out = m.prepare_store(keys, ctx)
    m.complete_store(out.keys_to_store, ctx)
    events = m.take_events()  # an iterator
    counts = m.counts
    lookup = m.lookup  # a bound native method: it keeps the native manager
    spec = m.prepare_load(keys[:1], ctx)
    del m
    gc.collect()
    assert [e.keys for e in events] == [keys]
    assert list(counts.values()) == [2, 2, 2]
    assert spec.block_ids.tolist() == [0] and out.store_spec.block_ids.tolist() == [0, 1, 2]
    assert lookup(keys[0], ReqContext(req_id="x")) is LookupResult.HIT
    del lookup
    gc.collect()
    # The contexts still hold the dead manager's request state; freeing them is safe.
    del ctx
    gc.collect()
