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
configuration outside kvtier's scope: one full-attention group) are marked xfail (not strict)
with their reason and counted apart; every other test must pass. A listed
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

from listed import read_not_applicable  # noqa: E402

_LIST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "simple_not_applicable.txt")
_built: list[int] = [0]

if MODE == "kvtier":
    from kvtier.simple import SimpleCPUOffloadScheduler as _Kvtier  # noqa: E402

    _kvtier_init = _Kvtier.__init__

    def _counting_init(self, *args, **kwargs):
        _built[0] += 1
        _kvtier_init(self, *args, **kwargs)

    _Kvtier.__init__ = _counting_init  # type: ignore[method-assign]
    _vllm_manager.SimpleCPUOffloadScheduler = _Kvtier  # type: ignore[misc]
    _connector.SimpleCPUOffloadScheduler = _Kvtier  # type: ignore[attr-defined]


def _not_applicable() -> dict[str, str]:
    return read_not_applicable(_LIST)


class _Tally:
    def __init__(self) -> None:
        self.listed = _not_applicable()
        self.matched: set[str] = set()
        self.passed = 0
        self.passed_kvtier = 0
        self.failed: list[str] = []
        self.not_applicable = 0
        self.not_applicable_passed = 0
        self._built_before: dict[str, int] = {}

    @staticmethod
    def _name(nodeid: str) -> str:
        i = nodeid.find("tests/v1/simple_kv_offload/")
        return nodeid[i:] if i >= 0 else nodeid

    @pytest.hookimpl
    def pytest_collection_modifyitems(self, config, items) -> None:
        for item in items:
            name = self._name(item.nodeid)
            parts = name.split("[", 1)[0].split("::")
            keys = [name] + ["::".join(parts[:n]) for n in range(len(parts), 0, -1)]
            for key in keys:
                if key in self.listed:
                    self.matched.add(key)
                    if MODE == "kvtier":
                        item.add_marker(
                            pytest.mark.xfail(
                                reason=f"not applicable: {self.listed[key]}", strict=False
                            )
                        )
                    break

    @pytest.hookimpl
    def pytest_runtest_setup(self, item) -> None:
        self._built_before[item.nodeid] = _built[0]

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report) -> None:
        if hasattr(report, "wasxfail"):
            if report.when == "call" or report.skipped:
                self.not_applicable += 1
                if report.passed:
                    self.not_applicable_passed += 1
        elif report.failed:
            if report.nodeid not in self.failed:
                self.failed.append(report.nodeid)
        elif report.when == "call" and report.passed:
            self.passed += 1
            if _built[0] > self._built_before.get(report.nodeid, _built[0]):
                self.passed_kvtier += 1

    @pytest.hookimpl
    def pytest_sessionfinish(self, session, exitstatus) -> None:
        stale = sorted(set(self.listed) - self.matched)
        if stale and session.config.option.keyword == "":
            session.config._kvtier_stale = stale  # type: ignore[attr-defined]
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter) -> None:
        tr = terminalreporter
        who = (
            "kvtier.simple.SimpleCPUOffloadScheduler"
            if MODE == "kvtier"
            else "vLLM's own SimpleCPUOffloadScheduler (the harness alone)"
        )
        tr.write_sep("=", f"vLLM 0.33.0's simple-offloader tests against {who}")
        built = f" ({self.passed_kvtier} of them on a kvtier scheduler)" if MODE == "kvtier" else ""
        tr.write_line(
            f"{self.passed} passed{built}, {len(self.failed)} failed, "
            f"{self.not_applicable} not applicable (simple_not_applicable.txt; "
            f"{self.not_applicable_passed} of them happened to pass, not counted as passed)"
            if MODE == "kvtier"
            else f"{self.passed} passed, {len(self.failed)} failed"
        )
        for nodeid in self.failed:
            tr.write_line(f"FAILED {nodeid}")
        for test in getattr(tr.config, "_kvtier_stale", []):
            tr.write_line(
                f"simple_not_applicable.txt names a test that was not collected: {test}"
            )


@pytest.fixture(autouse=True)
def _no_stub_touched():
    """Fails a test during which any stub was used."""
    with vllm_stubs.watching() as touched:
        yield
    assert not touched, f"the test touched stubbed modules: {sorted(set(touched))}"


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
