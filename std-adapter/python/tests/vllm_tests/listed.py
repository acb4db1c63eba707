"""What the two plugins that run vLLM's own tests against kvtier (``kvtier_in_vllm``,
``simple_in_vllm``) share: the not-applicable lists (``not_applicable.txt``,
``simple_not_applicable.txt``: one test id per line, two spaces, the reason; ``#`` starts a
comment line; a parametrized test's name without its parameters stands for all its cases),
the count of the kvtier objects a test built, the tally of a run, and the fixture that fails a
test during which a stub was used."""

from __future__ import annotations

import os

import pytest

import vllm_stubs


def read_not_applicable(path: str) -> dict[str, str]:
    """The list at ``path``: test id -> reason (a line without a reason is a usage error)."""
    out: dict[str, str] = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            test, sep, reason = line.partition("  ")
            if not sep or not reason.strip():
                raise pytest.UsageError(f"{path}: no reason given for {test!r}")
            out[test] = reason.strip()
    return out


def count_inits(cls: type, built: list[int]) -> None:
    """Makes every construction of ``cls`` add one to ``built[0]``."""
    init = cls.__init__

    def counting_init(self, *args, **kwargs):
        built[0] += 1
        init(self, *args, **kwargs)

    cls.__init__ = counting_init  # type: ignore[method-assign]


class Tally:
    """Marks the listed tests of a run of vLLM's tests under ``folder`` (``"skip"``: skipped;
    ``"xfail"``: expected to fail, not strict, counted apart whatever they do; ``None``: left
    as they are), counts the tests passed, those of them during which a kvtier object was
    built (``built``), the failed and the not applicable ones, and fails a whole run whose
    list names a test that was not collected (the list is kept exact). Its subclass prints
    the summary (``summary``)."""

    def __init__(self, list_path: str, folder: str, built: list[int], mark: str | None):
        self.list_name = os.path.basename(list_path)
        self.listed = read_not_applicable(list_path)
        self.folder = folder
        self.built = built
        self.mark = mark
        self.counts_xfail = mark == "xfail"
        self.matched: set[str] = set()
        self.passed = 0
        self.passed_kvtier = 0
        self.failed: list[str] = []
        self.not_applicable = 0
        self.not_applicable_passed = 0
        self._built_before: dict[str, int] = {}

    def _name(self, nodeid: str) -> str:
        # Relative to vLLM's tests/ folder's parent: tests/v1/...
        i = nodeid.find(self.folder)
        return nodeid[i:] if i >= 0 else nodeid

    @pytest.hookimpl
    def pytest_collection_modifyitems(self, config, items) -> None:
        for item in items:
            name = self._name(item.nodeid)
            parts = name.split("[", 1)[0].split("::")
            # The test itself, then its class, then its file.
            keys = [name] + ["::".join(parts[:n]) for n in range(len(parts), 0, -1)]
            for key in keys:
                if key in self.listed:
                    self.matched.add(key)
                    reason = f"not applicable: {self.listed[key]}"
                    if self.mark == "skip":
                        item.add_marker(pytest.mark.skip(reason=reason))
                    elif self.mark == "xfail":
                        item.add_marker(pytest.mark.xfail(reason=reason, strict=False))
                    break

    @pytest.hookimpl
    def pytest_runtest_setup(self, item) -> None:
        self._built_before[item.nodeid] = self.built[0]

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report) -> None:
        if self.counts_xfail and hasattr(report, "wasxfail"):
            if report.when == "call" or report.skipped:
                self.not_applicable += 1
                if report.passed:
                    self.not_applicable_passed += 1
        elif self.mark == "skip" and report.when == "setup" and report.skipped:
            self.not_applicable += 1
        elif report.failed:
            if report.nodeid not in self.failed:
                self.failed.append(report.nodeid)
        elif report.when == "call" and report.passed:
            self.passed += 1
            if self.built[0] > self._built_before.get(report.nodeid, self.built[0]):
                self.passed_kvtier += 1

    @pytest.hookimpl
    def pytest_sessionfinish(self, session, exitstatus) -> None:
        stale = sorted(set(self.listed) - self.matched)
        if stale and session.config.option.keyword == "":
            session.config._kvtier_stale = stale  # type: ignore[attr-defined]
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def summary(self) -> tuple[str, str]:
        """The summary's title and its line of counts."""
        raise NotImplementedError

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter) -> None:
        tr = terminalreporter
        title, counts = self.summary()
        tr.write_sep("=", title)
        tr.write_line(counts)
        for nodeid in self.failed:
            tr.write_line(f"FAILED {nodeid}")
        for test in getattr(tr.config, "_kvtier_stale", []):
            tr.write_line(f"{self.list_name} names a test that was not collected: {test}")


@pytest.fixture(autouse=True)
def no_stub_touched():
    """Fails a test during which any stub was used."""
    with vllm_stubs.watching() as touched:
        yield
    assert not touched, f"the test touched stubbed modules: {sorted(set(touched))}"
