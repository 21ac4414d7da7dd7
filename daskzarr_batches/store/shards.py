"""Shard-aware reading: each shard a window touches is fetched once, in few requests.

Zarr's sharding codec reads part of a shard by fetching the shard's index and
then each inner chunk's byte range one after another, and copies a shard's
chunks into a shard-sized buffer before they reach the array's output (on the
event loop, serially); a window read chunk by chunk would also fetch every
shard's index again for each chunk.  :func:`read_sharded` reads a window of a
sharded array instead:

- each shard (row) the window touches is fetched once, through the store
  below (the read policy's :class:`~daskzarr_batches.store.policy.PolicyStore`, so retries,
  missing shards and failures are recorded as for any read): whole, in one
  request, when the window needs at least half of its axis-0 chunks
  (:func:`~daskzarr_batches.plan.reads_whole_shard`), else its index and then the needed
  chunks' byte ranges, adjacent ranges merged, fetched concurrently;
- every needed inner chunk is decoded by the shard's own inner codec pipeline
  (Zarr's codecs, checksums and fill values) straight into the window's
  output, chunks concurrently, shards ``shards_in_flight`` at a time; a
  shard's bytes are dropped once its chunks are decoded.

Only for Zarr's own (batched) codec pipeline; another pipeline (e.g. a Rust
one that reads shards itself) is left to read the array as usual.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

import numpy as np
import zarr
from zarr.abc.store import ByteRequest, RangeByteRequest, SuffixByteRequest
from zarr.core.buffer import Buffer, BufferPrototype, default_buffer_prototype

from ..plan.shards import reads_whole_shard
from ..plan.windows import ChunkPiece

__all__ = ["read_sharded", "sharding_codec"]

T = TypeVar("T")


def sharding_codec(array: Any) -> Any | None:
    """The sharding codec of a sharded Zarr v3 array read by Zarr's own pipeline, else ``None``."""
    if not isinstance(array, zarr.Array) or array.shards is None:
        return None
    from zarr.codecs.sharding import ShardingCodec
    from zarr.core.codec_pipeline import BatchedCodecPipeline

    codecs: tuple[Any, ...] = tuple(getattr(array.metadata, "codecs", ()))
    if len(codecs) != 1 or not isinstance(codecs[0], ShardingCodec):
        return None
    if not isinstance(array._async_array.codec_pipeline, BatchedCodecPipeline):
        return None
    if not isinstance(codecs[0].codec_pipeline, BatchedCodecPipeline):
        return None
    return codecs[0]


class _Bytes:
    """A byte getter over bytes already fetched (``None``: the chunk is absent)."""

    def __init__(self, data: Buffer | None) -> None:
        self.data = data

    async def get(
        self, prototype: BufferPrototype, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        assert byte_range is None
        return self.data


async def read_sharded(
    array: Any,
    pieces: Sequence[ChunkPiece],
    starts: Sequence[int],
    out: np.ndarray,
    keeps_all: Callable[[ChunkPiece], bool],
    shards_in_flight: int,
    scatter: Callable[[ChunkPiece, np.ndarray], None] | None = None,
) -> None:
    """Read ``pieces`` (ascending axis-0 chunks) of a sharded array into ``out``.

    Piece ``i``'s kept rows go to ``out[starts[i]:]``, or, with ``scatter``,
    are handed to ``scatter(piece, rows)`` (a window in plan order).  ``array`` is the
    policy view of the array: its store is the one fetches go through.
    """
    codec = sharding_codec(array)
    assert codec is not None
    inner = array._async_array
    meta = inner.metadata
    store = inner.store_path.store
    prefix = f"{inner.store_path.path}/" if inner.store_path.path else ""
    shard_spec = meta.get_chunk_spec(
        (0,) * len(array.shape), inner.config, default_buffer_prototype()
    )
    chunk_spec = codec._get_chunk_spec(shard_spec)
    per_shard = codec._get_chunks_per_shard(shard_spec)
    chunk_shape = tuple(codec.chunk_shape)
    shape = tuple(array.shape)
    total = -(-shape[0] // chunk_shape[0])
    # chunks along the other axes: (global index per axis) for every combination
    counts = [-(-s // c) for s, c in zip(shape[1:], chunk_shape[1:], strict=True)]
    others = list(itertools.product(*(range(n) for n in counts)))
    out_nd = default_buffer_prototype().nd_buffer.from_numpy_array(out)
    rows: dict[int, list[tuple[ChunkPiece, int]]] = {}
    for piece, at in zip(pieces, starts, strict=True):
        rows.setdefault(piece.chunk // per_shard[0], []).append((piece, at))
    limit = asyncio.Semaphore(max(1, shards_in_flight))

    def key_of(row: int, rest: tuple[int, ...]) -> str:
        grid = tuple(g // n for g, n in zip(rest, per_shard[1:], strict=True))
        return prefix + meta.encode_chunk_key((row, *grid))

    async def fetch(key: str, locals_: list[int], whole: bool) -> dict[tuple[int, ...], Buffer]:
        """The needed inner chunks of one shard object, by their coordinates in it."""
        from zarr.codecs.sharding import ShardingCodecIndexLocation

        prototype = default_buffer_prototype()
        size = codec._shard_index_size(per_shard)
        at_start = codec.index_location == ShardingCodecIndexLocation.start
        if whole:
            data = await store.get(key, prototype)
            if data is None:
                return {}
            raw = data[0:size] if at_start else data[len(data) - size : len(data)]
            index = await codec._decode_shard_index(raw, per_shard)
            found = {}
            for coords in _coords(locals_, per_shard):
                span = index.get_chunk_slice(coords)
                if span:
                    found[coords] = data[span[0] : span[1]]
            return found
        request: ByteRequest = RangeByteRequest(0, size) if at_start else SuffixByteRequest(size)
        raw_index = await store.get(key, prototype, request)
        if raw_index is None:
            return {}
        index = await codec._decode_shard_index(raw_index, per_shard)
        spans = {}
        for coords in _coords(locals_, per_shard):
            span = index.get_chunk_slice(coords)
            if span:
                spans[coords] = (int(span[0]), int(span[1]))
        merged: list[list[int]] = []
        for lo, hi in sorted(spans.values()):
            if merged and lo <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], hi)
            else:
                merged.append([lo, hi])
        datas = await _all(
            [store.get(key, prototype, RangeByteRequest(lo, hi)) for lo, hi in merged]
        )
        found = {}
        for coords, (lo, hi) in spans.items():
            for (start, stop), data in zip(merged, datas, strict=True):
                if data is not None and start <= lo and hi <= stop:
                    found[coords] = data[lo - start : hi - start]
        return found

    async def decode(piece: ChunkPiece, at: int, chunks: dict[str, dict[Any, Buffer]]) -> None:
        row, local = divmod(piece.chunk, per_shard[0])
        whole = keeps_all(piece) and scatter is None
        target = out_nd
        lo = at
        if not whole:
            temp = np.empty((piece.rows, *shape[1:]), dtype=out.dtype)
            target = default_buffer_prototype().nd_buffer.from_numpy_array(temp)
            lo = 0
        batch = []
        for rest in others:
            coords = (local, *(g % n for g, n in zip(rest, per_shard[1:], strict=True)))
            widths = [
                min(c, s - g * c) for g, c, s in zip(rest, chunk_shape[1:], shape[1:], strict=True)
            ]
            chunk_selection = (slice(0, piece.rows), *(slice(0, w) for w in widths))
            out_selection = (
                slice(lo, lo + piece.rows),
                *(
                    slice(g * c, g * c + w)
                    for g, c, w in zip(rest, chunk_shape[1:], widths, strict=True)
                ),
            )
            data = chunks[key_of(row, rest)].get(coords)
            batch.append((_Bytes(data), chunk_spec, chunk_selection, out_selection, True))
        await codec.codec_pipeline.read(batch, target)
        if not whole:
            kept = temp[piece.take]
            if scatter is not None:
                scatter(piece, kept)
            else:
                out[at : at + len(kept)] = kept

    async def one_row(row: int, items: list[tuple[ChunkPiece, int]]) -> None:
        async with limit:
            locals_ = [piece.chunk % per_shard[0] for piece, _ in items]
            existing = min(per_shard[0], total - row * per_shard[0])
            whole = reads_whole_shard(len(locals_), existing)
            keys = {key_of(row, rest): None for rest in others}
            found = await _all([fetch(key, locals_, whole) for key in keys])
            chunks = dict(zip(keys, found, strict=True))
            async with asyncio.TaskGroup() as group:
                for piece, at in items:
                    group.create_task(decode(piece, at, chunks))

    async with asyncio.TaskGroup() as group:  # a failure cancels the siblings
        for row, items in rows.items():
            group.create_task(one_row(row, items))


async def _all(coros: Sequence[Coroutine[Any, Any, T]]) -> list[T]:
    """``asyncio.gather(*coros)``, except that a failure cancels the others and waits for them.

    With ``gather`` the other fetches of a failed shard row went on reading,
    unowned, after the window had failed (and after its stream was closed).
    A failure is raised as an ``ExceptionGroup`` (the read layer reads the
    window again chunk by chunk to name it).
    """
    async with asyncio.TaskGroup() as group:
        tasks = [group.create_task(coro) for coro in coros]
    return [task.result() for task in tasks]


def _coords(locals_: list[int], per_shard: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Inner chunk coordinates of axis-0 chunks ``locals_`` of a shard, in every other axis."""
    others = itertools.product(*(range(n) for n in per_shard[1:]))
    return [(local, *rest) for rest in list(others) for local in sorted(locals_)]
