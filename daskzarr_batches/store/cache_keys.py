"""What the chunk cache keeps chunks under: array tokens and chunk and part names.

:func:`array_token` (the store's identity, the array's path, a hash of its
metadata and the versions of its stored objects), the names a decoded
chunk is kept under (:func:`chunk_name`, :func:`inner_chunk_name`) and what
a cluster keeps for a stored block (:func:`kept_part`).  No cache state:
that is ``store/cache.py``'s and its tiers' (``store/cache_tiers.py``).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import threading
import uuid
import weakref
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

import zarr
import zarr.storage

from .layout import chunks_per_shard, metadata_key, object_key, shard_of
from .versions import blocking_fs, object_versions
from .zarr_adapter import unwrapped_store

#: This process's identity in keys of in-memory stores (not shared between processes);
#: a forked child makes its own (_new_process), as it would after an import.
_PROCESS = f"{os.getpid()}-{uuid.uuid4().hex}"


def _new_process() -> None:
    global _PROCESS
    _PROCESS = f"{os.getpid()}-{uuid.uuid4().hex}"


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_new_process)


def rows_name(start: int, stop: int) -> str:
    """The name a cluster keeps rows ``start:stop`` (one axis-0 chunk, every column) under."""
    return f"rows:{start}:{stop}"


def block_name(block: tuple[int, ...]) -> str:
    """The name a cluster keeps a part of stored blocks from ``block`` on under (not rows)."""
    return f"block:{','.join(map(str, block))}"


class KeptPart(NamedTuple):
    """What a cache keeps on a cluster for one stored block of a Zarr array (:func:`kept_part`).

    ``name`` (before its token), the stored ``blocks`` it holds, where each
    sits in the array (``slices``), the ``region`` they cover together, and
    whether it is the rows of one axis-0 chunk (``rows``: batch windows keep
    the same part).
    """

    name: str
    blocks: tuple[tuple[int, ...], ...]
    slices: tuple[tuple[slice, ...], ...]
    region: tuple[slice, ...]
    rows: bool


def kept_part(source: Any, block: tuple[int, ...]) -> KeptPart:
    """The part of ``source`` (a Zarr array's) kept on a cluster for stored ``block``.

    A block's stored object, decoded: for a sharded array, every inner
    block of its shard (one fetch of the shard); for a block spanning every
    column, its axis-0 chunk's rows (:func:`rows_name`, as batch windows
    keep them); else the block alone.
    """
    whole = source.block_slices(block)
    if source.array.shards is not None:
        per_shard = chunks_per_shard(source.array)
        ranges = [
            range(b // n * n, min(b // n * n + n, len(sizes)))
            for b, n, sizes in zip(block, per_shard, source.chunks, strict=True)
        ]
        blocks = tuple(itertools.product(*ranges))
        slices = tuple(source.block_slices(b) for b in blocks)
        region = tuple(
            slice(min(s[axis].start for s in slices), max(s[axis].stop for s in slices))
            for axis in range(len(whole))
        )
        return KeptPart(block_name(blocks[0]), blocks, slices, region, False)
    if all(s.start == 0 and s.stop == n for s, n in zip(whole[1:], source.shape[1:], strict=True)):
        return KeptPart(rows_name(whole[0].start, whole[0].stop), (block,), (whole,), whole, True)
    return KeptPart(block_name(block), (block,), (whole,), whole, False)


def inner_chunk_name(shard_key: str, coords: Iterable[int]) -> str:
    """The name an inner chunk (local ``coords`` in shard ``shard_key``) is kept under."""
    return f"{shard_key}#{','.join(map(str, coords))}"


def chunk_name(array: zarr.Array, block: tuple[int, ...], whole_shards: bool = False) -> str:
    """The name the decoded chunk ``block`` of ``array`` is kept under (before its token).

    An unsharded chunk's store key; a sharded array's inner chunk as the
    shard reader keeps it (:func:`inner_chunk_name`), or, ``whole_shards``,
    the shard's store key (Zarr's pipeline keeps shards decoded whole:
    patch streams).
    """
    if array.shards is None:
        return object_key(array, block)
    per_shard = chunks_per_shard(array)
    shard = object_key(array, shard_of(block, per_shard))
    if whole_shards:
        return shard
    return inner_chunk_name(shard, (b % n for b, n in zip(block, per_shard, strict=True)))


def array_token(array: zarr.Array) -> str:
    """What identifies an array's chunks in a cache: its store, path, metadata and versions.

    The versions are those of the array's metadata document and of every
    object stored under the array's prefix (a local file's size,
    modification time and inode; an object's ETag, last-modified date and
    size: one listing of the prefix, :func:`_stored_versions`), so an array
    written again, in place with the same metadata too, gets new keys and
    is read again from its store.  In-memory stores exist in one process
    only: their token names the process and the store object (a number
    never reused, not its ``id``).  Computed once per stream (so once per
    epoch), on the client.
    """
    store = unwrapped_store(array.store_path.store)
    where = str(store)
    if isinstance(store, zarr.storage.MemoryStore):
        where += f"@{_PROCESS}#{_object_number(store)}"
    metadata = json.dumps(array.metadata.to_dict(), sort_keys=True, default=str)
    version = _version(store, metadata_key(array) or "")
    stored = _stored_versions(store, array)
    text = (
        f"{type(store).__name__}\0{where}\0{array.store_path.path}\0{metadata}\0{version}\0{stored}"
    )
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


#: Objects numbered in this process (in-memory stores): id -> (weak reference, number).
_NUMBERED: dict[int, tuple[weakref.ref[Any], int]] = {}
_NUMBERS = itertools.count()
#: Reentrant: an object's death (its weak reference's callback) may come while it is held.
_NUMBERED_LOCK = threading.RLock()


def _object_number(thing: Any) -> int:
    """A number naming ``thing`` while it lives, never given to another object (an ``id`` is)."""
    with _NUMBERED_LOCK:
        found = _NUMBERED.get(id(thing))
        if found is not None and found[0]() is thing:
            return found[1]
        number, key = next(_NUMBERS), id(thing)

        def forget(ref: weakref.ref[Any]) -> None:
            with _NUMBERED_LOCK:
                if _NUMBERED.get(key, (None,))[0] is ref:
                    del _NUMBERED[key]

        _NUMBERED[key] = (weakref.ref(thing, forget), number)
        return number


def _stored_versions(store: Any, array: zarr.Array) -> str:
    """A digest of the version of every object stored for ``array`` (chunks or shards).

    A local store: an ``os.stat`` of each object of the grid (size,
    modification time in ns, inode; zarr writes an object to a new file and
    renames it); an object store (obstore or fsspec): one listing of the
    array's prefix, each object's ETag, last-modified date and size.  ``""``
    where the store cannot tell (in-memory stores, other stores: see
    docs/cache.md).
    """
    try:
        return _listed_versions(store, array)
    except Exception:  # unknown: a token of its own, so nothing kept is served (never stale)
        return f"unknown-{uuid.uuid4().hex}"


def _listed_versions(store: Any, array: zarr.Array) -> str:
    rows = object_versions(store, array)
    if rows is None:
        return ""
    text = "\n".join("\0".join(map(str, row)) for row in rows)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def _version(store: Any, key: str) -> str:
    """When the document ``key`` of ``store`` was last written, if the store can tell."""
    try:
        if isinstance(store, zarr.storage.LocalStore):
            stat = os.stat(Path(store.root) / key)
            return f"{stat.st_mtime_ns}-{stat.st_size}"
        if isinstance(store, zarr.storage.ZipStore):
            return str(os.stat(str(store.path)).st_mtime_ns)
        if isinstance(store, zarr.storage.FsspecStore):
            fs, where = blocking_fs(store.fs), f"{store.path.rstrip('/')}/{key}"
            fs.invalidate_cache(where)
            info = fs.info(where)
            return str(info.get("ETag") or info.get("LastModified") or info.get("mtime") or "")
        if type(store).__name__ == "ObjectStore":
            import obstore

            meta = obstore.head(store.store, key)
            return f"{meta.get('e_tag')}-{meta.get('last_modified')}"
    except Exception:  # no version: the key is the metadata's alone
        return ""
    return ""
