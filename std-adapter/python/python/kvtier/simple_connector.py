"""vLLM 0.33.0's ``SimpleCPUOffloadConnector`` with kvtier's scheduler-side manager.

Load it with vLLM's out-of-tree connector mechanism (``kvtier.vllm`` re-exports it)::

    --kv-transfer-config '{"kv_connector": "KvtierSimpleCPUOffloadConnector",
      "kv_connector_module_path": "kvtier.vllm", "kv_role": "kv_both",
      "kv_connector_extra_config": {"cpu_bytes_to_use": 8589934592}}'

It is vLLM's connector, extra-config keys and worker side included; only its
``scheduler_manager`` is ``kvtier.simple.SimpleCPUOffloadScheduler``, built with the very
arguments vLLM's connector gives its own manager. Configurations kvtier's manager does not
cover raise ``ValueError`` at construction (see ``kvtier.simple``).

vLLM aligns the scheduler's CPU pool size with its workers' only for a connector named
``SimpleCPUOffloadConnector``; under this name the scheduler sizes the pool from the byte
budget, as each worker does. The counts agree when every rank has the same bytes per block;
with pipeline parallelism (ranks may differ) ``num_cpu_blocks`` must be set explicitly.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from vllm.distributed.kv_transfer.kv_connector.v1 import (
    simple_cpu_offload_connector as _vllm_connector,
)
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

from kvtier.simple import SimpleCPUOffloadScheduler

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig

__all__ = ["KvtierSimpleCPUOffloadConnector"]

# vLLM's connector constructs its manager by the module-level name; the name is pointed at
# kvtier's class for the duration of one construction (under this lock).
_CONSTRUCTING = threading.Lock()


class KvtierSimpleCPUOffloadConnector(_vllm_connector.SimpleCPUOffloadConnector):
    """``SimpleCPUOffloadConnector`` whose scheduler-side manager is kvtier's."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        role: KVConnectorRole,
        kv_cache_config: KVCacheConfig,
    ):
        extra = vllm_config.kv_transfer_config.kv_connector_extra_config or {}
        if (
            role == KVConnectorRole.SCHEDULER
            and vllm_config.parallel_config.pipeline_parallel_size > 1
            and extra.get("num_cpu_blocks") is None
        ):
            raise ValueError(
                "KvtierSimpleCPUOffloadConnector with pipeline parallelism needs "
                "num_cpu_blocks in kv_connector_extra_config (vLLM aligns the pool size "
                "across ranks only for SimpleCPUOffloadConnector)"
            )
        with _CONSTRUCTING:
            vllm_manager = _vllm_connector.SimpleCPUOffloadScheduler
            _vllm_connector.SimpleCPUOffloadScheduler = SimpleCPUOffloadScheduler
            try:
                super().__init__(vllm_config, role, kv_cache_config)
            finally:
                _vllm_connector.SimpleCPUOffloadScheduler = vllm_manager
