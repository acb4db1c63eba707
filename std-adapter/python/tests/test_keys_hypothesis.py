"""Keys of any length and shape: kvtier tells them apart exactly as vLLM's dicts do."""

from hypothesis import given, settings
from hypothesis import strategies as st
from vllm.v1.kv_offload.base import ReqContext
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

from kvtier.vllm import KvtierOffloadingManager

# Keys that agree on their first 16 and last 4 bytes and differ in between stress identity.
_base = st.binary(min_size=0, max_size=40)
_twin = st.tuples(st.binary(min_size=16, max_size=16), st.binary(min_size=1, max_size=8)).map(
    lambda t: t[0] + t[1] + b"\x00\x00\x00\x01"
)
_keys = st.lists(st.one_of(_base, _twin), min_size=1, max_size=12, unique=True)
_ops = st.lists(
    st.tuples(st.sampled_from(["store", "touch", "fail"]), st.lists(st.integers(0, 11), max_size=4)),
    max_size=25,
)


@settings(max_examples=300, deadline=None)
@given(keys=_keys, ops=_ops, capacity=st.integers(0, 6), policy=st.sampled_from(["lru", "arc"]))
def test_any_bytes_keys_behave_as_in_vllm(keys, ops, capacity, policy):
    ms = [
        CPUOffloadingManager(num_chunks=capacity, cache_policy=policy),
        KvtierOffloadingManager(num_chunks=capacity, cache_policy=policy),
    ]
    for n, (op, idx) in enumerate(ops):
        chosen = list(dict.fromkeys(keys[i % len(keys)] for i in idx))
        ctx = ReqContext(req_id=str(n))
        if op == "touch":
            for m in ms:
                m.touch(chosen, ctx)
        else:
            outs = [m.prepare_store(chosen, ctx) for m in ms]
            assert (outs[0] is None) == (outs[1] is None)
            if outs[0] is not None:
                assert outs[0].keys_to_store == outs[1].keys_to_store
                assert outs[0].evicted_keys == outs[1].evicted_keys
                for m, out in zip(ms, outs):
                    m.complete_store(out.keys_to_store, ctx, op == "store")
        for m in ms:
            m.on_request_finished(ctx)
        probe = ReqContext(req_id="probe")
        assert [ms[0].lookup(k, probe) for k in keys] == [ms[1].lookup(k, probe) for k in keys]
