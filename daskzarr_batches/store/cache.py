"""A cache of decoded chunks: later epochs read memory or a local disk, not the store.

:class:`ChunkCache` keeps decoded chunks in a least-recently-used store in
memory and, with a ``directory``, spills them to files there (LRU within the
disk budget too) that survive the process and can be shared by several
processes at once (ranks and DataLoader workers on one node); each tier
(memory, disk, cluster) is a class of ``cache_tiers`` that it composes.  Reads consult
it through :class:`CachingPipeline`, Zarr's own codec pipeline with a
chunk's fetch and decode replaced by a cache lookup when the cache holds it,
so every read path that goes through Zarr's pipeline (batch windows, chunk
streams, patches) is served alike.

Keys are made of the store's identity, the array's path, a hash of its
metadata (shape, chunks, dtype, codecs, fill value), the versions of its
stored objects (looked up once per stream: :func:`array_token`) and the
chunk's store key: a changed array, rewritten in place too, is never served
from the cache (a ``MemoryStore``'s in-place rewrite excepted: see
docs/cache.md).  Files are written to a temporary name of the writing
process and renamed into place (a reader never sees a partial file) and
carry their key, shape, dtype, order, size and a CRC-32 of header and bytes,
checked on every read: a damaged file is dropped, counted and read again
from the store.  A disk that fills (or a read-only directory) stops the
cache's writes with one warning; a chunk larger than a budget is not cached
there.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import threading
import uuid
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zarr
import zarr.storage

from ..errors import ArgumentTypeError, ArgumentValueError
from . import cache_keys

# Re-exported: these names were this module's before the file format and keys moved out.
from .cache_file import (  # noqa: F401
    _CRC,
    _FIELDS,
    _FORMAT_1,
    _HEADER,
    _MAX_HEADER,
    MAGIC,
    _bytes,
    _header,
    _made,
    _OldFormat,
    _read_file,
)
from .cache_keys import (  # noqa: F401
    _NUMBERED,
    _NUMBERED_LOCK,
    _NUMBERS,
    KeptPart,
    _listed_versions,
    _new_process,
    _object_number,
    _stored_versions,
    _version,
    array_token,
    block_name,
    chunk_name,
    inner_chunk_name,
    kept_part,
    rows_name,
)
from .cache_tiers import _DIRECTORY_ERRNOS, ClusterTier, DiskTier, MemoryTier  # noqa: F401
from .zarr_adapter import (
    BatchedCodecPipeline,
    concurrent_map,
    fill_value_or_default,
    read_results,
)

__all__ = [
    "CacheCounts",
    "CachingPipeline",
    "ChunkCache",
    "KeptPart",
    "array_token",
    "block_name",
    "byte_size",
    "chunk_name",
    "inner_chunk_name",
    "kept_part",
    "rows_name",
]


def __getattr__(name: str) -> Any:
    """``_PROCESS``, this process's identity (``cache_keys``'s: new in a forked child)."""
    if name == "_PROCESS":
        return cache_keys._PROCESS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: Every cache made in this process, by id: a cache sent to a worker finds its twin there.
#: Caches made by their users are held weakly (one dropped releases its cluster futures);
#: twins made by unpickling (a worker's) live as long as the process.
_REGISTRY: weakref.WeakValueDictionary[str, ChunkCache] = weakref.WeakValueDictionary()
_TWINS: dict[str, ChunkCache] = {}
_REGISTRY_LOCK = threading.Lock()


def byte_size(name: str, value: object, allow_none: bool = False) -> int | None:
    """``value`` (bytes as an int, or a string such as ``"2GiB"``) as an int >= 0."""
    if value is None and allow_none:
        return None
    if isinstance(value, str):
        from dask.utils import parse_bytes

        try:
            value = parse_bytes(value)
        except (ValueError, TypeError) as error:
            raise ArgumentValueError(f"{name}={value!r} is not a size like '2GiB'") from error
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ArgumentTypeError(
            f"{name} must be bytes (an int) or a size like '2GiB', got {value!r}"
        )
    if int(value) < 0:
        raise ArgumentValueError(f"{name} must be >= 0 bytes, got {value!r}")
    return int(value)


@dataclass
class CacheCounts:
    """What one read task's cache lookups found (travels back with its report)."""

    hits: int = 0
    misses: int = 0
    bytes_hit: int = 0
    damaged: int = 0


class ChunkCache:
    """Decoded chunks kept in memory and, optionally, on a local disk.

    Parameters
    ----------
    memory : int or str, default "1GiB"
        Bytes of decoded chunks kept in memory (``0``: none), least recently
        used first out.
    directory : str or os.PathLike, optional
        Where chunks spill to (and are kept across processes and runs);
        several processes may share it.  ``None``: memory only.
    disk : int or str, optional
        Bytes the directory may hold; ``None``: until the disk is full.

    Notes
    -----
    Pass it as ``cache=`` to a stream, a ``Loader`` or a per-chunk job; one
    cache can serve several streams, epochs and arrays.

    On a ``distributed`` cluster, every stream and per-chunk job reading
    Zarr arrays keeps its decoded chunks (a batch window's axis-0 chunks, a
    chunk or patch stream's stored blocks or whole shards) as cluster
    futures this object holds (in the workers' memory, spilled by dask
    under pressure), up to ``memory`` bytes in total, least recently used
    released first; the tasks cutting windows, blocks or patches depend on
    them and run where they live.  [`clear`][daskzarr_batches.ChunkCache.clear], or dropping the
    cache,
    releases them.  It holds chunks as
    decoded (the codecs' output), keyed so that an array rewritten (with
    other metadata, or in place with the same) is never served from it: each
    stream looks up the version of every object under the array's prefix
    (an ``os.stat`` per stored chunk on a local store, one listing on an object
    store).  **An array in a** ``MemoryStore`` **rewritten in place with the
    same metadata is not detected**, nor one in a store of your own ``Store``
    class (it gets its metadata's version alone): call
    [`clear`][daskzarr_batches.ChunkCache.clear] after
    such a write.

    Raises
    ------
    ArgumentValueError
        ``directory`` is a file, or cannot be created (the error names it).
    """

    def __init__(
        self,
        memory: int | str = "1GiB",
        directory: str | os.PathLike[str] | None = None,
        disk: int | str | None = None,
    ) -> None:
        self.memory: int = byte_size("memory", memory) or 0
        self.disk = byte_size("disk", disk, allow_none=True)
        if directory is not None and not isinstance(directory, str | os.PathLike):
            raise ArgumentTypeError(f"directory must be a path or None, got {directory!r}")
        if disk is not None and directory is None:
            raise ArgumentValueError(f"disk={disk!r} needs a directory to spill to")
        self.directory = None if directory is None else _made(Path(directory))
        self.id = uuid.uuid4().hex
        self._init_state()
        with _REGISTRY_LOCK:
            _REGISTRY[self.id] = self

    def _init_state(self) -> None:
        self._lock = threading.Lock()  # shared by the tiers: each guards its state with it
        self._memory = MemoryTier(self.memory, self._lock)
        self._disk = (
            None if self.directory is None else DiskTier(self.directory, self.disk, self._lock)
        )
        self._cluster = ClusterTier(self.memory, self._lock)

    def __reduce__(self) -> Any:
        return (_cache_of, (self.id, self.memory, str(self.directory) if self.directory else None,
                            self.disk))  # fmt: skip

    def __repr__(self) -> str:
        where = f", directory={str(self.directory)!r}, disk={self.disk}" if self.directory else ""
        return f"ChunkCache(memory={self.memory}{where}; {len(self._memory)} chunks in memory)"

    # ---------------------------------------------------------------- lookups

    def key(self, token: str, chunk_key: str) -> str:
        """The cache key of store key ``chunk_key`` of the array ``token`` names."""
        return hashlib.blake2b(f"{token}\0{chunk_key}".encode(), digest_size=16).hexdigest()

    def get(
        self, key: str, counts: CacheCounts | None = None, disk: bool = True
    ) -> np.ndarray | None:
        """The chunk ``key`` from memory or (``disk``) the directory, else ``None``."""
        found = self._memory.get(key)
        if found is None and disk and self._disk is not None:
            found = self._disk.load(key, counts)
            if found is not None:
                self._memory.remember(key, found)
        return found

    def contains(self, key: str) -> bool:
        """Whether the chunk is in memory, on the cluster or has a file (not checked)."""
        if self._memory.has(key) or self._cluster.has(key):
            return True
        return self._disk is not None and self._disk.has(key)

    def holds(self, token: str, names: Iterable[str]) -> bool:
        """Whether every chunk ``names`` (store-side names, `chunk_name`) is held.

        Looks at the memory and the directory's file names only (no file is
        read or checked), so a plan can say what the cache holds without I/O
        beyond a directory lookup per chunk.
        """
        return all(self.contains(self.key(token, name)) for name in names)

    def put(self, key: str, data: np.ndarray) -> None:
        """Keep a decoded chunk (in memory, and in the directory if there is one)."""
        data = np.ascontiguousarray(data)
        data.setflags(write=False)
        self._memory.remember(key, data)
        if self._disk is not None:
            self._disk.store(key, data)

    def take_write_error(self) -> str | None:
        """Why the directory could not be written, the first time it is asked (else ``None``).

        Streams ask on the consumer's side and warn
        ([`CacheWarning`][daskzarr_batches.CacheWarning]),
        once per cache in a process; the reads never warn from their threads.
        """
        return None if self._disk is None else self._disk.take_write_error()

    def clear(self) -> None:
        """Forget every chunk, in memory, on the cluster and in the directory."""
        self._memory.clear()
        self.release_cluster()
        if self._disk is not None:
            self._disk.clear()

    # ---------------------------------------------------------------- cluster

    def cluster_chunk(
        self, key: str, owner: str, nbytes: int, make: Callable[[bool], Any]
    ) -> tuple[Any, bool]:
        """The cluster future of chunk ``key`` (of client ``owner``), made by ``make`` if needed.

        Returns the future and whether it was made now (a miss).  A future of
        another client, or one that failed or was cancelled, is made again
        (``make(True)``: under a new task key, as the scheduler may still hold
        the failed one).
        Futures are kept up to ``memory`` bytes in total (``nbytes`` each),
        least recently used released first; a chunk larger than the budget is
        not kept (its future lives as long as the tasks that need it).
        """
        return self._cluster.chunk(key, owner, nbytes, make)

    def release_cluster(self) -> None:
        """Release every cluster future of a decoded chunk (workers drop them)."""
        self._cluster.release()

    @property
    def cluster_chunks(self) -> int:
        """Decoded chunks this cache keeps on a cluster (futures held)."""
        return len(self._cluster)


def _cache_of(cache_id: str, memory: int, directory: str | None, disk: int | None) -> ChunkCache:
    """The cache ``cache_id`` in this process: itself, or its twin made here (a worker's)."""
    with _REGISTRY_LOCK:
        found = _REGISTRY.get(cache_id) or _TWINS.get(cache_id)
    if found is not None:
        return found
    cache = ChunkCache.__new__(ChunkCache)
    cache.memory, cache.disk, cache.id = memory, disk, cache_id
    cache.directory = None if directory is None else _made(Path(directory))
    cache._init_state()
    with _REGISTRY_LOCK:
        return _TWINS.setdefault(cache_id, cache)


@dataclass(frozen=True)
class CachingPipeline(BatchedCodecPipeline):
    """Zarr's codec pipeline, with chunks served from a :class:`ChunkCache` when held.

    A chunk the cache holds is copied from it (no fetch, no decode); the
    others are fetched and decoded as Zarr does, and kept in the cache (not
    a chunk absent from the store: its fill value is not a chunk).  A sharded
    array read through Zarr's pipeline (patch streams; batch windows and
    chunk streams use the shard reader, which keeps inner chunks) keeps each
    shard decoded whole.
    """

    cache: Any = None
    token: str = ""
    counts: Any = None

    @classmethod
    def of(
        cls, inner: BatchedCodecPipeline, cache: ChunkCache, token: str, counts: CacheCounts
    ) -> CachingPipeline:
        fields = {f.name: getattr(inner, f.name) for f in dataclasses.fields(inner)}
        return cls(**fields, cache=cache, token=token, counts=counts)

    async def read_batch(
        self,
        batch_info: Iterable[tuple[Any, Any, Any, Any, bool]],
        out: Any,
        drop_axes: tuple[int, ...] = (),
    ) -> Any:
        if self.cache is None:
            return await super().read_batch(batch_info, out, drop_axes)
        import asyncio

        batch = list(batch_info)
        whole_shards = self.supports_partial_decode  # sharded: a shard decoded whole is kept
        cache, counts = self.cache, self.counts
        keys = [cache.key(self.token, getter.path) for getter, *_ in batch]
        found: list[Any] = [None] * len(batch)
        for i, key in enumerate(keys):
            found[i] = cache.get(key, counts, disk=False)
            if found[i] is None and cache.directory is not None:  # a blocking file read
                found[i] = await asyncio.to_thread(cache.get, key, counts)
        misses = [i for i, data in enumerate(found) if data is None]
        if misses:
            if whole_shards:  # every inner chunk of the shard (absent: not kept)
                decoded = await self.decode_partial_batch(
                    [
                        (batch[i][0], tuple(slice(0, n) for n in batch[i][1].shape), batch[i][1])
                        for i in misses
                    ]
                )
                fetched: list[Any] = [() if chunk is not None else None for chunk in decoded]
            else:
                fetched = await concurrent_map(
                    [(batch[i][0], batch[i][1].prototype) for i in misses],
                    lambda getter, prototype: getter.get(prototype),
                    zarr.config.get("async.concurrency"),
                )
                decoded = await self.decode_batch(
                    [(raw, batch[i][1]) for raw, i in zip(fetched, misses, strict=True)]
                )
            for i, raw, chunk in zip(misses, fetched, decoded, strict=True):
                if chunk is None or raw is None:
                    continue  # absent from the store: filled, not cached
                data = np.asarray(chunk.as_ndarray_like())
                found[i] = data
                await asyncio.to_thread(cache.put, keys[i], data)
        for i, ((_, spec, chunk_selection, out_selection, _), data) in enumerate(
            zip(batch, found, strict=True)
        ):
            if data is None:
                out[out_selection] = fill_value_or_default(spec)
                continue
            if counts is not None:
                if i in misses:
                    counts.misses += 1
                else:
                    counts.hits += 1
                    counts.bytes_hit += data.nbytes
            part = data[chunk_selection]
            if drop_axes:
                part = part.squeeze(axis=drop_axes)
            out[out_selection] = part
        return read_results([data is not None for data in found])
