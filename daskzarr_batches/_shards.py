"""Shard-aware reading: each shard a window touches is fetched once, in few requests.

Zarr's sharding codec reads part of a shard by fetching the shard's index and
then each inner chunk's byte range one after another; a window read chunk by
chunk (one Zarr read per chunk, so that they decode concurrently) would fetch
every shard's index again for each chunk.  :class:`ShardPrefetch` sits between
Zarr and the (policy) store for one window read: before a chunk of a shard is
read, the shard is fetched once, whole in one request when the window needs at
least half of it (:func:`~._plan.reads_whole_shard`), else its index and then
the needed chunks' byte ranges, adjacent ones merged, concurrently; Zarr's
later index and range gets of that shard are served from memory, and its bytes
are dropped once the window's last chunk of it is decoded.  Zarr still decodes
everything (codecs, checksums, fill values).

Every fetch goes through the store below (the read policy's
:class:`~._policy.PolicyStore`), so retries, missing shards and failures are
recorded as for any other read.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from typing import Any

import zarr
import zarr.storage
from zarr.abc.store import ByteRequest, OffsetByteRequest, RangeByteRequest, SuffixByteRequest
from zarr.core.buffer import Buffer, BufferPrototype, default_buffer_prototype

from ._plan import ChunkPiece, reads_whole_shard
from ._policy import storage_keys

__all__ = ["ShardPrefetch", "sharding_codec"]


def sharding_codec(array: Any) -> Any | None:
    """The sharding codec of a sharded Zarr v3 array, else ``None``."""
    if not isinstance(array, zarr.Array) or array.shards is None:
        return None
    from zarr.codecs.sharding import ShardingCodec

    codecs: tuple[Any, ...] = tuple(getattr(array.metadata, "codecs", ()))
    if len(codecs) == 1 and isinstance(codecs[0], ShardingCodec):
        return codecs[0]
    return None


class _Fetched:
    """What was fetched of one shard: all of it, or its index and some byte ranges."""

    def __init__(self) -> None:
        self.whole: Buffer | None = None
        self.complete = False  # whole shard fetched (``whole`` None: absent)
        self.index: tuple[ByteRequest, Buffer | None] | None = None
        self.ranges: list[tuple[int, int, Buffer]] = []

    def serve(self, byte_range: ByteRequest | None) -> tuple[bool, Buffer | None]:
        """``(True, bytes)`` when the request is answered from memory."""
        if self.complete:
            data = self.whole
            if data is None or byte_range is None:
                return True, data
            size = len(data)
            if isinstance(byte_range, RangeByteRequest):
                return True, data[byte_range.start : min(byte_range.end, size)]
            if isinstance(byte_range, OffsetByteRequest):
                return True, data[byte_range.offset : size]
            if isinstance(byte_range, SuffixByteRequest):
                return True, data[max(0, size - byte_range.suffix) : size]
            return False, None
        if self.index is not None and byte_range == self.index[0]:
            return True, self.index[1]
        if isinstance(byte_range, RangeByteRequest):
            for lo, hi, data in self.ranges:
                if lo <= byte_range.start and byte_range.end <= hi:
                    return True, data[byte_range.start - lo : byte_range.end - lo]
        return False, None


class ShardPrefetch(zarr.storage.WrapperStore[Any]):
    """A store for one window read that fetches each shard it touches once.

    Parameters
    ----------
    store : zarr store
        The store below (the read policy's store).
    array : zarr.Array
        The sharded array (its metadata; reads go through :meth:`view`).
    pieces : sequence of ChunkPiece
        The window's axis-0 chunks of this array.
    """

    def __init__(self, store: Any, array: Any, pieces: Sequence[ChunkPiece]) -> None:
        super().__init__(store)
        self._array = array
        codec = sharding_codec(array)
        assert codec is not None
        self._codec: Any = codec
        self._per_shard = max(1, array.shards[0] // array.chunks[0])
        total = -(-array.shape[0] // array.chunks[0])
        self._needed: dict[int, list[int]] = {}
        for piece in pieces:
            self._needed.setdefault(piece.chunk // self._per_shard, []).append(
                piece.chunk % self._per_shard
            )
        self._existing = {
            row: min(self._per_shard, total - row * self._per_shard) for row in self._needed
        }
        self._left = {row: len(chunks) for row, chunks in self._needed.items()}
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._fetched: dict[str, _Fetched] = {}
        self._chunks_per_shard = tuple(
            max(1, s // c) for s, c in zip(array.shards, array.chunks, strict=True)
        )

    def _with_store(self, store: Any) -> ShardPrefetch:  # pragma: no cover - not reopened
        raise NotImplementedError("a window's shard prefetch is not reopened")

    def view(self) -> Any:
        """The array read through this store (no I/O)."""
        from zarr.core.array import AsyncArray
        from zarr.storage import StorePath

        inner = self._array._async_array
        path = StorePath(self, inner.store_path.path)
        return AsyncArray(inner.metadata, path, config=inner.config)

    async def get(
        self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        fetched = self._fetched.get(key)
        if fetched is not None:
            hit, data = fetched.serve(byte_range)
            if hit:
                return data
        return await self._store.get(key, prototype, byte_range)

    async def acquire(self, chunk: int) -> None:
        """Fetch (once) the shard row holding axis-0 chunk ``chunk``."""
        row = chunk // self._per_shard
        task = self._tasks.get(row)
        if task is None:
            task = asyncio.ensure_future(self._fetch_row(row))
            self._tasks[row] = task
        await task

    def release(self, chunk: int) -> None:
        """One chunk of the window is decoded: drop its shard once all of them are."""
        row = chunk // self._per_shard
        self._left[row] -= 1
        if self._left[row] == 0:
            start = row * self._array.shards[0]
            stop = min(self._array.shape[0], start + self._array.shards[0])
            for key in storage_keys(self._array, start, stop):
                self._fetched.pop(key, None)

    async def _fetch_row(self, row: int) -> None:
        start = row * self._array.shards[0]
        stop = min(self._array.shape[0], start + self._array.shards[0])
        keys = storage_keys(self._array, start, stop)
        whole = reads_whole_shard(len(self._needed[row]), self._existing[row])
        fetch = self._fetch_whole if whole else self._fetch_part
        await asyncio.gather(*(fetch(key, row) for key in keys))

    async def _fetch_whole(self, key: str, row: int) -> None:
        fetched = _Fetched()
        fetched.whole = await self._store.get(key, default_buffer_prototype())
        fetched.complete = True
        self._fetched[key] = fetched

    async def _fetch_part(self, key: str, row: int) -> None:
        from zarr.codecs.sharding import ShardingCodecIndexLocation

        codec = self._codec
        size = codec._shard_index_size(self._chunks_per_shard)
        request: ByteRequest = (
            RangeByteRequest(0, size)
            if codec.index_location == ShardingCodecIndexLocation.start
            else SuffixByteRequest(size)
        )
        fetched = _Fetched()
        index_bytes = await self._store.get(key, default_buffer_prototype(), request)
        fetched.index = (request, index_bytes)
        if index_bytes is None:  # absent shard: Zarr fills it
            self._fetched[key] = fetched
            return
        index = await codec._decode_shard_index(index_bytes, self._chunks_per_shard)
        spans = []
        coords_of = _inner_coords(key, self._array, self._chunks_per_shard)
        for local in sorted(self._needed[row]):
            for coords in coords_of(local):
                span = index.get_chunk_slice(coords)
                if span:
                    spans.append((int(span[0]), int(span[1])))
        merged: list[list[int]] = []
        for lo, hi in sorted(spans):
            if merged and lo <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], hi)
            else:
                merged.append([lo, hi])
        datas = await asyncio.gather(
            *(
                self._store.get(key, default_buffer_prototype(), RangeByteRequest(lo, hi))
                for lo, hi in merged
            )
        )
        fetched.ranges = [
            (lo, hi, data) for (lo, hi), data in zip(merged, datas, strict=True) if data is not None
        ]
        self._fetched[key] = fetched


def _inner_coords(key: str, array: Any, chunks_per_shard: tuple[int, ...]) -> Any:
    """``coords(local)``: the inner chunk coordinates of axis-0 chunk ``local`` of a shard."""
    others = [range(n) for n in chunks_per_shard[1:]]

    def coords(local: int) -> list[tuple[int, ...]]:
        return [(local, *rest) for rest in itertools.product(*others)]

    return coords
