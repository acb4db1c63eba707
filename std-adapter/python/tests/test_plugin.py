"""KvtierOffloadingManager and KvtierOffloadingSpec against vLLM 0.33.0's own classes."""

from __future__ import annotations

import gc
import inspect

import numpy as np
import pytest
from vllm.v1.kv_offload.base import (
    LookupResult,
    OffloadingManager,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
    make_offload_key,
)
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec
from vllm.v1.kv_offload.factory import OffloadingSpecFactory

from kvtier.vllm import KvtierOffloadingManager, KvtierOffloadingSpec


def key(i: int, group: int = 0, length: int = 32) -> bytes:
    return make_offload_key(i.to_bytes(length, "big"), group)


def store(m, keys, ctx, success=True):
    out = m.prepare_store(keys, ctx)
    m.complete_store(out.keys_to_store, ctx, success)
    return out


# ----- the interface -----


def test_constructor_takes_exactly_cpu_offloading_managers_keywords():
    ours = inspect.signature(KvtierOffloadingManager.__init__).parameters
    theirs = inspect.signature(CPUOffloadingManager.__init__).parameters
    assert [(p.name, p.kind, p.default) for p in ours.values()] == [
        (p.name, p.kind, p.default) for p in theirs.values()
    ]


def test_every_method_vllms_manager_overrides_is_implemented():
    interface = {
        name
        for name, v in vars(OffloadingManager).items()
        if not name.startswith("_") and (callable(v) or isinstance(v, property))
    }
    assert {"lookup", "prepare_store", "get_stats", "shutdown", "lock"} <= interface
    overridden = {n for n in interface if n in vars(CPUOffloadingManager)}
    assert overridden - set(vars(KvtierOffloadingManager)) == set()
    m = KvtierOffloadingManager(num_chunks=1)
    for name in interface:
        assert hasattr(m, name)
    with m.lock:
        assert m.has_pending_work() is False
    m.on_schedule_end(None)
    m.on_reset_flushed()
    m.shutdown()



def test_result_objects_equal_what_vllms_constructors_make():
    # kvtier builds these objects without running their __init__: each must carry exactly
    # the attributes, values and array flags the constructor gives.
    m = KvtierOffloadingManager(num_chunks=4)
    ctx = ReqContext(req_id="a")
    request_context = m.on_new_request(ctx)
    assert type(request_context) is RequestOffloadingContext
    assert vars(request_context) == vars(RequestOffloadingContext())
    assert request_context == RequestOffloadingContext()
    keys = [key(1), key(2), key(3)]
    out = m.prepare_store(keys, ctx)
    assert type(out) is PrepareStoreOutput
    assert list(vars(out)) == ["keys_to_store", "store_spec", "evicted_keys"]
    theirs = CPULoadStoreSpec([0, 1, 2])
    assert list(vars(out.store_spec)) == list(vars(theirs)) == ["block_ids"]
    ours = out.store_spec.block_ids
    assert ours.dtype == theirs.block_ids.dtype and ours.shape == theirs.block_ids.shape
    assert ours.tolist() == theirs.block_ids.tolist()
    assert ours.flags.writeable and ours.flags.c_contiguous and ours.flags.owndata
    assert repr(out.store_spec) == repr(theirs)
    assert out == PrepareStoreOutput(keys, out.store_spec, [])
    m.complete_store(out.keys_to_store, ctx)
    # A second offer of held keys: an empty spec, still an int32 array.
    again = m.prepare_store(keys, ctx)
    assert again.keys_to_store == [] and again.store_spec.block_ids.dtype == np.int32
    assert again.store_spec.block_ids.shape == (0,)


def test_out_of_tree_policies_and_unknown_policies_are_clear_errors():
    with pytest.raises(ValueError, match="cache_policy_module_path"):
        KvtierOffloadingManager(
            num_chunks=4, cache_policy="mine", cache_policy_module_path="my.policies"
        )
    with pytest.raises(ValueError, match="Unknown cache policy"):
        CPUOffloadingManager(num_chunks=4, cache_policy="fifo")
    with pytest.raises(ValueError, match="Unknown cache policy"):
        KvtierOffloadingManager(num_chunks=4, cache_policy="fifo")
    with pytest.raises(ValueError, match="num_chunks"):
        KvtierOffloadingManager(num_chunks=-1)


def test_answers_are_vllms_types():
    m = KvtierOffloadingManager(num_chunks=4, enable_events=True)
    ctx = ReqContext(req_id="a")
    keys = [key(1), key(2)]
    out = m.prepare_store(keys, ctx)
    assert type(out.store_spec) is CPULoadStoreSpec
    assert out.store_spec.block_ids.dtype == np.int32
    assert out.store_spec.chunk_ids.tolist() == [0, 1]
    # The very key objects passed in come back.
    assert all(a is b for a, b in zip(out.keys_to_store, keys))
    m.complete_store(keys, ctx)
    assert m.lookup(keys[0], ctx) is LookupResult.HIT
    assert m.get_load_source(keys[0], ctx).value == "host"
    (event,) = list(m.take_events())
    assert event.keys == keys and event.keys[0] is keys[0]
    assert event.medium.name == "CPU" and not event.removed


def test_lookup_through_its_raw_entry_is_the_native_method():
    # The manager's `lookup` is the native method bound through a raw vectorcall entry: the
    # same kind of object, name, signature and doc, the same answers, and for the calls the
    # entry does not run itself (keywords, other counts) the native method's own errors.
    m = KvtierOffloadingManager(num_chunks=4)
    fast, native = m.lookup, m._native.lookup
    assert type(fast) is type(native) and fast.__self__ is native.__self__
    for attr in ("__name__", "__qualname__", "__doc__", "__text_signature__", "__module__"):
        assert getattr(fast, attr) == getattr(native, attr), attr
    assert inspect.signature(fast) == inspect.signature(native)
    ctx = ReqContext(req_id="a")
    keys = [key(1), key(2)]
    store(m, keys, ctx)
    for k in [*keys, bytes(keys[0]), key(3)]:
        answers = [fast(k, ctx), fast(key=k, req_context=ctx), fast(k, req_context=ctx)]
        assert answers == [native(k, ctx)] * 3
    bad = [
        ((keys[0],), {}),
        ((keys[0], ctx, 1), {}),
        ((keys[0], ctx), {"x": 1}),
        ((keys[0],), {"key": keys[1]}),
        (([b"unhashable"], ctx), {}),
        ((), {}),
    ]
    for args, kwargs in bad:
        errors = []
        for f in (fast, native):
            with pytest.raises(TypeError) as e:
                f(*args, **kwargs)
            errors.append(str(e.value))
        assert errors[0] == errors[1], errors


# ----- keys -----


def test_keys_of_any_length_have_exact_identity():
    m = KvtierOffloadingManager(num_chunks=16)
    ctx = ReqContext(req_id="a")
    # Equal in their first 16 and last 4 bytes, different in between.
    a = bytes(16) + b"\x01" + bytes(4)
    b = bytes(16) + b"\x02" + bytes(4)
    odd = [b"", b"\x00", b"x" * 3, b"y" * 100, a]
    store(m, odd, ctx)
    for k in odd:
        assert m.lookup(k, ctx) is LookupResult.HIT
        assert m.lookup(bytes(k), ctx) is LookupResult.HIT  # an equal, distinct object
    assert m.lookup(b, ctx) is LookupResult.MISS
    assert m.lookup(b"y" * 99, ctx) is LookupResult.MISS
    # As vLLM's dicts answer: any other hashable key is a miss, a memoryview of a key's
    # bytes is that key (test_vllm_parity.py compares them with vLLM's manager).
    assert m.lookup("not bytes", ctx) is LookupResult.MISS
    assert m.lookup(memoryview(a), ctx) is LookupResult.HIT


def test_the_key_table_stays_bounded_by_what_the_manager_holds():
    for policy in ("lru", "arc"):
        m = KvtierOffloadingManager(
            num_chunks=64, cache_policy=policy, store_threshold=2, max_tracker_size=128
        )
        peak = 0
        for r in range(5_000):
            ctx = ReqContext(req_id=str(r))
            m.on_new_request(ctx)
            keys = [key(r * 40 + i) for i in range(40)]  # never seen again
            for _ in range(2):
                out = m.prepare_store(keys, ctx)
                if out is not None:
                    m.complete_store(out.keys_to_store, ctx)
            m.on_request_finished(ctx)
            peak = max(peak, m.interned_keys())
        # 200,000 distinct keys went through. Held at most: 64 resident, 128 ghosts (ARC),
        # 128 tracked; the table sweeps once it doubles, from at least 4,096.
        assert peak <= 4_096 + 40
        assert m.interned_keys() <= 4_096 + 40


def test_contexts_freed_without_finishing_release_their_request_slots():
    m = KvtierOffloadingManager(num_chunks=8)
    ctxs = [ReqContext(req_id=str(i)) for i in range(100)]
    for i, ctx in enumerate(ctxs):
        m.prepare_store([key(i)], ctx)
    assert m.live_requests() == 100
    m.on_request_finished(ctxs[0])
    assert m.live_requests() == 99
    del ctx, ctxs
    gc.collect()
    m.touch([], ReqContext(req_id="x"))  # any call releases them
    assert m.live_requests() == 0


# ----- errors -----


def test_where_vllm_asserts_kvtier_raises_the_same_type_and_changes_nothing():
    def scenario(m, inject_failures: bool):
        ctx = ReqContext(req_id="a")
        a, b, c = key(1), key(2), key(3)
        store(m, [a, b], ctx)
        m.prepare_load([a], ctx)
        if inject_failures:
            with pytest.raises(AssertionError, match="index 1 is not in the tier"):
                m.prepare_load([b, c], ctx)  # c is absent
            with pytest.raises(AssertionError, match="index 1 has no load in flight"):
                m.complete_load([a, b], ctx)  # b is not pinned
        m.complete_load([a], ctx)
        # Had the failed calls changed anything, a or b would still be pinned.
        out = m.prepare_store([key(4), key(5)], ReqContext(req_id="b"))
        return out.evicted_keys, out.store_spec.block_ids.tolist()

    vllm = scenario(CPUOffloadingManager(num_chunks=2), False)
    assert scenario(KvtierOffloadingManager(num_chunks=2), True) == vllm
    # vLLM's own manager raises the same types (and keeps the half-applied pins).
    m = CPUOffloadingManager(num_chunks=2)
    ctx = ReqContext(req_id="a")
    store(m, [key(1)], ctx)
    with pytest.raises(AssertionError):
        m.prepare_load([key(1), key(3)], ctx)
    with pytest.raises(AssertionError):
        m.complete_load([key(2)], ctx)


# ----- known differences (docs/vllm.md) -----


def test_known_difference_a_store_offer_naming_a_key_twice_is_rejected():
    ctx = ReqContext(req_id="a")
    theirs = CPUOffloadingManager(num_chunks=4).prepare_store([key(1), key(1)], ctx)
    assert theirs.keys_to_store == [key(1), key(1)]  # two chunks for one key
    m = KvtierOffloadingManager(num_chunks=4)
    with pytest.raises(ValueError, match="repeats an earlier key"):
        m.prepare_store([key(1), key(1)], ReqContext(req_id="b"))
    assert m.lookup(key(1), ctx) is LookupResult.MISS


def test_known_difference_every_key_of_a_call_needs_a_position_or_none():
    ctx = ReqContext(req_id="a")
    ctx.set_offload_key_position(key(1), 16)
    keys = [key(1), key(2)]
    assert CPUOffloadingManager(num_chunks=4).prepare_store(keys, ctx) is not None
    m = KvtierOffloadingManager(num_chunks=4)
    with pytest.raises(ValueError, match="1 of 2 keys have no end-token position"):
        m.prepare_store(keys, ctx)


def test_a_position_of_none_is_no_position_as_in_vllm():
    # vLLM reads positions with dict.get, so a key whose position is None has none. Positions
    # given in reverse of the key order change which keys go first; None must not.
    def run(m, positions):
        evicted = []
        for r in range(4):
            ctx = ReqContext(req_id=str(r))
            keys = [key(10 * r + i) for i in range(3)]
            for k, p in zip(keys, positions):
                ctx.set_offload_key_position(k, p)
            m.on_new_request(ctx)
            evicted.append(store(m, keys, ctx).evicted_keys)
            m.on_request_finished(ctx)
        return evicted

    for policy in ("lru", "arc"):
        vllm = run(CPUOffloadingManager(num_chunks=4, cache_policy=policy), [None] * 3)
        reversed_ = run(CPUOffloadingManager(num_chunks=4, cache_policy=policy), [48, 32, 16])
        assert vllm != reversed_
        for positions in ([None] * 3, []):
            m = KvtierOffloadingManager(num_chunks=4, cache_policy=policy)
            assert run(m, positions) == vllm, (policy, positions)
        m = KvtierOffloadingManager(num_chunks=4, cache_policy=policy)
        assert run(m, [48, 32, 16]) == reversed_


def test_known_difference_no_store_after_on_request_finished_in_one_generation():
    def run(m):
        ctx = ReqContext(req_id="a")
        store(m, [key(1)], ctx)
        m.on_request_finished(ctx)
        return m.prepare_store([key(1)], ctx), ctx

    out, _ = run(CPUOffloadingManager(num_chunks=4))
    assert out.keys_to_store == []  # vLLM accepts keys the request already saw
    m = KvtierOffloadingManager(num_chunks=4)
    with pytest.raises(AssertionError, match="request has finished"):
        run(m)
    # After a reset the request starts afresh, in both.
    m2 = KvtierOffloadingManager(num_chunks=4)
    ctx = ReqContext(req_id="b")
    store(m2, [key(1)], ctx)
    m2.on_request_finished(ctx)
    m2.reset_cache()
    assert m2.prepare_store([key(1)], ctx).keys_to_store == [key(1)]


# ----- the spec -----


def _config(extra: dict, events: bool = False) -> OffloadingConfig:
    return OffloadingConfig(
        groups=(
            OffloadingGroupConfig(
                tokens_per_block=16, layer_names=("model.layers.0.attn",), group_id=0
            ),
        ),
        worker_kv_bytes_per_block=2 * 1024 * 1024,
        enable_kv_cache_events=events,
        extra_config=extra,
        engine_id="engine-0",
        model=OffloadingModelConfig(
            name="meta-llama/Llama-3.1-8B", dtype="bfloat16", max_model_len=8192
        ),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(
            rank=0,
            world_size=1,
            tp_size=1,
            pp_size=1,
            pcp_size=1,
            dcp_size=1,
            data_parallel_index=0,
            data_parallel_size=1,
            data_parallel_rank_local=None,
            is_parallelism_agnostic=True,
        ),
    )


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_the_spec_loads_through_vllms_factory_and_matches_cpu_offloading_spec(policy):
    # The kv_connector_extra_config of a server started with
    # --kv-transfer-config '{"kv_connector": "OffloadingConnector", ...}'.
    extra = {
        "spec_name": "KvtierOffloadingSpec",
        "spec_module_path": "kvtier.vllm",
        "cpu_bytes_to_use": 64 * 2 * 1024 * 1024 + 123,
        "eviction_policy": policy,
        "store_threshold": 2,
    }
    assert OffloadingSpecFactory.get_spec_cls(extra) is KvtierOffloadingSpec
    spec = OffloadingSpecFactory.create_spec(_config(extra, events=True))
    assert type(spec) is KvtierOffloadingSpec
    ours = spec.get_manager()
    assert type(ours) is KvtierOffloadingManager and spec.get_manager() is ours

    plain = {k: v for k, v in extra.items() if not k.startswith("spec_")}
    vspec = OffloadingSpecFactory.create_spec(_config(plain, events=True))
    assert type(vspec) is CPUOffloadingSpec
    theirs = vspec.get_manager()
    assert spec.num_chunks == vspec.num_chunks == 64
    assert ours.config_info() == theirs.config_info() != [{}]
    assert KvtierOffloadingSpec.build_metric_definitions(
        extra
    ) == CPUOffloadingSpec.build_metric_definitions(plain)

    # The same offers, twice each (store_threshold 2), with events on.
    for r in range(200):
        ctx = ReqContext(req_id=str(r))
        keys = [key((r * 7 + i) % 150) for i in range(5)]
        for i, k in enumerate(keys):
            ctx.set_offload_key_position(k, 16 * (i + 1))
        for m in (ours, theirs):
            m.on_new_request(ctx)
        hits = [ours.lookup(k, ctx) for k in keys]
        assert hits == [theirs.lookup(k, ctx) for k in keys]
        a, b = ours.prepare_store(keys, ctx), theirs.prepare_store(keys, ctx)
        assert (a is None) == (b is None)
        if a is not None:
            assert (a.keys_to_store, a.evicted_keys) == (b.keys_to_store, b.evicted_keys)
            assert a.store_spec.block_ids.tolist() == b.store_spec.block_ids.tolist()
            ours.complete_store(a.keys_to_store, ctx)
            theirs.complete_store(b.keys_to_store, ctx)
        for m in (ours, theirs):
            m.on_request_finished(ctx)
    assert list(ours.take_events()) == list(theirs.take_events())
    assert ours.get_stats().reduce() == theirs.get_stats().reduce()
