"""Plain chunks decoded straight into the caller's rows, beside Zarr's own pipeline.

Zarr's pipeline decodes a chunk into an array of its own and then copies it
into the output on its event loop, one chunk after another; for a window of a
sequential or buffered stream that copy, the fresh pages of each decoded
chunk and the pipeline's machinery cost about as much CPU as decoding
(docs/benchmarks.md, *Steady epochs and CPU above decode*).  For the common
layout, a Zarr v3 array of numbers stored as ``bytes`` (native byte order) +
``zstd``, one chunk across every axis but the first, unsharded,
:func:`direct_reader` gives a reader that fetches each chunk's bytes through
the array's store (the read policy's ``PolicyStore``: retries, missing
chunks, request limit) and decompresses them into the output rows they fill.
Anything else, or any surprise (a frame that does not say its size, or says
another one), is left to Zarr's pipeline: the reader raises and the read
layer reads the window again through Zarr.
"""

from __future__ import annotations

import asyncio
import functools
import os
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr
import zarr.storage

from .layout import metadata_key
from .policy import Ledger, PolicyStore, ReadPolicy
from .threads import zarr_loop
from .zarr_adapter import (
    buffer_prototype,
    bytes_endian,
    codec_pipeline,
    encode_chunk_key,
    is_regular_grid,
    is_zarr_pipeline,
)

__all__ = [
    "DirectDecoder",
    "DirectLayout",
    "concurrency_limit",
    "direct_reader",
    "frame_size",
    "plain_zstd",
]

#: The magic number that starts a zstd frame (little-endian).
_ZSTD_MAGIC = 0xFD2FB528


@dataclass(frozen=True)
class DirectLayout:
    """What :class:`DirectDecoder` needs of an array of :func:`plain_zstd` layout, read once.

    Everything but the store: a collection keeps one per member and gives
    each window's read a reader over its own policy store
    (:meth:`reader`), without a Zarr array view per member and window.
    """

    path: str
    encode_key: Callable[[tuple[int, ...]], str]
    chunk_rows: int
    rest: tuple[int, ...]
    dtype: np.dtype
    decode: Callable[..., Any]
    prototype: Any
    fill_value: Any
    metadata_key: str | None

    @classmethod
    def of(cls, array: Any) -> DirectLayout | None:
        """``array``'s layout if it is :func:`plain_zstd` (whatever pipeline reads it)."""
        codec = plain_zstd(array)
        if codec is None:
            return None
        import numcodecs

        zstd = numcodecs.Zstd.from_config({"level": codec.level, "checksum": codec.checksum})
        return cls(
            path=array.store_path.path,
            encode_key=encode_chunk_key(array),
            chunk_rows=int(array.chunks[0]),
            rest=tuple(array.shape[1:]),
            dtype=np.dtype(array.dtype),
            decode=zstd.decode,
            prototype=buffer_prototype(),
            fill_value=np.asarray(array.fill_value, dtype=array.dtype)[()],
            metadata_key=metadata_key(array),
        )

    def reader(self, store: Any) -> DirectDecoder:
        """A reader of the array's chunks through ``store`` (its own store, or a wrapper)."""
        return DirectDecoder(self, zarr.storage.StorePath(store, self.path))

    def policy_reader(
        self, array: zarr.Array, name: str, policy: ReadPolicy, ledger: Ledger
    ) -> DirectDecoder:
        """A reader of ``array`` (of this layout) through a :class:`PolicyStore` of its own.

        What a read task uses instead of a Zarr view per read (``policy_view``):
        ``policy`` applied to every fetch and recorded in ``ledger``.  Not for a
        policy with a cache, which only Zarr's pipeline consults.
        """
        zarr_loop()  # Zarr's blocking I/O on daemon threads, before any read of a task
        store = PolicyStore(array.store_path.store, policy, ledger, name, self.metadata_key)
        return self.reader(store)


class DirectDecoder:
    """Reads whole axis-0 chunks of one array (a policy view) into output rows."""

    def __init__(self, layout: DirectLayout, store_path: Any) -> None:
        self.store_path = store_path
        self.encode_key = layout.encode_key
        self.chunk_rows = layout.chunk_rows
        self.rest = layout.rest
        self.dtype = layout.dtype
        self.ndim = len(layout.rest) + 1
        self.decode = layout.decode
        self.prototype = layout.prototype
        self.fill_value = layout.fill_value

    async def read(
        self,
        spans: Sequence[tuple[int, int]],
        targets: Sequence[np.ndarray],
        limit: asyncio.Semaphore | int | None = None,
        takes: Sequence[np.ndarray | None] | None = None,
        keep_buffers: bool = True,
    ) -> None:
        """Rows ``start:stop`` of each span (within one stored chunk) into its target.

        ``takes``: per span, ``None`` (every row of the span) or the rows to
        keep, counted from the span's start, in the order to write them
        (an exact shuffle's kept rows: gathered from the decoded chunk).
        Chunks are fetched and decoded concurrently (decoding on the event
        loop's executor), at most ``limit`` (a count, at most Zarr's
        ``async.concurrency``, which is the default) at once; readers of
        several arrays may share one ``limit`` (a semaphore).  A failure
        cancels the others.  ``keep_buffers``: the file and scratch-chunk
        buffers are the process's reused ones (kept for the next reads), else
        fresh ones freed after each chunk (an exact window, whose memory is
        budgeted: ``memory_budget``).
        """
        pools = (_SCRATCH, _CHUNKS) if keep_buffers else (_FRESH, _FRESH)
        if not isinstance(limit, asyncio.Semaphore):
            limit = concurrency_limit(limit)
        if takes is None:
            takes = [None] * len(spans)

        async def one(span: tuple[int, int], target: np.ndarray, take: np.ndarray | None) -> None:
            async with limit:
                await self._one(span, target, take, pools)

        async with asyncio.TaskGroup() as group:
            for span, target, take in zip(spans, targets, takes, strict=True):
                group.create_task(one(span, target, take))

    async def _one(
        self,
        span: tuple[int, int],
        target: np.ndarray,
        take: np.ndarray | None = None,
        pools: tuple[_Scratch, _Scratch] | None = None,
    ) -> None:
        files, chunks = (_SCRATCH, _CHUNKS) if pools is None else pools
        start, stop = span
        chunk, offset = divmod(start, self.chunk_rows)
        if stop - start > self.chunk_rows - offset:
            raise ValueError(f"rows {start}:{stop} cross a chunk boundary")
        key = self.encode_key((chunk,) + (0,) * (self.ndim - 1))
        where = self.store_path / key
        store = where.store
        base = store.base if isinstance(store, PolicyStore) else None
        whole = take is None and offset == 0 and stop - start == self.chunk_rows
        if type(base) is zarr.storage.LocalStore:
            # the file read into a reused buffer (a fresh bytes object per chunk is a
            # fresh mapping from the C heap, faulted in page by page: issue 20) and
            # decoded by the same thread call (one hand-off per chunk, not two)
            path = os.path.join(os.fspath(base.root), where.path)
            decode = functools.partial(
                self._decode, target=target, whole=whole, offset=offset, take=take, chunks=chunks
            )
            read = await store.get_with(where.path, _read_local, path, decode, files)
            if read is None:  # absent (recorded by the policy store): Zarr's fill value
                target[...] = self.fill_value
                return
            scratch, error = read
            files.give(scratch)  # the decode is done with it (a cancelled one never is)
            if error is not None:
                raise error
            return
        data = await where.get(prototype=self.prototype)
        if data is None:
            target[...] = self.fill_value
            return
        raw = data.as_numpy_array()
        await asyncio.to_thread(self._decode, raw, target, whole, offset, take, chunks)

    def _decode(
        self,
        raw: np.ndarray,
        target: np.ndarray,
        whole: bool,
        offset: int,
        take: np.ndarray | None = None,
        chunks: _Scratch | None = None,
    ) -> None:
        chunks = _CHUNKS if chunks is None else chunks
        nbytes = self.chunk_rows * int(np.prod(self.rest, dtype=np.int64)) * self.dtype.itemsize
        if frame_size(raw) != nbytes:
            raise ValueError("the chunk's zstd frame does not give the chunk's size")
        if whole and target.flags.c_contiguous:
            self.decode(raw, out=target.reshape(-1).view(np.uint8))
            return
        # a chunk kept in part: decoded into a reused scratch chunk, its rows copied out
        scratch = chunks.take(nbytes)
        try:
            flat = np.frombuffer(scratch, dtype=np.uint8, count=nbytes)
            self.decode(raw, out=flat)
            chunk = flat.view(self.dtype).reshape(self.chunk_rows, *self.rest)
            if take is None:
                target[...] = chunk[offset : offset + len(target)]
            else:  # mode="clip": no buffered copy of the rows (take is within the chunk)
                np.take(chunk[offset:], take, axis=0, out=target, mode="clip")
        finally:
            chunks.give(scratch)


def concurrency_limit(most: int | None = None) -> asyncio.Semaphore:
    """A limit of chunk reads at once: Zarr's ``async.concurrency``, or ``most`` if fewer."""
    limit = max(1, int(zarr.config.get("async.concurrency") or 10))
    return asyncio.Semaphore(limit if most is None else max(1, min(most, limit)))


class _Scratch:
    """Byte buffers for chunk files read by the process, reused (at most ``keep`` kept free)."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self._free: list[bytearray] = []
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> bytearray:
        with self._lock:
            for i, buffer in enumerate(self._free):
                if len(buffer) >= nbytes:
                    return self._free.pop(i)
        return bytearray(max(nbytes, 1))

    def give(self, buffer: bytearray) -> None:
        with self._lock:
            if len(self._free) < self.keep:
                self._free.append(buffer)


#: Scratch buffers of chunk files being decoded: as many as Zarr's loop has threads, about.
_SCRATCH = _Scratch(keep=16)

#: Scratch chunks decoded for a part of their rows (a chunk cut by a window's border).
_CHUNKS = _Scratch(keep=8)

#: Buffers of reads whose memory is budgeted (an exact window's): fresh, never kept.
_FRESH = _Scratch(keep=0)


async def _read_local(
    key: str, path: str, decode: Callable[[np.ndarray], None], files: _Scratch
) -> tuple[bytearray, Exception | None] | None:
    """Local chunk file ``path`` read into a buffer of ``files`` and decoded by ``decode``.

    ``None`` if the file is absent, as ``LocalStore.get`` says it, so the
    policy store sees the same; else the scratch buffer and the decode's
    error, if any (returned, not raised: the policy store retries a failed
    read, never a chunk that does not decode).  Run on the event loop's
    executor, as ``LocalStore.get`` reads.
    """
    return await asyncio.to_thread(_read_and_decode, path, decode, files)


def _read_and_decode(
    path: str, decode: Callable[[np.ndarray], None], files: _Scratch
) -> tuple[bytearray, Exception | None] | None:
    read = _read_file(path, files)
    if read is None:
        return None
    raw, buffer = read
    try:
        decode(raw)
    except Exception as exc:
        return buffer, exc
    return buffer, None


def _read_file(path: str, files: _Scratch | None = None) -> tuple[np.ndarray, bytearray] | None:
    try:
        file = open(path, "rb")  # noqa: SIM115  (closed below)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None
    with file:
        size = os.fstat(file.fileno()).st_size
        buffer = (files or _SCRATCH).take(size + 1)  # one more: a file that grew is seen
        view = memoryview(buffer)
        got = 0
        while True:
            n = file.readinto(view[got:])
            if not n:
                break
            got += n
            if got == len(buffer):  # larger than its size said: read the rest apart
                rest = file.read()
                buffer = bytearray(buffer) + rest
                got += len(rest)
                break
    return np.frombuffer(buffer, dtype=np.uint8, count=got), buffer


def direct_reader(array: Any) -> DirectDecoder | None:
    """A :class:`DirectDecoder` for ``array`` read by Zarr's own pipeline, or ``None``.

    Only an array of :func:`plain_zstd` layout read by zarr-python's
    ``BatchedCodecPipeline`` itself (not zarrs, not a caching pipeline).
    """
    if not isinstance(array, zarr.Array):
        return None
    if not is_zarr_pipeline(codec_pipeline(array), exactly=True):
        return None
    layout = DirectLayout.of(array)
    return None if layout is None else layout.reader(array.store_path.store)


def plain_zstd(array: Any) -> Any:
    """``array``'s zstd codec if its chunks can be decoded directly, else ``None``.

    A Zarr v3 array, unsharded, on a regular grid with one chunk across every
    axis but the first, of a native numeric dtype, whose codecs are exactly
    ``bytes`` (native order) and ``zstd``, whatever pipeline reads it.
    """
    if not isinstance(array, zarr.Array):
        return None
    from zarr.codecs import BytesCodec, ZstdCodec

    metadata = array.metadata
    if metadata.zarr_format != 3 or array.shards is not None or not array.shape:
        return None
    if not is_regular_grid(array):
        return None
    if tuple(array.chunks[1:]) != tuple(array.shape[1:]):
        return None
    dtype = np.dtype(array.dtype)
    if dtype.kind not in "biuf" or not dtype.isnative:
        return None
    serializer, compressors = array.serializer, tuple(array.compressors)
    if array.filters or type(serializer) is not BytesCodec:
        return None
    if len(compressors) != 1 or type(compressors[0]) is not ZstdCodec:
        return None
    if dtype.itemsize > 1 and bytes_endian(serializer) != sys.byteorder:
        return None
    return compressors[0]


def frame_size(data: Any) -> int | None:
    """The content size a zstd frame's header gives, or ``None`` (not a frame, or no size)."""
    head = bytes(memoryview(data)[:18])
    if len(head) < 6 or int.from_bytes(head[:4], "little") != _ZSTD_MAGIC:
        return None
    descriptor = head[4]
    fcs_flag, single = descriptor >> 6, (descriptor >> 5) & 1
    at = 5 + (0 if single else 1) + (0, 1, 2, 4)[descriptor & 3]
    width = (1 if single else 0, 2, 4, 8)[fcs_flag]
    if width == 0 or len(head) < at + width:
        return None
    size = int.from_bytes(head[at : at + width], "little")
    return size + 256 if width == 2 else size
