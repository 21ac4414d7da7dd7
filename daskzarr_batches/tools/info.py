"""``daskzarr-batches info``: what a Zarr store holds, and whether every chunk reads.

A command-line adapter like ``tools.cli``: of this package it uses the public
API (``open_array`` and the error classes, to explain a store that cannot be
opened) and the store layout (``store.layout``: metadata document names, the
key and grid of every stored object).  Everything else is Zarr's own API: the
store's listing (``list_dir``/``list_prefix``/``getsize`` through
the zarr adapter's ``sync``), each array's metadata (``shards``, ``filters``,
``serializer``, ``compressors``) and plain slicing to read a chunk.

Counting is by stored object: a chunk of an unsharded array, a shard of a
sharded one (Zarr v3 ``sharding_indexed``).  The expected objects are every
cell of that grid; an object is *stored* when the store lists its key and
*absent* when it does not (the fill value, as the Zarr spec says: Zarr leaves
an object of only the fill value unwritten by default, so absent objects are
listed, never an error).  ``--check`` reads every stored object with
``array[region]``, a block of neighbouring objects per call (a shard is read
whole, so every inner chunk is decoded and the shard index's checksum
verified); when a block's read raises, its objects are read one by one and
each one whose read raises is recorded as *corrupt*, which makes the exit
status 1.  Absent objects are not read: Zarr returns the fill value for them.
"""

from __future__ import annotations

import asyncio
import io
import json
import math
import os
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

import numpy as np
import zarr
import zarr.abc.store

from .. import ArgumentValueError, ArrayNotFoundError, DaskZarrBatchesError, InvalidMetadataError
from .. import open_array as _open_array
from ..store.backends import Backend, resolve_backend, url_store
from ..store.layout import (
    METADATA_NAMES,
    V2_ARRAY_METADATA,
    V2_GROUP_METADATA,
    V3_METADATA,
    chunks_per_shard,
    object_keys,
)
from ..store.zarr_adapter import buffer_prototype, sync
from .check import check_arrays, progress_bar
from .info_text import format_bytes, format_check, format_table

__all__ = [
    "ArrayReport",
    "describe_array",
    "find_arrays",
    "format_bytes",
    "format_check",
    "format_table",
    "open_store",
    "run_info",
]

#: Stored objects whose size is asked for at once (``getsize`` calls in flight).
SIZE_CONCURRENCY = 64


@dataclass
class ArrayReport:
    """One array of a store, as ``info`` reports it.

    Attributes
    ----------
    path : str
        Path of the array in the store (``""`` for an array at the root).
    zarr_format : int
        2 or 3.
    shape, chunks : tuple of int
        The array's shape and (inner) chunk shape.
    dtype : str
        The numpy dtype.
    shards : tuple of int or None
        The shard shape of a sharded array (Zarr v3 ``sharding_indexed``).
    chunks_per_shard : int or None
        Inner chunks per (whole) shard.
    codecs : list of str
        Codec names in encoding order: filters, serializer, compressors (for a
        sharded array the codecs of its inner chunks).
    expected : int
        Objects (chunks, or shards) the chunk grid has.
    stored : int
        How many of them the store lists.
    stored_bytes : int
        Sum of the sizes of every object stored under the array (chunks or
        shards and metadata documents), as ``zarr.Array.nbytes_stored()``.
    nbytes : int
        Decoded bytes of the whole array (``zarr.Array.nbytes``).
    absent : list of str
        Keys (relative to the array) of expected objects not stored (they read
        as the fill value).
    corrupt : list of tuple of str
        ``(key, error)`` of stored objects whose read raised (``--check``).
    checked : bool
        Whether ``corrupt`` was filled by reading every stored object.
    """

    path: str
    zarr_format: int
    shape: tuple[int, ...]
    dtype: str
    chunks: tuple[int, ...]
    shards: tuple[int, ...] | None
    chunks_per_shard: int | None
    codecs: list[str]
    expected: int
    stored: int
    stored_bytes: int
    nbytes: int
    absent: list[str] = field(default_factory=list)
    corrupt: list[tuple[str, str]] = field(default_factory=list)
    checked: bool = False

    @property
    def unit(self) -> str:
        """What one stored object is: ``"chunk"`` or ``"shard"``."""
        return "chunk" if self.shards is None else "shard"

    @property
    def label(self) -> str:
        """How tables and messages name the array (``/`` for the root)."""
        return self.path or "/"

    def to_json(self) -> dict[str, Any]:
        """The report as JSON-ready values (``--json``)."""
        record: dict[str, Any] = {
            "path": self.path,
            "zarr_format": self.zarr_format,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "chunks": list(self.chunks),
            "shards": None
            if self.shards is None
            else {"shape": list(self.shards), "chunks_per_shard": self.chunks_per_shard},
            "codecs": self.codecs,
            "stored_objects": self.stored,
            "expected_objects": self.expected,
            "object": self.unit,
            "stored_bytes": self.stored_bytes,
            "nbytes": self.nbytes,
            "absent": self.absent,
        }
        if self.checked:
            record["corrupt"] = [{"key": key, "error": error} for key, error in self.corrupt]
        return record


def run_info(
    source: str | Sequence[str],
    out: TextIO,
    *,
    storage_options: dict[str, Any] | None = None,
    backend: Backend = "auto",
    check: bool = False,
    as_json: bool = False,
    progress: Callable[..., Any] | None = None,
) -> int:
    """Print what the store at ``source`` holds; with ``check``, read every chunk.

    Parameters
    ----------
    source : str or sequence of str
        A directory, a ``.zip`` file or an fsspec URL; several: each store
        in turn, then each array path they all hold as a collection (total
        rows, or the first member whose trailing shape or dtype differs).
        With ``as_json``, one list of every store's arrays, each object with
        its ``"store"``.
    out : text stream
        Where the table (or JSON) goes.
    storage_options : dict, optional
        Options of a URL store (as :func:`open_array` takes them).
    backend : {"auto", "obstore", "fsspec"}
        What reads a URL store (:func:`open_array`'s ``backend``).
    check : bool
        Read every stored chunk (or shard) and report corrupt ones (absent ones are listed).
    as_json : bool
        Print a JSON list with one object per array instead of the table.
    progress : callable, optional
        ``tqdm``-like factory for the progress bars (``progress(total=...,
        desc=..., unit=...)``); ``None`` shows none.

    Returns
    -------
    int
        0, or 1 when ``check`` found a corrupt chunk (an absent one is no error).

    Raises
    ------
    DaskZarrBatchesError
        The store cannot be opened, holds no array, or has invalid metadata.
    """
    if not isinstance(source, str):
        sources = list(source)
        if len(sources) == 1:
            return run_info(sources[0], out, storage_options=storage_options, check=check,
                            as_json=as_json, progress=progress, backend=backend)  # fmt: skip
        return _run_many(sources, out, storage_options, check, as_json, progress)
    store = open_store(source, storage_options, backend)
    try:
        arrays = find_arrays(store, source, storage_options, backend)
        reports = []
        with progress_bar(
            progress, total=len(arrays), desc="listing", unit="array", leave=False
        ) as bar:
            for path, array in arrays:
                reports.append(describe_array(array, path, store))
                bar.update(1)
        if check:
            check_arrays(arrays, reports, progress)
    finally:
        store.close()
    if as_json:
        print(json.dumps([report.to_json() for report in reports], indent=2), file=out)
    else:
        kind = (
            "a single Zarr array"
            if len(arrays) == 1 and arrays[0][0] == ""
            else f"a Zarr group with {len(arrays)} array{'' if len(arrays) == 1 else 's'}"
        )
        print(f"{source}: {kind}", file=out)
        if reports:
            print(format_table(reports), file=out)
        if check:
            print(format_check(reports), file=out)
    return 1 if check and any(report.corrupt for report in reports) else 0


def open_store(
    source: str, storage_options: dict[str, Any] | None, backend: Backend = "auto"
) -> zarr.abc.store.Store:
    """A read-only Zarr store for a directory, ``.zip`` file or URL (on ``backend``).

    Raises
    ------
    ArrayNotFoundError
        A local path that does not exist.
    ArgumentValueError
        ``storage_options`` for a local path, or a URL the backend cannot open.
    """
    is_url = "://" in source
    if storage_options and not is_url:
        raise ArgumentValueError(
            f"--storage-option applies to URLs (s3://, gs://, ...), not to the local path "
            f"{source!r}"
        )
    if not is_url:
        if not os.path.exists(source):
            raise ArrayNotFoundError(f"no Zarr array or group at {source!r}: no such file")
        if os.path.isfile(source):
            if not zipfile.is_zipfile(source):
                raise ArgumentValueError(
                    f"{source!r} is a file but not a zip file; STORE is a directory store, "
                    "a zipped store (.zip) or a URL"
                )
            return zarr.storage.ZipStore(source, mode="r")
        return zarr.storage.LocalStore(source, read_only=True)
    chosen = resolve_backend(backend, source.split("://", 1)[0].lower())
    assert chosen is not None
    try:
        return url_store(source, storage_options, chosen)
    except DaskZarrBatchesError:
        raise
    except ImportError as exc:
        raise ArgumentValueError(f"cannot open {source!r}: {exc}") from exc
    except (ValueError, TypeError, OSError) as exc:
        raise ArgumentValueError(f"cannot open {source!r} as a Zarr store: {exc}") from exc


def find_arrays(
    store: zarr.abc.store.Store,
    source: str = "",
    storage_options: dict[str, Any] | None = None,
    backend: Backend = "auto",
) -> list[tuple[str, zarr.Array]]:
    """Every array in ``store``: the root array, or those below the root group.

    Groups are walked by listing the store, so a group lists members of
    either Zarr format (Zarr's own ``Group.members`` skips a format 2 array in
    a format 3 group).  ``source`` and ``storage_options`` only serve to
    explain a node that cannot be opened (through ``open_array``'s errors).

    Returns
    -------
    list of (str, zarr.Array)
        ``(path, array)`` sorted by path; the path of a root array is ``""``.

    Raises
    ------
    ArrayNotFoundError
        Nothing Zarr can open at the root.
    InvalidMetadataError
        A metadata document is broken (named).
    """

    def explain(path: str, exc: Exception) -> DaskZarrBatchesError:
        # open_array diagnoses broken documents; anything else is "not found".
        try:
            _open_array(
                source, path or None, storage_options=storage_options or None, backend=backend
            )
        except DaskZarrBatchesError as error:
            if isinstance(error, ArrayNotFoundError) and not path:
                return ArrayNotFoundError(f"no Zarr array or group at {source!r}")
            return error
        except Exception:  # pragma: no cover - open_array wraps what it expects
            pass
        if not path:  # the store itself: credentials, network, permissions, ...
            return ArgumentValueError(f"cannot open {source!r}: {type(exc).__name__}: {exc}")
        return InvalidMetadataError(
            f"cannot open the array {path!r} in {source!r}: {type(exc).__name__}: {exc}"
        )

    try:
        root = zarr.open(store=store, mode="r")
    except Exception as exc:
        raise explain("", exc) from exc
    if isinstance(root, zarr.Array):
        return [("", root)]

    async def kinds(paths: list[str]) -> list[str | None]:
        return list(await asyncio.gather(*(_node_kind(store, path) for path in paths)))

    async def children(path: str) -> list[str]:
        prefix = f"{path}/" if path else ""
        names = [name async for name in store.list_dir(prefix)]
        return sorted(f"{prefix}{name}" for name in names if name not in METADATA_NAMES)

    found: list[tuple[str, zarr.Array]] = []
    pending = [""]
    while pending:
        group = pending.pop()
        paths = sync(children(group))
        for path, kind in zip(paths, sync(kinds(paths)), strict=True):
            if kind == "group":
                pending.append(path)
            elif kind == "array":
                try:
                    found.append((path, zarr.open_array(store=store, path=path, mode="r")))
                except Exception as exc:
                    raise explain(path, exc) from exc
            elif kind == "broken":
                raise explain(path, ValueError("unreadable metadata"))
    return sorted(found, key=lambda item: item[0])


async def _node_kind(store: zarr.abc.store.Store, path: str) -> str | None:
    """``"array"``, ``"group"``, ``"broken"`` (a document Zarr cannot read) or None."""
    document = await store.get(f"{path}/{V3_METADATA}", prototype=buffer_prototype())
    if document is not None:
        try:
            node_type = json.loads(document.to_bytes())["node_type"]
        except Exception:
            return "broken"
        return node_type if node_type in ("array", "group") else "broken"
    if await store.exists(f"{path}/{V2_ARRAY_METADATA}"):
        return "array"
    if await store.exists(f"{path}/{V2_GROUP_METADATA}"):
        return "group"
    return None


def describe_array(array: zarr.Array, path: str, store: zarr.abc.store.Store) -> ArrayReport:
    """Describe ``array`` (stored at ``path`` in ``store``) from its metadata and the listing.

    Lists the store's keys under the array once, and asks each object's size.
    """
    shape = tuple(int(n) for n in array.shape)
    chunks = tuple(int(n) for n in array.chunks)
    shards = None if array.shards is None else tuple(int(n) for n in array.shards)
    per_shard = None if shards is None else math.prod(chunks_per_shard(array))
    expected = object_keys(array)
    prefix = f"{path}/" if path else ""
    try:
        sizes = sync(_listing(store, prefix))
    except OSError as exc:
        raise ArgumentValueError(
            f"cannot list the objects of {path or '/'!r}: {type(exc).__name__}: {exc}"
        ) from exc
    listed = {key[len(prefix) :] for key in sizes}
    stored = [key for key in expected if key in listed]
    absent = [key for key in expected if key not in listed]
    return ArrayReport(
        path=path,
        zarr_format=int(array.metadata.zarr_format),
        shape=shape,
        dtype=str(np.dtype(array.dtype)),
        chunks=chunks,
        shards=shards,
        chunks_per_shard=per_shard,
        codecs=codec_names(array),
        expected=len(expected),
        stored=len(stored),
        stored_bytes=sum(sizes.values()),
        nbytes=int(array.nbytes),
        absent=absent,
    )


async def _listing(store: zarr.abc.store.Store, prefix: str) -> dict[str, int]:
    """``{key: size}`` of every object below ``prefix``."""
    keys = [key async for key in store.list_prefix(prefix)]
    limit = asyncio.Semaphore(SIZE_CONCURRENCY)

    async def size(key: str) -> int:
        async with limit:
            return await store.getsize(key)

    return dict(zip(keys, await asyncio.gather(*(size(key) for key in keys)), strict=True))


def codec_names(array: zarr.Array) -> list[str]:
    """Names of the codecs a chunk goes through, in encoding order.

    Format 3: filters, serializer, compressors (for a sharded array, those of
    its inner chunks: Zarr reports them so).  Format 2: filters, compressor.
    """
    codecs = [*array.filters]
    if array.serializer is not None:
        codecs.append(array.serializer)
    codecs += array.compressors
    return [_codec_name(codec) for codec in codecs]


def _codec_name(codec: Any) -> str:
    codec_id = getattr(codec, "codec_id", None)  # numcodecs (format 2)
    if isinstance(codec_id, str):
        return codec_id
    try:
        name = codec.to_dict()["name"]
    except Exception:
        return type(codec).__name__
    return str(name)


def _run_many(
    sources: Sequence[str],
    out: TextIO,
    storage_options: dict[str, Any] | None,
    check: bool,
    as_json: bool,
    progress: Callable[..., Any] | None,
) -> int:
    """``info`` of several stores: each in turn, then their common arrays as collections."""
    status = 0
    records: list[dict[str, Any]] = []
    for source in sources:
        text = io.StringIO()
        status = max(
            status,
            run_info(source, text, storage_options=storage_options, check=check,
                     as_json=as_json, progress=progress),
        )  # fmt: skip
        if as_json:
            records += [{"store": source, **record} for record in json.loads(text.getvalue())]
        else:
            out.write(text.getvalue() + "\n")
    if as_json:
        print(json.dumps(records, indent=2), file=out)
        return status
    by_path: dict[str, list[dict[str, Any]]] = {}
    for record in _records(sources, storage_options):
        by_path.setdefault(record["path"], []).append(record)
    print(f"{len(sources)} stores as a collection along axis 0:", file=out)
    for path, found in by_path.items():
        label = path or "(root array)"
        if len(found) < len(sources):
            print(f"  {label}: in {len(found)} of {len(sources)} stores only", file=out)
            continue
        first = found[0]
        clash = next(
            (
                (i, r)
                for i, r in enumerate(found)
                if r["shape"][1:] != first["shape"][1:] or r["dtype"] != first["dtype"]
            ),
            None,
        )
        if clash is not None:
            i, r = clash
            print(
                f"  {label}: member {i} ({sources[i]}) has trailing shape {tuple(r['shape'][1:])} "
                f"and dtype {r['dtype']}, member 0 {tuple(first['shape'][1:])} and "
                f"{first['dtype']}: not joinable",
                file=out,
            )
            continue
        rows = sum(r["shape"][0] for r in found)
        shape = (rows, *first["shape"][1:])
        print(f"  {label}: shape {shape}, dtype {first['dtype']}", file=out)
    return status


def _records(sources: Sequence[str], storage_options: dict[str, Any] | None) -> list[Any]:
    """Every array of every store as its JSON record (metadata only)."""
    records = []
    for source in sources:
        text = io.StringIO()
        run_info(source, text, storage_options=storage_options, as_json=True)
        records += json.loads(text.getvalue())
    return records
