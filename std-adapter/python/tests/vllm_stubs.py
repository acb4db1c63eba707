"""Imports vLLM 0.33.0's pure-Python offloading modules without torch or a GPU.

vLLM's package ``__init__`` files pull in torch, CUDA and the whole engine. The scheduler-side
offloading code (``vllm.v1.kv_offload``, the connector's stats) needs none of it at run time:
torch and a few engine modules appear there only in type annotations, class bodies and
worker-side code paths. A meta-path finder (``install()``) therefore

- loads the heavy *packages* listed in ``_HOLLOW_PACKAGES`` as empty packages (their
  submodules import from the real files; their ``__init__`` does not run),
- replaces the modules listed in ``_STUBS`` by stubs whose every attribute is a placeholder,
  except the few answers in ``_ANSWERS``: vLLM's log helpers ask whether this process is the
  first rank before a once-only log line (the out-of-tree spec warning); a test process is the
  only rank. For the simple offloader's engine types (Request, the block pool, the KV cache
  specs) torch's dtypes are values with their element sizes (``torch.tensor([], dtype=d)``
  answers ``element_size()``), and ``current_platform`` answers its device type and the no-op
  hook that registers a platform's own KV cache specs;
- replaces ``vllm.config`` by a namespace of vLLM's torch-free config classes and small
  records for the others (see ``_config_namespace``), and lets a hollow package re-export
  the few names vLLM's ``__init__`` would (``_REEXPORTS``).

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
    "vllm.distributed",
    "vllm.distributed.kv_transfer",
    "vllm.distributed.kv_transfer.kv_connector",
    "vllm.distributed.kv_transfer.kv_connector.v1",
    "vllm.distributed.kv_transfer.kv_connector.v1.offloading",
    # The simple offloader's scheduler side and the engine types its tests build.
    "vllm.v1.core",
    "vllm.v1.core.sched",
    "vllm.v1.simple_kv_offload",
    "vllm.v1.metrics",
    "vllm.v1.attention",
    "vllm.multimodal",
    "vllm.v1.structured_output",
}

_STUBS = {
    "torch",
    "prometheus_client",
    "vllm.platforms",
    "vllm.distributed.kv_transfer.kv_connector.factory",
    "vllm.distributed.device_communicators",
    "vllm.v1.kv_offload.cpu.gpu_worker",
    "vllm.v1.kv_offload.cpu.host_register",
    "vllm.distributed.parallel_state",
    # Imported by the engine types (Request, SamplingParams, the KV cache specs) for
    # multimodal inputs, tokenizers and model execution, none of which the scheduler side runs.
    "PIL",
    "pybase64",
    "transformers",
    "vllm.tokenizers",
    "vllm.multimodal.media",
    "vllm.model_executor",
    "vllm.v1.attention.backend",
    "vllm.forward_context",
    "uvloop",
    "vllm.usage",
}

class _DType:
    """A torch dtype as a value: its name and element size (all that vLLM's KV cache specs
    and the simple offloader's sizing read from one)."""

    def __init__(self, name: str, itemsize: int, floating: bool):
        self.name = name
        self.itemsize = itemsize
        self.is_floating_point = floating
        self.is_complex = False

    def __repr__(self) -> str:
        return f"torch.{self.name}"


_DTYPES = {
    name: _DType(name, size, floating)
    for name, size, floating in [
        ("float16", 2, True),
        ("bfloat16", 2, True),
        ("float32", 4, True),
        ("float64", 8, True),
        ("float8_e4m3fn", 1, True),
        ("float8_e5m2", 1, True),
        ("uint8", 1, False),
        ("int8", 1, False),
        ("int32", 4, False),
        ("int64", 8, False),
        ("bool", 1, False),
    ]
}
_DTYPES["half"] = _DTYPES["float16"]
_DTYPES["float"] = _DTYPES["float32"]


class _EmptyTensor:
    """``torch.tensor([], dtype=d)``: vLLM's ``get_dtype_size`` asks it its element size."""

    def __init__(self, dtype: _DType):
        self.dtype = dtype

    def element_size(self) -> int:
        return self.dtype.itemsize


def _tensor(data, dtype=None):
    if list(data) != [] or not isinstance(dtype, _DType):
        _touch("torch.tensor(non-empty)")
        return _Placeholder("torch.tensor()")
    return _EmptyTensor(dtype)


_ANSWERS = {
    "vllm.platforms.current_platform": None,  # set below, once _Placeholder exists
    "vllm.distributed.parallel_state.is_local_first_rank": lambda: True,
    "vllm.distributed.parallel_state.is_global_first_rank": lambda: True,
    "torch.dtype": _DType,
    "torch.tensor": _tensor,
    **{f"torch.{name}": dtype for name, dtype in _DTYPES.items()},
}

# Module attributes a stub holds as plain values (dunder names, which a stub never answers).
_DUNDERS = {"torch": {"__version__": "2.14.0"}}

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


class _Platform(_Placeholder):
    """``vllm.platforms.current_platform``: answers only its device type (what
    ``KVTransferConfig``'s default ``kv_buffer_device`` reads; a GPU run's is "cuda") and the
    hook registering a platform's own KV cache specs, which no vLLM platform but a plugin's
    fills (``register_all_kvcache_specs`` calls it)."""

    device_type = "cuda"

    @staticmethod
    def register_custom_kv_cache_specs(vllm_config) -> None:
        return None


_ANSWERS["vllm.platforms.current_platform"] = _Platform("vllm.platforms.current_platform")


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
        for attr, value in _DUNDERS.get(spec.name, {}).items():
            setattr(module, attr, value)
        return module

    def exec_module(self, module) -> None:
        return None


# Names a hollow package re-exports from its real submodule (as vLLM's ``__init__`` does,
# lazily): ``from vllm import SamplingParams``.
_REEXPORTS = {
    "vllm": {"SamplingParams": "vllm.sampling_params"},
    "vllm.distributed.kv_transfer.kv_connector.v1": {
        "KVConnectorRole": "vllm.distributed.kv_transfer.kv_connector.v1.base",
    },
}


class _HollowLoader(importlib.abc.Loader):
    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        names = _REEXPORTS.get(module.__name__)
        if names:

            def __getattr__(attr: str, _names=names, _package=module.__name__):
                if attr in _names:
                    import importlib

                    return getattr(importlib.import_module(_names[attr]), attr)
                raise AttributeError(f"module {_package!r} has no attribute {attr!r}")

            module.__getattr__ = __getattr__


# ``vllm.config``'s ``__init__`` imports every config module, among them the model and engine
# configs, which need torch, transformers and the model's files from the Hugging Face hub. The
# package is therefore replaced by ``_config_namespace()``: the config classes that import
# torch-free are vLLM's own (from their real submodules, which stay importable);
# ``ModelConfig``, ``DeviceConfig``, ``ParallelConfig``, ``SpeculativeConfig`` and
# ``VllmConfig`` are ``_Lite`` records of their constructor arguments plus the few derived
# values vLLM's scheduler side reads. Reading any other attribute of a record is a stub use
# (the test fails). Other names asked of ``vllm.config`` are placeholders.
_REAL_CONFIGS = {
    "vllm.config.cache": ["CacheConfig"],
    "vllm.config.kv_events": ["KVEventsConfig"],
    "vllm.config.kv_transfer": ["KVTransferConfig"],
    "vllm.config.load": ["LoadConfig"],
    "vllm.config.scheduler": ["SchedulerConfig"],
}


class _Lite:
    """A config record: constructor arguments over defaults; other attribute reads are
    recorded as stub uses."""

    _DEFAULTS: dict = {}

    def __init__(self, *args, **kwargs):
        if args:
            kwargs = {self._POSITIONAL: args[0], **kwargs}  # type: ignore[attr-defined]
        values = dict(self._DEFAULTS)
        values.update(kwargs)
        for key, value in values.items():
            object.__setattr__(self, key, value)

    def __getattr__(self, attr: str):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        name = f"{type(self).__name__}.{attr}"
        _touch(name)
        return _Placeholder(name)


def _config_namespace(module: types.ModuleType) -> None:
    import importlib

    for sub, names in _REAL_CONFIGS.items():
        real = importlib.import_module(sub)
        for name in names:
            setattr(module, name, getattr(real, name))

    class ModelConfig(_Lite):
        """Model settings; ``max_model_len`` defaults to facebook/opt-125m's context (its
        ``max_position_embeddings``, 2048), which vLLM would read from the hub."""

        _DEFAULTS = {"max_model_len": 2048}
        _POSITIONAL = "model"

    class SpeculativeConfig(_Lite):
        """Speculative decoding settings (the tests replace it by a ``Mock``)."""

        _POSITIONAL = "method"

        def use_eagle(self) -> bool:
            _touch("SpeculativeConfig.use_eagle()")
            return False

        def use_eagle_block_drop(self) -> bool:
            _touch("SpeculativeConfig.use_eagle_block_drop()")
            return False

        def use_multi_module_mtp(self) -> bool:
            _touch("SpeculativeConfig.use_multi_module_mtp()")
            return False

    class ParallelConfig(_Lite):
        """Parallelism sizes (vLLM's validation imports the executors and the platform);
        ``world_size`` is pipeline x tensor x prefill-context parallel, as vLLM derives it."""

        _DEFAULTS = {
            "pipeline_parallel_size": 1,
            "tensor_parallel_size": 1,
            "prefill_context_parallel_size": 1,
            "decode_context_parallel_size": 1,
            "data_parallel_size": 1,
        }
        _POSITIONAL = "pipeline_parallel_size"

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.world_size = (
                self.pipeline_parallel_size
                * self.tensor_parallel_size
                * self.prefill_context_parallel_size
            )

    module.ParallelConfig = ParallelConfig

    class DeviceConfig(_Lite):
        """The device name (vLLM's resolves it through the platform layer and torch)."""

        _DEFAULTS = {"device": "auto"}
        _POSITIONAL = "device"

    module.DeviceConfig = DeviceConfig
    parallel_config_cls = ParallelConfig
    cache_config_cls = module.CacheConfig
    scheduler_config_cls = module.SchedulerConfig
    device_config_cls = DeviceConfig

    class VllmConfig(_Lite):
        """The engine's configuration: its parts, vLLM's defaults for the parts not given
        (``ParallelConfig()``, ``CacheConfig()``, no KV events, no speculative decoding)."""

        _POSITIONAL = "model_config"

        def __init__(self, *args, **kwargs):
            defaults = {
                "model_config": None,
                "cache_config": None,
                "parallel_config": None,
                "scheduler_config": None,
                "device_config": None,
                "speculative_config": None,
                "kv_transfer_config": None,
                "kv_events_config": None,
            }
            super().__init__(*args, **{**defaults, **kwargs})
            if self.cache_config is None:
                self.cache_config = cache_config_cls()
            if self.parallel_config is None:
                self.parallel_config = parallel_config_cls()
            if self.scheduler_config is None:
                self.scheduler_config = scheduler_config_cls.default_factory()
            if self.device_config is None:
                self.device_config = device_config_cls()

        @property
        def max_in_flight_tokens(self) -> int:
            # Synchronous scheduling without pipeline parallelism: one batch in flight.
            batches = self.parallel_config.pipeline_parallel_size
            return batches * self.scheduler_config.max_num_batched_tokens

        @property
        def num_prefill_lookahead_tokens(self) -> int:
            spec = self.speculative_config
            if spec is None or not spec.use_eagle():
                return 0
            if spec.use_multi_module_mtp():
                return spec.num_speculative_tokens
            return 1

    module.ModelConfig = ModelConfig
    module.SpeculativeConfig = SpeculativeConfig
    module.VllmConfig = VllmConfig


class _ConfigLoader(importlib.abc.Loader):
    def create_module(self, spec):
        return _StubModule(spec.name)  # the other config classes: placeholders

    def exec_module(self, module) -> None:
        _config_namespace(module)


def _stubbed(fullname: str) -> bool:
    return any(fullname == s or fullname.startswith(s + ".") for s in _STUBS)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if _stubbed(fullname):
            return importlib.machinery.ModuleSpec(
                fullname, _StubLoader(), is_package=True
            )
        if fullname == "vllm.config":
            real = importlib.machinery.PathFinder.find_spec(fullname, path)
            if real is None:
                return None
            spec = importlib.machinery.ModuleSpec(
                fullname, _ConfigLoader(), is_package=True
            )
            spec.submodule_search_locations = list(real.submodule_search_locations)
            return spec
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
