"""The one shard reader: each shard a read touches is fetched once, in few requests.

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

Batch windows read their chunks with :func:`read_sharded`; chunk streams read
the inner blocks of one shard with :func:`read_shard_blocks` (the whole shard
in one request, each block decoded into an array of its own).  Only for Zarr's
own (batched) codec pipeline; another pipeline (e.g. a Rust one that reads
shards itself) is left to read the array as usual.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

import numpy as np
import zarr
from zarr.abc.store import ByteRequest, RangeByteRequest, SuffixByteRequest

from ..plan.shards import reads_whole_shard
from ..plan.windows import ChunkPiece
from .cache import array_token, inner_chunk_name
from .direct import frame_size
from .layout import chunk_grid, chunks_per_shard, object_key, shard_of
from .pipelines import codec_pipeline_of, is_zarrs_pipeline
from .zarr_adapter import (
    Buffer,
    BufferPrototype,
    buffer_prototype,
    bytes_endian,
    chunk_spec,
    codec_pipeline,
    decode_shard_index,
    is_zarr_pipeline,
    shard_chunk_spec,
    shard_index_at_start,
    shard_index_size,
)

__all__ = ["read_shard_blocks", "read_sharded", "reads_by_shard", "sharding_codec"]

T = TypeVar("T")


def reads_by_shard(array: Any, cached: bool) -> bool:
    """Whether the shard reader reads ``array`` (with a cache: ``cached``): the one shard decision.

    A sharded Zarr v3 array whose one array-to-bytes codec is the sharding
    codec, read by Zarr's own pipeline (the policy view reads a zarrs
    array through it too), with Zarr's pipeline inside its shards; but not
    an array zarrs reads natively (no cache: zarrs reads its shards itself).
    Batch windows (``store.readers``' choice of reader), chunk streams (a
    shard's inner blocks as one read unit) and the kept parts of a cluster
    cache (``read.tasks.read_shard``) all ask here.
    """
    if not isinstance(array, zarr.Array) or array.shards is None:
        return False
    pipeline = codec_pipeline(array)
    if not (is_zarr_pipeline(pipeline) or is_zarrs_pipeline(pipeline)):
        return False  # a pipeline of its own: left to read the array as usual
    if not cached and codec_pipeline_of(array) == "zarrs":
        return False
    return _codec(array) is not None


def sharding_codec(array: Any) -> Any | None:
    """The sharding codec of a sharded Zarr v3 array read by Zarr's own pipeline, else ``None``.

    ``array`` is the policy view the shard reader reads through (whether
    the shard reader reads an array at all: :func:`reads_by_shard`).
    """
    if not isinstance(array, zarr.Array) or array.shards is None:
        return None
    if not is_zarr_pipeline(codec_pipeline(array)):
        return None
    return _codec(array)


def _codec(array: zarr.Array) -> Any | None:
    """The array's one codec if a sharding codec with Zarr's pipeline inside, else ``None``."""
    from zarr.codecs import ShardingCodec

    codecs: tuple[Any, ...] = tuple(getattr(array.metadata, "codecs", ()))
    if len(codecs) != 1 or not isinstance(codecs[0], ShardingCodec):
        return None
    if not is_zarr_pipeline(codecs[0].codec_pipeline):
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


#: Inner chunk coordinates, local to their shard.
Coords = tuple[int, ...]
#: One inner chunk to decode: its bytes (``None``: absent), the part of the chunk
#: kept and where that part goes in the output.
Decode = tuple[Buffer | None, tuple[slice, ...], tuple[slice, ...]]


class _Shards:
    """What reading the shards of one sharded array needs: its codec, store and geometry.

    ``array`` is the policy view of the array: its store is the one fetches go through.
    """

    def __init__(self, array: Any) -> None:
        codec = sharding_codec(array)
        assert codec is not None
        self.array = array
        self.codec = codec
        self.store = array.store_path.store
        self.chunk_spec = shard_chunk_spec(codec, chunk_spec(array))
        self.per_shard = chunks_per_shard(array)
        self.chunk_shape = tuple(codec.chunk_shape)
        self.shape = tuple(array.shape)
        self.index_size = shard_index_size(codec, self.per_shard)
        self.index_at_start = shard_index_at_start(codec)
        #: numcodecs' zstd decode when the inner chunks are exactly bytes + zstd of a native
        #: numeric dtype: whole inner chunks then decode straight into the output
        self.zstd = _inner_zstd(codec, np.dtype(array.dtype))
        # a read policy's chunk cache (the store is its PolicyStore): inner chunks kept
        policy = getattr(self.store, "policy", None)
        self.cache = None if policy is None else policy.cache
        if self.cache is not None:
            assert policy is not None
            tokens = dict(policy.cache_tokens)
            self.token = tokens.get(getattr(self.store, "name", "")) or array_token(array)
            self.counts = self.store.ledger.cache

    def cache_key(self, key: str, coords: Coords) -> str:
        """The cache key of inner chunk ``coords`` of shard ``key``."""
        assert self.cache is not None
        return self.cache.key(self.token, inner_chunk_name(key, coords))

    async def held(self, wanted: Sequence[tuple[str, Coords]]) -> dict[tuple[str, Coords], Any]:
        """The inner chunks of ``wanted`` the cache holds (decoded, cropped to the array)."""
        found: dict[tuple[str, Coords], Any] = {}
        if self.cache is None:
            return found
        for key, coords in wanted:
            name = self.cache_key(key, coords)
            data = self.cache.get(name, self.counts, disk=False)
            if data is None and self.cache.directory is not None:
                data = await asyncio.to_thread(self.cache.get, name, self.counts)
            if data is not None:
                self.counts.hits += 1
                self.counts.bytes_hit += data.nbytes
                found[(key, coords)] = data
        return found

    async def keep(self, key: str, coords: Coords, data: np.ndarray) -> None:
        """Put a decoded inner chunk (cropped to the array) in the cache."""
        if self.cache is not None:
            self.counts.misses += 1
            await asyncio.to_thread(self.cache.put, self.cache_key(key, coords), data)

    def key(self, block: tuple[int, ...]) -> str:
        """The store key of the shard holding chunk ``block`` (global chunk coordinates)."""
        return object_key(self.array, shard_of(block, self.per_shard))

    def local(self, block: tuple[int, ...]) -> Coords:
        """Coordinates of chunk ``block`` inside its shard."""
        return tuple(b % n for b, n in zip(block, self.per_shard, strict=True))

    async def fetch(self, key: str, coords: Sequence[Coords], whole: bool) -> dict[Coords, Buffer]:
        """The bytes of inner chunks ``coords`` of shard ``key`` (absent ones left out).

        ``whole``: the shard in one request; else its index, then the chunks'
        byte ranges, adjacent ranges merged, fetched concurrently.
        """
        prototype = buffer_prototype()
        size = self.index_size
        if whole:
            data = await self.store.get(key, prototype)
            if data is None:
                return {}
            raw = data[0:size] if self.index_at_start else data[len(data) - size : len(data)]
            spans = await self._spans(raw, coords)
            return {c: data[lo:hi] for c, (lo, hi) in spans.items()}
        request: ByteRequest = (
            RangeByteRequest(0, size) if self.index_at_start else SuffixByteRequest(size)
        )
        raw_index = await self.store.get(key, prototype, request)
        if raw_index is None:
            return {}
        spans = await self._spans(raw_index, coords)
        merged = _merged(spans.values())
        datas = await _all(
            [self.store.get(key, prototype, RangeByteRequest(lo, hi)) for lo, hi in merged]
        )
        found = {}
        for c, (lo, hi) in spans.items():
            for (start, stop), data in zip(merged, datas, strict=True):
                if data is not None and start <= lo and hi <= stop:
                    found[c] = data[lo - start : hi - start]
        return found

    async def _spans(
        self, raw_index: Buffer, coords: Sequence[Coords]
    ) -> dict[Coords, tuple[int, int]]:
        """The byte range of each stored chunk of ``coords``, from the shard's index."""
        index = await decode_shard_index(self.codec, raw_index, self.per_shard)
        spans = {}
        for c in coords:
            span = index.get_chunk_slice(c)
            if span:
                spans[c] = (int(span[0]), int(span[1]))
        return spans

    async def decode(self, chunks: Sequence[Decode], out: np.ndarray) -> None:
        """Decode inner chunks into ``out``: whole chunks of a plain zstd layout straight into
        their place (:meth:`_direct`), the others with the shard's inner codec pipeline."""
        if self.zstd is not None:
            chunks = await self._direct(chunks, out)
            if not chunks:
                return
        target = buffer_prototype().nd_buffer.from_numpy_array(out)
        batch = [
            (_Bytes(data), self.chunk_spec, chunk_selection, out_selection, True)
            for data, chunk_selection, out_selection in chunks
        ]
        await self.codec.codec_pipeline.read(batch, target)

    async def _direct(self, chunks: Sequence[Decode], out: np.ndarray) -> list[Decode]:
        """Decode each whole inner chunk whose place in ``out`` is contiguous straight into it
        (numcodecs' zstd, on a thread; issue 36: zarr's inner pipeline decoded into a chunk of
        its own and copied it into place, 1.3x the CPU of the same data unsharded); returns
        the others (a partial or absent chunk, a frame without its size), for the pipeline."""
        direct: list[tuple[Buffer, np.ndarray, Decode]] = []
        rest: list[Decode] = []
        for item in chunks:
            data, what, where = item
            region = out[where]
            whole = all(
                s.start in (0, None) and s.stop == n
                for s, n in zip(what, self.chunk_shape, strict=True)
            )
            if data is not None and whole and region.flags.c_contiguous:
                direct.append((data, region, item))
            else:
                rest.append(item)
        if direct:
            rest += await asyncio.to_thread(self._decode_into, direct)
        return rest

    def _decode_into(self, direct: Sequence[tuple[Buffer, np.ndarray, Decode]]) -> list[Decode]:
        assert self.zstd is not None
        left = []
        for data, region, item in direct:
            raw = data.as_numpy_array()
            if frame_size(raw) != region.nbytes:
                left.append(item)
                continue
            self.zstd(raw, out=region.reshape(-1).view(np.uint8))
        return left


def _inner_zstd(codec: Any, dtype: np.dtype) -> Callable[..., Any] | None:
    """numcodecs' zstd decode if the shard's inner codecs are exactly native ``bytes`` and
    ``zstd`` over a native numeric dtype (what :func:`~.direct.plain_zstd` asks unsharded)."""
    from zarr.codecs import BytesCodec, ZstdCodec

    inner = tuple(codec.codecs)
    if len(inner) != 2 or type(inner[0]) is not BytesCodec or type(inner[1]) is not ZstdCodec:
        return None
    if dtype.kind not in "biuf" or not dtype.isnative:
        return None
    if dtype.itemsize > 1 and bytes_endian(inner[0]) != sys.byteorder:
        return None
    import numcodecs

    zstd = inner[1]
    decode: Callable[..., Any] = numcodecs.Zstd.from_config(
        {"level": zstd.level, "checksum": zstd.checksum}
    ).decode
    return decode


async def read_shard_blocks(
    array: Any,
    blocks: Sequence[tuple[int, ...]],
    slices: Sequence[tuple[slice, ...]],
    outs: Sequence[np.ndarray] | None = None,
) -> list[np.ndarray]:
    """Chunks ``blocks`` (all in one shard; ``slices``: where each sits in the array), each
    decoded into an array of its own (``outs``, made by the caller, else here); the
    shard is fetched whole, in one request.

    ``array`` is the policy view of a sharded array (:func:`sharding_codec`).
    A missing shard reads as the fill value (the policy store records it).
    Every block is read: the cache was looked up above this read (the
    array's reader, ``store.reader_hook.CachedReader``, asks for its misses
    only); the chunks decoded are kept in it.
    """
    shards = _Shards(array)
    key = shards.key(blocks[0])
    locals_ = [shards.local(block) for block in blocks]
    found = await shards.fetch(key, locals_, whole=True)
    if outs is None:
        outs = [
            np.empty(tuple(s.stop - s.start for s in where), dtype=np.dtype(array.dtype))
            for where in slices
        ]

    async def one(coords: Coords, out: np.ndarray) -> None:
        kept = tuple(slice(0, n) for n in out.shape)
        await shards.decode([(found.get(coords), kept, kept)], out)
        if coords in found:  # not an absent chunk's fill value; the caller owns ``out``
            await shards.keep(key, coords, out.copy() if shards.cache is not None else out)

    await _all([one(coords, out) for coords, out in zip(locals_, outs, strict=True)])
    return list(outs)


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
    Shard rows are read ``shards_in_flight`` at a time.
    """
    shards = _Shards(array)
    rows: dict[int, list[tuple[ChunkPiece, int]]] = {}
    for piece, at in zip(pieces, starts, strict=True):
        rows.setdefault(piece.chunk // shards.per_shard[0], []).append((piece, at))
    limit = asyncio.Semaphore(max(1, shards_in_flight))
    window = _Window(shards, out, keeps_all, scatter)

    async def one_row(row: int, items: list[tuple[ChunkPiece, int]]) -> None:
        async with limit:
            await window.read_row(row, items)

    await _all([one_row(row, items) for row, items in rows.items()])


class _Window:
    """One window's output, filled shard row by shard row by :func:`read_sharded`."""

    def __init__(
        self,
        shards: _Shards,
        out: np.ndarray,
        keeps_all: Callable[[ChunkPiece], bool],
        scatter: Callable[[ChunkPiece, np.ndarray], None] | None,
    ) -> None:
        self.shards = shards
        self.out = out
        self.keeps_all = keeps_all
        self.scatter = scatter
        total, *counts = chunk_grid(shards.array)
        #: global chunk indices along the other axes, every combination
        self.others = list(itertools.product(*(range(n) for n in counts)))
        self.total = total  # axis-0 chunks
        #: inner chunks the cache held, by (shard key, local coordinates)
        self.held: dict[tuple[str, Coords], Any] = {}

    async def read_row(self, row: int, items: list[tuple[ChunkPiece, int]]) -> None:
        """Fetch shard row ``row`` once (each of its objects) and decode its pieces."""
        per_shard = self.shards.per_shard
        locals_ = [piece.chunk % per_shard[0] for piece, _ in items]
        existing = min(per_shard[0], self.total - row * per_shard[0])
        whole = reads_whole_shard(len(locals_), existing)
        keys = {self._key(row, rest): None for rest in self.others}
        coords = _coords(locals_, per_shard)
        self.held.update(await self.shards.held([(k, c) for k in keys for c in coords]))
        wanted = {k: [c for c in coords if (k, c) not in self.held] for k in keys}
        found = await _all(
            [self.shards.fetch(k, wanted[k], whole) if wanted[k] else _nothing() for k in keys]
        )
        chunks = dict(zip(keys, found, strict=True))
        await _all([self._decode(piece, at, chunks) for piece, at in items])

    def _key(self, row: int, rest: tuple[int, ...]) -> str:
        return self.shards.key((row * self.shards.per_shard[0], *rest))

    async def _decode(
        self, piece: ChunkPiece, at: int, chunks: dict[str, dict[Coords, Buffer]]
    ) -> None:
        """Decode axis-0 chunk ``piece`` (every chunk of its row) and place its kept rows."""
        shards, out = self.shards, self.out
        whole = self.keeps_all(piece) and self.scatter is None
        target, lo = (out, at) if whole else (self._temp(piece), 0)
        row = piece.chunk // shards.per_shard[0]
        batch: list[Decode] = []
        kept: list[tuple[str, Coords, tuple[slice, ...], tuple[slice, ...]]] = []
        for rest in self.others:
            widths = [
                min(c, s - g * c)
                for g, c, s in zip(rest, shards.chunk_shape[1:], shards.shape[1:], strict=True)
            ]
            chunk_selection = (slice(0, piece.rows), *(slice(0, w) for w in widths))
            out_selection = (
                slice(lo, lo + piece.rows),
                *(
                    slice(g * c, g * c + w)
                    for g, c, w in zip(rest, shards.chunk_shape[1:], widths, strict=True)
                ),
            )
            key, coords = self._key(row, rest), shards.local((piece.chunk, *rest))
            if (key, coords) in self.held:
                target[out_selection] = self.held[(key, coords)]
                continue
            data = chunks[key].get(coords)
            if shards.cache is not None and data is not None:  # decoded apart, then kept
                kept.append((key, coords, chunk_selection, out_selection))
            batch.append((data, chunk_selection, out_selection))
        if kept:
            await self._decode_kept(batch, kept, target, chunks)
        else:
            await shards.decode(batch, target)
        if not whole:
            rows = target[piece.take]
            if self.scatter is not None:
                self.scatter(piece, rows)
            else:
                out[at : at + len(rows)] = rows

    async def _decode_kept(
        self,
        batch: list[Decode],
        kept: list[tuple[str, Coords, tuple[slice, ...], tuple[slice, ...]]],
        target: np.ndarray,
        chunks: dict[str, dict[Coords, Buffer]],
    ) -> None:
        """Decode a chunk row's inner chunks each into its own array, keep them, then place them."""
        shards = self.shards
        caching = {id(out_selection) for *_, out_selection in kept}
        rest = [item for item in batch if id(item[2]) not in caching]
        if rest:
            await shards.decode(rest, target)
        for key, coords, chunk_selection, out_selection in kept:
            shape = tuple(s.stop - s.start for s in chunk_selection)
            alone = np.empty(shape, dtype=target.dtype)
            await shards.decode([(chunks[key][coords], chunk_selection, chunk_selection)], alone)
            await shards.keep(key, coords, alone)
            target[out_selection] = alone

    def _temp(self, piece: ChunkPiece) -> np.ndarray:
        """A chunk-sized buffer for a chunk of which the window keeps some rows."""
        return np.empty((piece.rows, *self.shards.shape[1:]), dtype=self.out.dtype)


async def _nothing() -> dict[Coords, Buffer]:
    return {}


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


def _merged(spans: Any) -> list[tuple[int, int]]:
    """Byte ranges, sorted, with adjacent or overlapping ones merged."""
    merged: list[list[int]] = []
    for lo, hi in sorted(spans):
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return [(lo, hi) for lo, hi in merged]


def _coords(locals_: list[int], per_shard: tuple[int, ...]) -> list[Coords]:
    """Inner chunk coordinates of axis-0 chunks ``locals_`` of a shard, in every other axis."""
    others = itertools.product(*(range(n) for n in per_shard[1:]))
    return [(local, *rest) for rest in list(others) for local in sorted(locals_)]
