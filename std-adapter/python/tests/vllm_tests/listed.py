"""Reads a not-applicable list of vLLM's tests (``not_applicable.txt``,
``simple_not_applicable.txt``): one test id per line, two spaces, the reason; ``#`` starts a
comment line. A parametrized test's name without its parameters stands for all its cases."""

from __future__ import annotations

import pytest


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
