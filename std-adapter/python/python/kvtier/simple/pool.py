"""The CPU pool as vLLM's scheduler exposes it (``cpu_block_pool``, and the
``cpu_coordinator`` that holds it): live views of kvtier's native pool, block by block."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id

if TYPE_CHECKING:
    from collections.abc import Iterable

    from vllm.v1.request import Request

    from kvtier import _native


class CpuBlock:
    """One CPU block as vLLM's ``KVCacheBlock`` reads: ``block_id``, and live from the pool
    ``ref_cnt``, ``block_hash`` (``BlockHashWithGroupId`` bytes or ``None``),
    ``block_hash_num_tokens``, ``is_null``."""

    __slots__ = ("_pool", "block_id")

    def __init__(self, pool: _native.CpuBlockPool, block_id: int) -> None:
        self._pool = pool
        self.block_id = block_id

    @property
    def ref_cnt(self) -> int:
        return self._pool.ref_cnt(self.block_id)

    @property
    def block_hash(self) -> bytes | None:
        return self._pool.block_hash(self.block_id)

    @property
    def block_hash_num_tokens(self) -> int | None:
        return self._pool.block_hash_num_tokens(self.block_id)

    @property
    def is_null(self) -> bool:
        return self.block_id == 0

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, CpuBlock)
            and other._pool is self._pool
            and other.block_id == self.block_id
        )

    def __hash__(self) -> int:
        return hash(self.block_id)

    def __repr__(self) -> str:
        return f"CpuBlock(block_id={self.block_id}, ref_cnt={self.ref_cnt})"


class _CachedBlocks:
    """``cached_block_hash_to_block``: lookup by ``BlockHashWithGroupId``."""

    def __init__(self, pool: CpuBlockPool) -> None:
        self._pool = pool

    def get_one_block(self, key: bytes) -> CpuBlock | None:
        b = self._pool._native.get_one_block(key)
        return None if b is None else self._pool.blocks[b]


class _SecondaryHashes:
    """``cached_block_hashes_by_block``: each block's secondary hashes (the keys it is
    reachable under besides its ``block_hash``), only blocks that have some."""

    def __init__(self, pool: CpuBlockPool) -> None:
        self._pool = pool

    def get(self, block_id: int, default: Any = None) -> Any:
        keys = self._pool._native.secondary_hashes(block_id)
        return set(keys) if keys else default

    def __getitem__(self, block_id: int) -> set[bytes]:
        keys = self.get(block_id)
        if keys is None:
            raise KeyError(block_id)
        return keys

    def __contains__(self, block_id: object) -> bool:
        return isinstance(block_id, int) and self.get(block_id) is not None


class CpuBlockPool:
    """vLLM's ``cpu_block_pool`` over kvtier's CPU pool: what vLLM's tests and connector
    read (free count, blocks, lookup by hash), pin with (``touch``, ``free_blocks``) and seed
    hits with (``get_new_blocks``, ``cache_full_blocks``), each checked: a bad call raises
    ``ValueError`` and changes nothing. Releasing a reference the scheduler's own loads or
    stores hold corrupts its transfers, as it does in vLLM."""

    def __init__(self, native: _native.CpuBlockPool, hash_block_size: int) -> None:
        self._native = native
        self.hash_block_size = hash_block_size
        self.blocks: tuple[CpuBlock, ...] = tuple(
            CpuBlock(native, i) for i in range(native.num_blocks())
        )
        self.cached_block_hash_to_block = _CachedBlocks(self)
        self.cached_block_hashes_by_block = _SecondaryHashes(self)

    def get_num_free_blocks(self) -> int:
        return self._native.free_count()

    def touch(self, blocks: Iterable[CpuBlock]) -> None:
        self._native.touch([b.block_id for b in blocks])

    def free_blocks(self, ordered_blocks: Iterable[CpuBlock]) -> None:
        self._native.free_blocks([b.block_id for b in ordered_blocks])

    def get_new_blocks(self, num_blocks: int) -> list[CpuBlock]:
        """``num_blocks`` blocks from the front of the free queue, each with one reference
        (the caller's, given back with ``free_blocks``); ``ValueError`` when fewer are free."""
        return [self.blocks[b] for b in self._native.get_new_blocks(num_blocks)]

    def cache_full_blocks(
        self,
        request: Request,
        blocks: list[CpuBlock],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        kv_cache_group_id: int,
    ) -> None:
        """Caches ``blocks[num_cached_blocks:num_full_blocks]`` under the request's block
        hashes at ``block_size`` (each block keyed by the hash at its end) in group
        ``kv_cache_group_id``, as vLLM's ``BlockPool.cache_full_blocks`` does."""
        if block_size <= 0 or block_size % self.hash_block_size:
            raise ValueError(
                f"a block of {block_size} tokens is not a multiple of the hash block "
                f"({self.hash_block_size})"
            )
        per = block_size // self.hash_block_size
        hashes = request.block_hashes[per - 1 :: per]
        keys = [make_block_hash_with_group_id(h, kv_cache_group_id) for h in hashes]
        self._native.cache_full_blocks(
            [b.block_id for b in blocks], keys, num_cached_blocks, num_full_blocks, block_size
        )


class CpuCoordinator:
    """What vLLM's scheduler exposes of its CPU-side coordinator: whether hits are
    fine-grained, its pool and its groups' block sizes."""

    def __init__(
        self, enable_partial_hash_hits: bool, block_pool: CpuBlockPool, sizes: tuple[int, ...]
    ) -> None:
        self.enable_partial_hash_hits = enable_partial_hash_hits
        self.block_pool = block_pool
        self.group_block_sizes = sizes
