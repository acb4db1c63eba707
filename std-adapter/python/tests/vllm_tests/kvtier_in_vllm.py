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

from listed import read_not_applicable  # noqa: E402

_LIST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "not_applicable.txt")

_built: list[int] = [0]
_kvtier_init = KvtierOffloadingManager.__init__


def _counting_init(self, *args, **kwargs):
    _built[0] += 1
    _kvtier_init(self, *args, **kwargs)


KvtierOffloadingManager.__init__ = _counting_init  # type: ignore[method-assign]
_vllm_manager.CPUOffloadingManager = KvtierOffloadingManager  # type: ignore[misc]
_vllm_spec.CPUOffloadingManager = KvtierOffloadingManager  # type: ignore[attr-defined]


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
        self._built_before: dict[str, int] = {}

    @staticmethod
    def _name(nodeid: str) -> str:
        # Relative to vLLM's tests/ folder's parent: tests/v1/kv_offload/...
        i = nodeid.find("tests/v1/kv_offload/")
        return nodeid[i:] if i >= 0 else nodeid

    @pytest.hookimpl
    def pytest_collection_modifyitems(self, config, items) -> None:
        for item in items:
            name = self._name(item.nodeid)
            base = name.split("[", 1)[0]
            parts = base.split("::")
            # The test itself, then its class, then its file.
            keys = [name] + ["::".join(parts[:n]) for n in range(len(parts), 0, -1)]
            for key in keys:
                if key in self.listed:
                    self.matched.add(key)
                    item.add_marker(
                        pytest.mark.skip(reason=f"not applicable: {self.listed[key]}")
                    )
                    break

    @pytest.hookimpl
    def pytest_runtest_setup(self, item) -> None:
        self._built_before[item.nodeid] = _built[0]

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report) -> None:
        if report.when == "setup" and report.skipped:
            self.not_applicable += 1
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
        tr.write_sep("=", "vLLM 0.33.0's own tests against KvtierOffloadingManager")
        tr.write_line(
            f"{self.passed} passed ({self.passed_kvtier} of them on a kvtier manager), "
            f"{len(self.failed)} failed, {self.not_applicable} not applicable "
            f"(not_applicable.txt)"
        )
        for nodeid in self.failed:
            tr.write_line(f"FAILED {nodeid}")
        for test in getattr(tr.config, "_kvtier_stale", []):
            tr.write_line(f"not_applicable.txt names a test that was not collected: {test}")


@pytest.fixture(autouse=True)
def _no_stub_touched():
    """Fails a test during which any stub was used."""
    with vllm_stubs.watching() as touched:
        yield
    assert not touched, f"the test touched stubbed modules: {sorted(set(touched))}"


def pytest_configure(config) -> None:
    # A marker vLLM's root conftest (not loaded here) registers.
    config.addinivalue_line("markers", "skip_global_cleanup: vLLM's own marker")
    config.pluginmanager.register(_Tally(), "kvtier_tally")
