"""kvtier's simple CPU offloader as vLLM 0.33.0's ``SimpleCPUOffloadScheduler``.

``SimpleCPUOffloadScheduler`` here takes vLLM's constructor arguments and answers every call
with vLLM's own types (``SimpleCPUOffloadMetadata``, ``SimpleCPUOffloadStats``,
``BoundaryStoreStats``, and with KV-cache events on ``BlockStored`` / ``BlockRemoved`` /
``AllBlocksCleared``); the bookkeeping is kvtier's Rust ``kvtier_core::simple``. The GPU
pool stays vLLM's ``BlockPool`` (the one ``bind_gpu_block_pool`` gives): kvtier reads it and
pins or releases its blocks through its own ``touch`` and ``free_blocks``.

Scope: the model's KV-cache groups, in vLLM's group order (at most eight), each of full
attention (``FullAttentionSpec``, ``MLAAttentionSpec``), sliding-window attention
(``SlidingWindowSpec``, ``SlidingWindowMLASpec``: vLLM's ``SlidingWindowManager`` for both),
chunked local attention (``ChunkedLocalAttentionSpec``), Mamba in ``align`` mode
(``MambaSpec``), or of a spec that is not prefix-cacheable (a scratch or ring group such as
``CircularBufferSpec``, or a bounded-replay ``SlidingWindowMLASpec``, of any block size
dividing the scheduler's: vLLM's scheduler side never looks them up, stores, loads or reports
them, so kvtier passes their tables as empty). At least one prefix-cacheable group is of full
attention, and the first group of a full-attention kind is one of them (vLLM's ``fa_gidx``).
Each group has its own block size (DCP-resolved; the scheduler's block is a multiple of
each, every prefix-cacheable one a multiple of the hash block; under DCP only full-attention
groups may be sharded, which vLLM's coordinator asserts), and in eager mode hits are
fine-grained where vLLM's ``partial_hash_hits_enabled`` allows them (a Mamba block larger than
the hash block, or equal to it under DCP): full attention's last block and the Mamba state may
end on any hash boundary, secondary block hashes are copied with a store, and a finishing
prompt's partial full-attention tail is flushed. With EAGLE's trailing-block drop
(``use_eagle_block_drop``) the draft groups (``is_eagle_group``; every group when none is
marked) match one block past a hit and drop it, and their eager scan holds the block back,
as vLLM's coordinator does. One full-attention group
alone is vLLM's ``UnitaryKVCacheCoordinator``; any other layout is its
``HybridKVCacheCoordinator``, whose hit is the longest every group accepts and whose eager scan
holds no re-prefillable tail back (``num_prefill_lookahead_tokens``); kvtier follows both. The
eager scan and the finish-time flush follow every full-attention, sliding-window and
chunked-local table, storing entries the GPU has nulled from its prefix cache while it holds
them; Mamba states are stored from the scheduler's boundary hand-offs. Any other
configuration (a prefix-cacheable spec of another kind, e.g. ``RSWASpec``,
``SinkFullAttentionSpec``, ``CrossAttentionSpec``, a HiSparse group, Mamba outside ``align``
mode) raises ``ValueError`` naming what is not supported, rather than running with different
bookkeeping.

Two optional ``kv_connector_extra_config`` keys bound kvtier's fixed tables:
``kvtier_max_requests`` (requests tracked at once; default ``4 · max_num_seqs + 64``) and
``kvtier_max_blocks_per_request`` (default ``cdiv(max_model_len, smallest group block) + 64``,
at most the GPU pool).

The package's modules, by concept: ``layout`` (the groups' kinds and the configurations
refused), ``sizing`` (the fixed tables' sizes), ``pool`` (the CPU pool's views), ``step``
(a scheduler output as the native scheduler takes it), ``events`` (KV-cache events and
store payloads), ``metrics`` (vLLM's stats types) and ``scheduler`` (the class itself).
Import from ``kvtier.simple``: the modules' own names may move.
"""

from kvtier.simple.pool import CpuBlock, CpuBlockPool
from kvtier.simple.scheduler import SimpleCPUOffloadScheduler

# The public classes name the package as their module, as they did when it was one file
# (vLLM's connector reports its manager's module).
for _cls in (CpuBlock, CpuBlockPool, SimpleCPUOffloadScheduler):
    _cls.__module__ = __name__
del _cls

__all__ = ["SimpleCPUOffloadScheduler"]
