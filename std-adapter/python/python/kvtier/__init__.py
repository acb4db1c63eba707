"""kvtier: the bookkeeping of a KV-cache offload tier, in Rust.

``kvtier.vllm`` holds the vLLM plugin (``KvtierOffloadingSpec``, ``KvtierOffloadingManager``);
importing ``kvtier`` itself needs no vLLM.
"""

from kvtier._native import __version__

__all__ = ["__version__"]
