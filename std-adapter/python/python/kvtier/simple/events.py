"""The CPU prefix cache's KV-cache events as vLLM reports them (``BlockStored`` when a store
completes, ``BlockRemoved`` when a CPU block is reused, ``AllBlocksCleared`` on a reset
that cleared it), and the payloads (``BlockStoreMeta``) of the blocks a store writes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
)
from vllm.v1.core.kv_cache_utils import (
    BlockHashWithGroupId,
    generate_block_hash_extra_keys,
    get_block_hash,
    get_group_id,
    make_block_hash_with_group_id,
    maybe_convert_block_hash,
    to_event_extra_keys,
)
from vllm.v1.kv_cache_interface import get_kv_cache_spec_kind, get_kv_cache_spec_sliding_window
from vllm.v1.simple_kv_offload.manager import BlockStoreMeta

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

    from kvtier import _native

# Event payload list numbers from here on name finish-time flushes (the native module's).
FLUSH_LISTS = 1 << 21

# What one block of a store event needs for its BlockStored events, captured when the event
# is issued: the GPU block, and for a positional store the request whose tokens it holds and
# its first token (None and 0 for a boundary hand-off).
Capture = tuple[Any, ...]


class StoreEvents:
    """The events not yet taken, and what the stores in flight need to report theirs: the
    captures of each issued store event (emitted when it completes), of each prepared store
    (``prepare_store_specs``, by CPU block, until the next step issues it), and the requests
    of the finish-time flushes queued since the last step."""

    def __init__(
        self,
        kv_cache_config: KVCacheConfig,
        hash_block_size: int,
        group_block_sizes: Sequence[int],
        medium: str,
    ) -> None:
        self.hash_block_size = hash_block_size
        self.group_block_sizes = group_block_sizes
        self.medium = medium
        # Each group's spec kind and sliding window, as its events name them.
        self.spec_meta = [
            (
                get_kv_cache_spec_kind(g.kv_cache_spec).value,
                get_kv_cache_spec_sliding_window(g.kv_cache_spec),
            )
            for g in kv_cache_config.kv_cache_groups
        ]
        self.pending: list[KVCacheEvent] = []
        self.store_payloads: dict[int, list[Capture]] = {}
        self.flush_requests: dict[int, Request] = {}
        self.prepared: dict[int, Capture] = {}

    def take(self) -> list[KVCacheEvent]:
        """The events since the last call."""
        events, self.pending = self.pending, []
        return events

    def clear_in_flight(self) -> None:
        """Forgets every store in flight (a reset abandons them: their completions cache
        nothing) and the prepared ones (released)."""
        self.store_payloads.clear()
        self.flush_requests.clear()
        self.prepared.clear()

    def record_pool_events(self, pool_events: Iterable[tuple[str, Any]]) -> None:
        """The native pool's ``("removed", key)`` and ``("cleared", None)`` events."""
        for kind, key in pool_events:
            if kind == "removed":
                self.pending.append(
                    BlockRemoved(
                        block_hashes=[maybe_convert_block_hash(get_block_hash(key))],
                        medium=self.medium,
                        group_idx=get_group_id(key),
                        locality="LOCAL",
                    )
                )
            else:
                self.pending.append(AllBlocksCleared())

    def record_completed(
        self, native: _native.SimpleScheduler, pool: BlockPool | None, events: Iterable[int]
    ) -> None:
        """The ``BlockStored`` events of each store event every worker has completed."""
        for event in events:
            captures = self.store_payloads.get(event)
            if captures is not None and native.store_event_state(event) is None:
                self.pending.extend(self._completed_events(pool, captures))
                del self.store_payloads[event]

    def capture(
        self,
        native: _native.SimpleScheduler,
        pool: BlockPool | None,
        gpu_block: int,
        cpu_block: int,
        scheduled: list[Request | None],
    ) -> Capture:
        """What one block of a store event needs for its ``BlockStored`` events, captured
        when the event is issued: the GPU block, and for a positional store the request
        whose tokens it holds and its first token."""
        assert pool is not None
        meta = native.stored_meta(cpu_block)
        if meta is None:
            return (gpu_block, None, 0)
        lst, _, start, req_id = meta
        key = pool.blocks[gpu_block].block_hash
        return (gpu_block, self._payload_request(lst, req_id, key, scheduled), start)

    def _payload_request(
        self, lst: int | None, req_id: str | None, key: bytes, scheduled: list[Request | None]
    ) -> Request:
        """The request a positional store's payload reads: named by its parent hash's list,
        or (a first block) the request whose table named it. A first block may have been
        freed and hashed by another request since (the scan reads the ids the connector
        was given), so the hash does not tell; a finishing request's id may be released
        before its flush is issued, but its flush reads the table given at finish, whose
        blocks still hold its own hashes."""
        if lst is not None:
            return scheduled[lst] if lst < FLUSH_LISTS else self.flush_requests[lst]
        for r in (*scheduled, *self.flush_requests.values()):
            if r is not None and req_id is not None and r.request_id == req_id:
                return r
        # A first block's hash is the request's hash at the block's end.
        raw = get_block_hash(key)
        last = self.group_block_sizes[get_group_id(key)] // self.hash_block_size - 1
        for r in self.flush_requests.values():
            if len(r.block_hashes) > last and r.block_hashes[last] == raw:
                return r
        raise AssertionError(f"the request {req_id!r} of a stored block is unknown")

    def store_meta(
        self, pool: BlockPool | None, gpu_block: int, request: Request | None, start: int
    ) -> dict[BlockHashWithGroupId, BlockStoreMeta]:
        """vLLM's event payloads of a positional store of ``gpu_block`` from ``request``'s
        token ``start``: its own hash's, then each other hash block's inside it; none for a
        hand-off."""
        if request is None:
            return {}
        assert pool is not None
        key = pool.blocks[gpu_block].block_hash
        hb, size = self.hash_block_size, self.group_block_sizes[get_group_id(key)]
        out = {key: self._payload(request, start, start + size)}
        for k, at in self._inner_hashes(key, request, start).items():
            out[k] = self._payload(request, at, at + hb, hb)
        return out

    def _payload(
        self, request: Request, first: int, end: int, block_size: int | None = None
    ) -> BlockStoreMeta:
        """vLLM's payload of ``request``'s tokens ``first..end``: the tokens, the hash before
        them (the parent), the LoRA and the extra keys."""
        h = first // self.hash_block_size
        lora = request.lora_request
        extra, _ = generate_block_hash_extra_keys(request, first, end, 0)
        return BlockStoreMeta(
            token_ids=list(request.all_token_ids[first:end]),
            parent_block_hash=(
                maybe_convert_block_hash(request.block_hashes[h - 1]) if h else None
            ),
            lora_id=lora.adapter_id if lora else None,
            lora_name=lora.name if lora else None,
            extra_keys=extra,
            block_size=block_size,
        )

    def _inner_hashes(self, key: bytes, request: Request, start: int) -> dict[bytes, int]:
        """The keys of ``request``'s hash blocks inside the block stored under ``key`` from
        token ``start``, other than ``key`` itself, each with its first token."""
        group = get_group_id(key)
        hb = self.hash_block_size
        inner: dict[bytes, int] = {}
        for h in range(start // hb, (start + self.group_block_sizes[group]) // hb):
            if h < len(request.block_hashes):
                k = make_block_hash_with_group_id(request.block_hashes[h], group)
                if k != key:
                    inner[k] = h * hb
        return inner

    def _block_stored(
        self, key: bytes, request: Request | None, start: int, size: int
    ) -> BlockStored:
        """vLLM's ``BlockStored`` for ``key`` of ``size`` tokens: with ``request``, the
        payload of its tokens from ``start`` (empty when the request has fewer)."""
        group = get_group_id(key)
        kind, window = self.spec_meta[group]
        meta = None
        if request is not None and start + size <= len(request.all_token_ids):
            meta = self._payload(request, start, start + size)
        return BlockStored(
            block_hashes=[maybe_convert_block_hash(get_block_hash(key))],
            parent_block_hash=meta and meta.parent_block_hash,
            token_ids=meta.token_ids if meta else [],
            block_size=size,
            lora_id=meta and meta.lora_id,
            medium=self.medium,
            lora_name=meta and meta.lora_name,
            extra_keys=to_event_extra_keys(meta and meta.extra_keys and [meta.extra_keys]),
            group_idx=group,
            kv_cache_spec_kind=kind,
            kv_cache_spec_sliding_window=window,
            locality="LOCAL",
        )

    def _completed_events(
        self, pool: BlockPool | None, captures: list[Capture]
    ) -> Iterable[BlockStored]:
        """The ``BlockStored`` events of a completed store, block by block: the GPU block's
        hash, then each secondary hash it holds (the request's own hash block at that
        boundary, or without a payload and block size 0)."""
        assert pool is not None
        hb = self.hash_block_size
        for gpu_block, request, start in captures:
            key = pool.blocks[gpu_block].block_hash
            size = self.group_block_sizes[get_group_id(key)]
            yield self._block_stored(key, request, start, size)
            inner = self._inner_hashes(key, request, start) if request is not None else {}
            for secondary in pool.cached_block_hashes_by_block.get(gpu_block, ()):
                at = inner.get(secondary)
                if at is None:
                    yield self._block_stored(secondary, None, 0, 0)
                else:
                    yield self._block_stored(secondary, request, at, hb)
