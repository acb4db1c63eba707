"""Imports vLLM 0.33.0's pure-Python offloading modules without torch or a GPU.

vLLM's package ``__init__`` files pull in torch, CUDA and the whole engine. The scheduler-side
offloading code (``vllm.v1.kv_offload``, the connector's stats) needs none of it at run time:
torch and a few engine modules appear there only in type annotations, class bodies and
worker-side code paths. A meta-path finder (``install()``) therefore

- loads the heavy *packages* listed in ``_HOLLOW_PACKAGES`` as empty packages (their
  submodules import from the real files; their ``__init__`` does not run), and
- replaces the modules listed in ``_STUBS`` by stubs whose every attribute is a placeholder,
  except the few answers in ``_ANSWERS``: vLLM's log helpers ask whether this process is the
  first rank before a once-only log line (the out-of-tree spec warning); a test process is the
  only rank.

Every use of a placeholder is recorded. Uses while vLLM's modules are imported are expected;
``watching()`` collects the uses of one test, so that the suites' autouse fixtures fail any
test during which a stub is touched, and no test result can rest on a placeholder.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Iterator

_HOLLOW_PACKAGES = {
    "vllm",
    "vllm.v1",
    "vllm.utils",
    "vllm.distributed",
    "vllm.distributed.kv_transfer",
    "vllm.distributed.kv_transfer.kv_connector",
    "vllm.distributed.kv_transfer.kv_connector.v1",
    "vllm.distributed.kv_transfer.kv_connector.v1.offloading",
}

_STUBS = {
    "torch",
    "prometheus_client",
    "vllm.config",
    "vllm.platforms",
    "vllm.distributed.kv_transfer.kv_connector.factory",
    "vllm.distributed.device_communicators",
    "vllm.v1.kv_offload.cpu.gpu_worker",
    "vllm.v1.kv_offload.cpu.host_register",
    "vllm.distributed.parallel_state",
    # vLLM's simple offloader (vllm.v1.simple_kv_offload, vllm.v1.core.block_pool):
    "vllm.multimodal",
    "vllm.model_executor",
    "vllm.utils.torch_utils",
    "vllm.forward_context",
    "vllm.v1.attention.backends.registry",
    "vllm.v1.request",
    "vllm.v1.metrics.perf",
    "vllm.v1.utils",
}

_ANSWERS = {
    "vllm.distributed.parallel_state.is_local_first_rank": lambda: True,
    "vllm.distributed.parallel_state.is_global_first_rank": lambda: True,
}

# Stub uses recorded while a test runs (names of the placeholders touched).
_TOUCHED: list[str] = []
_GUARD = {"active": False}


def _touch(name: str) -> None:
    if _GUARD["active"]:
        _TOUCHED.append(name)


class _Placeholder:
    """Stands for anything a stub module is asked for; records each use."""

    def __init__(self, name: str):
        object.__setattr__(self, "_name", name)

    def __getattr__(self, attr: str) -> _Placeholder:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        _touch(f"{self._name}.{attr}")
        return _Placeholder(f"{self._name}.{attr}")

    def __call__(self, *args, **kwargs) -> _Placeholder:
        _touch(f"{self._name}()")
        return _Placeholder(f"{self._name}()")

    def __getitem__(self, item) -> _Placeholder:
        _touch(f"{self._name}[]")
        return self

    def __or__(self, other) -> _Placeholder:
        _touch(f"{self._name} |")
        return self

    __ror__ = __or__

    def __mro_entries__(self, bases):
        _touch(f"class(... {self._name} ...)")
        return (object,)

    def __bool__(self) -> bool:
        _touch(f"bool({self._name})")
        return False

    def __repr__(self) -> str:
        return f"<stub {self._name}>"


class _StubModule(types.ModuleType):
    def __getattr__(self, attr: str):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        name = f"{self.__name__}.{attr}"
        if name in _ANSWERS:
            return _ANSWERS[name]
        _touch(name)
        return _Placeholder(name)


class _StubLoader(importlib.abc.Loader):
    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []  # a package, so that submodules resolve to stubs too
        return module

    def exec_module(self, module) -> None:
        return None


class _HollowLoader(importlib.abc.Loader):
    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        return None


def _stubbed(fullname: str) -> bool:
    return any(fullname == s or fullname.startswith(s + ".") for s in _STUBS)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if _stubbed(fullname):
            return importlib.machinery.ModuleSpec(
                fullname, _StubLoader(), is_package=True
            )
        if fullname in _HOLLOW_PACKAGES:
            real = importlib.machinery.PathFinder.find_spec(fullname, path)
            if real is None:
                return None
            spec = importlib.machinery.ModuleSpec(
                fullname, _HollowLoader(), is_package=True
            )
            spec.submodule_search_locations = list(real.submodule_search_locations)
            return spec
        return None


def install() -> None:
    """Puts the finder first on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


@contextlib.contextmanager
def watching() -> Iterator[list[str]]:
    """Records the stub uses made inside the block, in the list it yields."""
    _TOUCHED.clear()
    _GUARD["active"] = True
    try:
        yield _TOUCHED
    finally:
        _GUARD["active"] = False
