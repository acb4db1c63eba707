"""Where a caller meets more of vLLM's manager than its methods' answers: contexts of its own
class, the reuse filter's public state, keys that are not bytes. Each is compared with vLLM
0.33.0's CPUOffloadingManager."""

from __future__ import annotations

import random
from collections import OrderedDict

import pytest
from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

from kvtier.vllm import KvtierOffloadingManager


def key(i: int, group: int = 0) -> bytes:
    return make_offload_key(i.to_bytes(8, "big"), group)


def both(**kwargs):
    return CPUOffloadingManager(**kwargs), KvtierOffloadingManager(**kwargs)


# ----- a ReqContext subclass -----


class LazyContext(ReqContext):
    """Computes each key's end-token position from its index in a list of its own (nothing in
    the position map), and counts the calls made to its methods."""

    def __init__(self, req_id: str, order: list[bytes]):
        super().__init__(req_id=req_id)
        self.order = order
        self.calls = {"get_offload_key_position": 0, "get_state": 0, "set_state": 0}

    def get_offload_key_position(self, key):
        self.calls["get_offload_key_position"] += 1
        return (self.order.index(key) + 1) * 16 if key in self.order else None

    def get_state(self, cls):
        self.calls["get_state"] += 1
        return super().get_state(cls)

    def set_state(self, val):
        self.calls["set_state"] += 1
        super().set_state(val)


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_a_context_subclass_is_read_through_its_methods(policy):
    # Keys offered out of prefix order, their positions known only to the subclass's method:
    # the victims follow those positions in vLLM's manager, and must in kvtier's.
    victims = []
    calls = []
    for m in both(num_chunks=6, cache_policy=policy):
        order = [key(i) for i in range(6)]
        ctx = LazyContext("lazy", order)
        m.on_new_request(ctx)
        for batch in ([order[3], order[5]], [order[0]], [order[4], order[1], order[2]]):
            out = m.prepare_store(batch, ctx)
            m.complete_store(out.keys_to_store, ctx)
        m.on_request_finished(ctx)
        other = ReqContext(req_id="pressure")
        out = m.prepare_store([key(100 + i) for i in range(4)], other)
        victims.append(out.evicted_keys)
        calls.append(ctx.calls)
    assert victims[0] == victims[1]
    assert len(victims[0]) == 4
    # kvtier asked the subclass for every position and kept its state through its methods.
    assert calls[1]["get_offload_key_position"] >= 6
    assert calls[1]["get_state"] >= 1 and calls[1]["set_state"] == 1


def test_a_context_subclass_that_answers_no_position_is_read_as_vllm_reads_it():
    class NoPositions(ReqContext):
        def get_offload_key_position(self, key):
            return None

    victims = []
    for m in both(num_chunks=3):
        ctx = NoPositions(req_id="a")
        for k in ([key(2)], [key(0)], [key(1)]):
            m.prepare_store(k, ctx)
            m.complete_store(k, ctx)
        ctx.set_offload_key_position(key(0), 16)  # in the map, which the method hides
        m.on_request_finished(ctx)
        victims.append(m.prepare_store([key(9)], ReqContext(req_id="b")).evicted_keys)
    assert victims[0] == victims[1]


# ----- the reuse filter's public state -----


def _tracker_state(m):
    counts = m.counts
    return (
        type(counts).__name__,
        None if counts is None else list(counts.items()),
        type(m.stores_skipped_in_current_batch).__name__,
        m.stores_skipped_in_current_batch,
    )


@pytest.mark.parametrize("threshold, tracker", [(0, 64_000), (1, 4), (2, 3), (2, 64_000), (3, 5)])
def test_counts_and_stores_skipped_are_vllms(threshold, tracker):
    # vLLM's counts is an OrderedDict of key -> offers, least recently offered first (None
    # without a filter); stores_skipped_in_current_batch counts the skipped candidates until
    # get_stats() drains it. Compared after every call, order included.
    rng = random.Random(threshold * 100 + tracker)
    ms = both(num_chunks=4, cache_policy="lru", store_threshold=threshold,
              max_tracker_size=tracker)
    pool = [key(i) for i in range(9)]
    assert _tracker_state(ms[0]) == _tracker_state(ms[1])
    if threshold >= 2:
        assert isinstance(ms[1].counts, OrderedDict) and not ms[1].counts
    else:
        assert ms[1].counts is None
    for step in range(400):
        ctx = ReqContext(req_id=str(step))
        op = rng.random()
        if op < 0.7:
            offer = rng.sample(pool, rng.randint(1, 5))
            outs = [m.prepare_store(offer, ctx) for m in ms]
            assert (outs[0] is None) == (outs[1] is None)
            if outs[0] is not None:
                assert outs[0].keys_to_store == outs[1].keys_to_store
                success = rng.random() < 0.8
                for m, out in zip(ms, outs):
                    m.complete_store(out.keys_to_store, ctx, success)
        elif op < 0.8:
            for m in ms:
                m.reset_cache()
        else:
            assert ms[0].get_stats().reduce() == ms[1].get_stats().reduce()
        for m in ms:
            m.on_request_finished(ctx)
        assert _tracker_state(ms[0]) == _tracker_state(ms[1]), step
    # A snapshot: writing to it changes nothing in kvtier's manager.
    if threshold >= 2:
        snapshot = ms[1].counts
        snapshot.clear()
        assert ms[1].counts == ms[0].counts


# ----- keys that are not bytes -----


class Hashless:
    __hash__ = None  # unhashable, like a list


class Boom(Exception):
    pass


class HashRaises:
    def __hash__(self):
        raise Boom("hash")


NOT_BYTES = [None, 7, -1, 2.5, "a str", "", memoryview(b"abcd"), memoryview(key(1)), (1, 2),
             frozenset({b"x"}), object(), True]
UNHASHABLE = [[b"x"], bytearray(b"abcd"), {"k": 1}, Hashless()]


def _outcome(call):
    try:
        r = call()
    except Exception as e:  # noqa: BLE001 - the exception's type is what is compared
        return ("raises", type(e))
    if r is None:
        return ("returns", None)
    if isinstance(r, LookupResult):
        return ("returns", r)
    return ("returns", type(r).__name__)


@pytest.mark.parametrize("bad", NOT_BYTES + UNHASHABLE + [HashRaises()],
                         ids=lambda v: type(v).__name__)
def test_keys_that_are_not_bytes_answer_as_in_vllm(bad):
    # vLLM looks keys up in dicts: any hashable key is a MISS, an unhashable one raises
    # TypeError, a raising __hash__ raises its own error. touch and complete_store pass over
    # absent keys; prepare_load and complete_load assert on them.
    ms = both(num_chunks=4)
    stored = [key(1), key(2)]
    for m in ms:
        ctx = ReqContext(req_id="seed")
        m.prepare_store(stored, ctx)
        m.complete_store(stored, ctx)
    calls = [
        lambda m, c: m.lookup(bad, c),
        lambda m, c: m.touch([bad], c),
        lambda m, c: m.touch([*stored, bad], c),
        lambda m, c: m.complete_store([bad], c),
        lambda m, c: m.complete_store([bad], c, False),
        lambda m, c: m.prepare_load([bad], c),
        lambda m, c: m.complete_load([bad], c),
        lambda m, c: m.complete_load([bad], c),
    ]
    for n, call in enumerate(calls):
        ctx = (ReqContext(req_id=f"v{n}"), ReqContext(req_id=f"k{n}"))
        got = [_outcome(lambda m=m, c=c: call(m, c)) for m, c in zip(ms, ctx)]
        assert got[0] == got[1], (n, got)
    probe = ReqContext(req_id="probe")
    assert [ms[1].lookup(k, probe) for k in stored] == [LookupResult.HIT] * 2


@pytest.mark.parametrize("bad", [None, 7, "a str", 2.5, object()] + UNHASHABLE,
                         ids=lambda v: type(v).__name__)
def test_a_store_offer_of_keys_that_are_not_bytes_raises_type_error_as_in_vllm(bad):
    # vLLM raises TypeError too (reading the key's KV group from its last 4 bytes), after it
    # has counted the offer in its reuse tracker; kvtier raises before changing anything.
    ms = both(num_chunks=4)
    got = [_outcome(lambda m=m: m.prepare_store([bad], ReqContext(req_id="a"))) for m in ms]
    assert got == [("raises", TypeError)] * 2


def test_a_store_offer_of_a_memoryview_is_refused_where_vllm_stores_it():
    # The known difference: vLLM's manager stores any sliceable key its KV-group read accepts
    # (a memoryview, a tuple of small ints); kvtier stores bytes only.
    vllm, ours = both(num_chunks=4)
    view = memoryview(key(5))
    assert vllm.prepare_store([view], ReqContext(req_id="a")).keys_to_store == [view]
    with pytest.raises(TypeError, match="bytes"):
        ours.prepare_store([view], ReqContext(req_id="a"))
    assert ours.interned_keys() == 0
