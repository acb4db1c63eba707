"""Hostile values against vLLM 0.33.0's own manager: random call sequences (hypothesis) sent to
CPUOffloadingManager and KvtierOffloadingManager side by side, with keys of any type and
length, unhashable keys, keys whose ``__hash__`` raises, key lists that are not iterable or
raise half-way, contexts that are not contexts. After every call the two must agree: the same
answer, or an exception of the same type; and the same lookups of every key.

Hostile calls are placed where vLLM's manager fails before it changes anything (a bad key
first in the order vLLM reads the list, a raising generator where vLLM makes a list of it
first), so that the two managers stay comparable after a failed call. What vLLM does
half-way (a bad key in the middle of ``complete_load``) kvtier refuses whole: that, and calls
from inside a key's ``__hash__``, are test_hostile.py's (kvtier against itself).
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

from kvtier.vllm import KvtierOffloadingManager


class Boom(Exception):
    """Raised by the caller's own objects."""


class HashRaises(bytes):
    def __hash__(self):
        raise Boom("hash")


class Unhashable:
    __hash__ = None


class EqualsEverything:
    """Hashes as a held key's bytes and claims equality with anything: found as dicts find
    it."""

    def __init__(self, like: bytes):
        self.like = like

    def __hash__(self):
        return hash(self.like)

    def __eq__(self, other):
        return True


def _raising(keys):
    yield from keys
    raise Boom("iterable")


# Keys no chunk has, of other types (hashable): dict lookups take them.
_ABSENT = st.sampled_from([None, 0, 7, -3, 2.5, "", "a str", (1, 2), frozenset(), True])
# Keys that raise when hashed (made at each draw: hypothesis would hash sampled values).
_MAKE_RAISING = (lambda: [b"x"], lambda: bytearray(b"abcd"), lambda: {"k": 1}, Unhashable,
                 lambda: HashRaises(b"h" * 20))
_RAISING = st.integers(0, len(_MAKE_RAISING) - 1).map(lambda i: _MAKE_RAISING[i]())
_EXPECTED = (TypeError, AssertionError, AttributeError, Boom)


def _normal(r):
    """An answer, in a form compared across the two managers."""
    if r is None or isinstance(r, LookupResult):
        return r
    if isinstance(r, CPULoadStoreSpec):
        return ("spec", r.block_ids.tolist(), str(r.block_ids.dtype))
    if hasattr(r, "keys_to_store"):
        return ("store", list(r.keys_to_store), list(r.evicted_keys), _normal(r.store_spec))
    return ("other", type(r).__name__)


def _outcome(call):
    try:
        return ("returns", _normal(call()))
    except _EXPECTED as e:
        return ("raises", type(e))


class Pair:
    def __init__(self, **kwargs):
        self.ms = (CPUOffloadingManager(**kwargs), KvtierOffloadingManager(**kwargs))
        self.log: list[str] = []

    def call(self, what: str, f, ctxs=None):
        """Runs `f(manager, context)` on both; asserts the same outcome; returns it."""
        self.log.append(what)
        got = [_outcome(lambda m=m, i=i: f(m, None if ctxs is None else ctxs[i]))
               for i, m in enumerate(self.ms)]
        assert got[0] == got[1], f"{what}: {got} after {self.log[-10:]}"
        return got[0]


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.data(),
    policy=st.sampled_from(["lru", "arc"]),
    threshold=st.sampled_from([0, 0, 2]),
    capacity=st.integers(1, 6),
    raw=st.lists(st.binary(min_size=0, max_size=40), min_size=2, max_size=8, unique=True),
)
def test_hostile_calls_answer_as_vllms_manager(data, policy, threshold, capacity, raw):
    p = Pair(num_chunks=capacity, cache_policy=policy, enable_events=True,
             store_threshold=threshold, max_tracker_size=4)
    pool = [make_offload_key(b, i % 2) for i, b in enumerate(raw)]
    pool.append(make_offload_key(bytes(5_000), 1))
    live: list[tuple[tuple[ReqContext, ReqContext], list[bytes]]] = []
    pins: list[tuple[tuple[ReqContext, ReqContext], bytes]] = []
    draw = data.draw
    for step in range(draw(st.integers(5, 40), label="steps")):
        op = draw(st.sampled_from(
            ["new", "store", "load", "unpin", "touch", "finish", "drain", "reset",
             "h_lookup", "h_touch", "h_complete_store", "h_load", "h_unpin", "h_store",
             "h_iterable", "h_context"]), label="op")
        if op == "new" or not live:
            keys = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=5, unique=True))
            ctxs = (ReqContext(req_id=str(step)), ReqContext(req_id=str(step)))
            if draw(st.booleans()):
                for c in ctxs:
                    for i, k in enumerate(keys):
                        c.set_offload_key_position(k, (i + 1) * 16)
            p.call("on_new_request", lambda m, c: m.on_new_request(c), ctxs)
            live.append((ctxs, keys))
            continue
        ctxs, keys = draw(st.sampled_from(live))
        some = draw(st.lists(st.sampled_from(pool), max_size=4, unique=True))
        if op == "store":
            out = p.call("prepare_store", lambda m, c: m.prepare_store(keys, c), ctxs)
            if out[0] == "returns" and out[1] is not None and out[1][1]:
                ok = draw(st.booleans())
                p.call("complete_store", lambda m, c: m.complete_store(out[1][1], c, ok), ctxs)
        elif op == "load":
            hits = [k for k in keys if p.ms[1].lookup(k, ctxs[1]) is LookupResult.HIT]
            if hits:
                p.call("prepare_load", lambda m, c: m.prepare_load(hits, c), ctxs)
                pins.extend((ctxs, k) for k in hits)
        elif op == "unpin" and pins:
            pctxs, k = pins.pop(draw(st.integers(0, len(pins) - 1)))
            p.call("complete_load", lambda m, c: m.complete_load([k], c), pctxs)
        elif op == "touch":
            p.call("touch", lambda m, c: m.touch(some, c), ctxs)
        elif op == "finish":
            live.remove((ctxs, keys))
            p.call("on_request_finished", lambda m, c: m.on_request_finished(c), ctxs)
        elif op == "drain":
            p.call("events", lambda m, c: [(list(e.keys), e.removed) for e in m.take_events()])
            p.call("stats", lambda m, c: m.get_stats().reduce())
        elif op == "reset":
            p.call("reset_cache", lambda m, c: m.reset_cache())
            pins.clear()
        elif op == "h_lookup":
            bad = draw(st.one_of(_ABSENT, _RAISING, st.sampled_from(pool).map(memoryview),
                                 st.sampled_from(pool).map(EqualsEverything)))
            p.call(f"lookup({bad!r})", lambda m, c: m.lookup(bad, c), ctxs)
        elif op == "h_touch":
            # vLLM touches from the list's end: a raising key last fails before any touch.
            bad = draw(st.one_of(_ABSENT, _RAISING, st.sampled_from(pool).map(memoryview)))
            p.call(f"touch(... {bad!r})", lambda m, c: m.touch([*some, bad], c), ctxs)
        elif op == "h_complete_store":
            bad = draw(st.one_of(_ABSENT, _RAISING))
            ok = draw(st.booleans())
            p.call(f"complete_store({bad!r} ...)",
                   lambda m, c: m.complete_store([bad, *some], c, ok), ctxs)
        elif op == "h_load":
            # A context without positions: kvtier would refuse a load whose keys have
            # positions for some keys only (a known difference) before finding the bad key.
            bad = draw(st.one_of(_ABSENT, _RAISING))
            fresh = (ReqContext(req_id="h"), ReqContext(req_id="h"))
            p.call(f"prepare_load({bad!r} ...)",
                   lambda m, c: m.prepare_load([bad, *keys], c), fresh)
        elif op == "h_unpin":
            bad = draw(st.one_of(_ABSENT, _RAISING))
            p.call(f"complete_load({bad!r} ...)",
                   lambda m, c: m.complete_load([bad, *keys], c), ctxs)
        elif op == "h_store":
            # vLLM reads a store offer whole before it changes anything it shows for a
            # raising key; a key of another type it fails on only once its reuse tracker has
            # counted the offer (so: without a filter).
            bad = draw(_RAISING if threshold else st.one_of(
                _RAISING, st.sampled_from([None, 7, 2.5, "a str", frozenset()])))
            p.call(f"prepare_store({bad!r} ...)",
                   lambda m, c: m.prepare_store([bad, *keys], c), ctxs)
        elif op == "h_iterable":
            method = draw(st.sampled_from(["prepare_store", "touch"]))
            shape = draw(st.sampled_from(["raising", "not iterable"]))
            arg = (lambda: _raising(keys)) if shape == "raising" else (lambda: 5)
            p.call(f"{method}({shape})", lambda m, c: getattr(m, method)(arg(), c), ctxs)
        elif op == "h_context":
            bad = draw(st.sampled_from([None, 7, "ctx", object()]))
            method = draw(st.sampled_from(
                ["on_new_request", "on_request_finished", "touch", "lookup"]
                + (["prepare_store"] if not threshold else [])))
            if method.startswith("on_"):
                p.call(f"{method}({bad!r})", lambda m, c: getattr(m, method)(bad))
            elif method == "lookup":
                p.call(f"lookup(ctx={bad!r})", lambda m, c: m.lookup(keys[0], bad))
            else:
                p.call(f"{method}(ctx={bad!r})", lambda m, c: getattr(m, method)(keys, bad))
        probe = ReqContext(req_id="probe")
        p.call("lookups", lambda m, c: [m.lookup(k, probe) for k in pool])
    p.call("final events", lambda m, c: [(list(e.keys), e.removed) for e in m.take_events()])
    p.call("final stats", lambda m, c: m.get_stats().reduce())
