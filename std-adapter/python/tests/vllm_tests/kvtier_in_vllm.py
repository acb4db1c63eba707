"""A pytest plugin that runs vLLM 0.33.0's own offloading tests against kvtier.

    pytest -p kvtier_in_vllm --confcutdir=T/tests/v1/kv_offload T/tests/v1/kv_offload/cpu/...

(``run.sh`` runs it; ``fetch.py`` puts vLLM's test files in T, unchanged.) It imports vLLM's
offloading modules torch-free (``vllm_stubs``; a test during which a stub is used fails) and
makes the name ``CPUOffloadingManager`` in vLLM's manager and spec modules resolve to
``kvtier.vllm.KvtierOffloadingManager`` before vLLM's test files import it, so that every
manager those tests build is kvtier's.

Tests that read or patch vLLM's private internals (``_policy``, ``ChunkStatus``, the ARC
policy's lists, a monkeypatched private method), or that run no manager at all but vLLM's own
policy classes or worker code, are listed in ``not_applicable.txt``, one per line with its
reason; they are not run. Every other test must pass. A listed test that is not collected is an
error (the list is kept exact). The summary prints the counts: passed (and how many of them
built a kvtier manager), failed, not applicable.
"""

from __future__ import annotations

import os

import pytest

import vllm_stubs

vllm_stubs.install()

# vLLM's tiering manager subclasses vLLM's CPUOffloadingManager: imported first, it keeps
# vLLM's class as its base (the tiering tier is vLLM's own, not what kvtier replaces).
import vllm.v1.kv_offload.cpu.manager as _vllm_manager  # noqa: E402
import vllm.v1.kv_offload.cpu.spec as _vllm_spec  # noqa: E402
import vllm.v1.kv_offload.tiering.manager  # noqa: E402,F401

from kvtier.vllm import KvtierOffloadingManager  # noqa: E402

from listed import Tally, count_inits  # noqa: E402
from listed import no_stub_touched as _no_stub_touched  # noqa: E402,F401

_LIST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "not_applicable.txt")

_built: list[int] = [0]
count_inits(KvtierOffloadingManager, _built)
_vllm_manager.CPUOffloadingManager = KvtierOffloadingManager  # type: ignore[misc]
_vllm_spec.CPUOffloadingManager = KvtierOffloadingManager  # type: ignore[attr-defined]


class _Tally(Tally):
    def __init__(self) -> None:
        super().__init__(_LIST, "tests/v1/kv_offload/", _built, "skip")

    def summary(self) -> tuple[str, str]:
        return (
            "vLLM 0.33.0's own tests against KvtierOffloadingManager",
            f"{self.passed} passed ({self.passed_kvtier} of them on a kvtier manager), "
            f"{len(self.failed)} failed, {self.not_applicable} not applicable "
            f"({self.list_name})",
        )


def pytest_configure(config) -> None:
    # A marker vLLM's root conftest (not loaded here) registers.
    config.addinivalue_line("markers", "skip_global_cleanup: vLLM's own marker")
    config.pluginmanager.register(_Tally(), "kvtier_tally")
