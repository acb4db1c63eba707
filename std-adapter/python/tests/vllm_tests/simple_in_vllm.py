"""A pytest plugin that runs vLLM 0.33.0's own simple-offloader scheduler tests against kvtier.

    pytest -p simple_in_vllm --confcutdir=T/tests/v1/simple_kv_offload \\
        T/tests/v1/simple_kv_offload/test_scheduler.py

(``run.sh`` runs it; ``fetch.py`` puts vLLM's test files in T, unchanged.) vLLM's modules are
imported torch-free (``vllm_stubs``; a test during which a stub is used fails). With
``KVTIER_SIMPLE=kvtier`` (the default) the name ``SimpleCPUOffloadScheduler`` in vLLM's
``vllm.v1.simple_kv_offload.manager`` and in vLLM's ``SimpleCPUOffloadConnector`` module
resolves to ``kvtier.simple.SimpleCPUOffloadScheduler`` before vLLM's test file imports it, so
that every scheduler those tests build, directly or through the connector, is kvtier's. With
``KVTIER_SIMPLE=vllm`` nothing is replaced: vLLM's own class runs, which shows what the
torch-free harness itself lets pass.

vLLM's helper ``simulate_store_completion`` reads the private ``_expected_worker_count`` (the
world size) to report a store done by every worker; kvtier's class keeps that attribute, so
the tests using the helper are not counted as reading private state. Against kvtier, the
tests listed in ``simple_not_applicable.txt`` (reading vLLM's private attributes, or a
configuration outside kvtier's scope: fine-grained hits or EAGLE's block drop, or filling the
CPU pool through vLLM's BlockPool methods kvtier's pool does not offer) are marked xfail (not
strict) with their reason and counted apart; every other test must pass. A listed
test that is not collected is an error (the list is kept exact). The summary prints the counts:
passed (and how many of them built a kvtier scheduler), failed, not applicable.
"""

from __future__ import annotations

import logging
import os

import pytest

import vllm_stubs

vllm_stubs.install()

MODE = os.environ.get("KVTIER_SIMPLE", "kvtier")
if MODE not in ("kvtier", "vllm"):
    raise pytest.UsageError(f"KVTIER_SIMPLE must be kvtier or vllm, not {MODE!r}")

from vllm.distributed.kv_transfer.kv_connector.v1 import (  # noqa: E402
    simple_cpu_offload_connector as _connector,
)
import vllm.v1.simple_kv_offload.manager as _vllm_manager  # noqa: E402

from listed import Tally, count_inits  # noqa: E402
from listed import no_stub_touched as _no_stub_touched  # noqa: E402,F401

_LIST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "simple_not_applicable.txt")
_built: list[int] = [0]

if MODE == "kvtier":
    from kvtier.simple import SimpleCPUOffloadScheduler as _Kvtier  # noqa: E402

    count_inits(_Kvtier, _built)
    _vllm_manager.SimpleCPUOffloadScheduler = _Kvtier  # type: ignore[misc]
    _connector.SimpleCPUOffloadScheduler = _Kvtier  # type: ignore[attr-defined]


class _Tally(Tally):
    def __init__(self) -> None:
        super().__init__(
            _LIST, "tests/v1/simple_kv_offload/", _built, "xfail" if MODE == "kvtier" else None
        )
        # vLLM's own class runs with nothing marked, and any xfail of vLLM's own is counted
        # apart all the same.
        self.counts_xfail = True

    def summary(self) -> tuple[str, str]:
        if MODE != "kvtier":
            return (
                "vLLM 0.33.0's simple-offloader tests against vLLM's own "
                "SimpleCPUOffloadScheduler (the harness alone)",
                f"{self.passed} passed, {len(self.failed)} failed",
            )
        return (
            "vLLM 0.33.0's simple-offloader tests against kvtier.simple.SimpleCPUOffloadScheduler",
            f"{self.passed} passed ({self.passed_kvtier} of them on a kvtier scheduler), "
            f"{len(self.failed)} failed, {self.not_applicable} not applicable ({self.list_name}; "
            f"{self.not_applicable_passed} of them happened to pass, not counted as passed)",
        )


@pytest.fixture()
def caplog_vllm(caplog):
    """``caplog`` seeing vLLM's log records (vLLM's root conftest, not loaded here, has its
    own): the ``vllm`` logger propagates to the root logger while the test runs."""
    logger = logging.getLogger("vllm")
    before = logger.propagate
    logger.propagate = True
    try:
        with caplog.at_level(logging.INFO):
            yield caplog
    finally:
        logger.propagate = before


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "skip_global_cleanup: vLLM's own marker")
    config.pluginmanager.register(_Tally(), "kvtier_simple_tally")
