"""The suite's vLLM: vLLM 0.33.0's real offloading modules, imported torch-free through
``vllm_stubs`` (see there); a test during which any stub is used fails."""

from __future__ import annotations

import pytest

import vllm_stubs

vllm_stubs.install()


@pytest.fixture(autouse=True)
def _no_stub_touched():
    """Fails a test during which any stub was used."""
    with vllm_stubs.watching() as touched:
        yield
    assert not touched, f"the test touched stubbed modules: {sorted(set(touched))}"


# vLLM's modules the tests use, imported now (stub uses during these imports are expected).
import vllm.v1.kv_offload.cpu.manager  # noqa: E402,F401
import vllm.v1.kv_offload.cpu.spec  # noqa: E402,F401
import vllm.v1.kv_offload.factory  # noqa: E402,F401

import kvtier.vllm  # noqa: E402,F401
