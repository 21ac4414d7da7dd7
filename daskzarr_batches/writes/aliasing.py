"""No write job onto its own input: where an output would be written, against its inputs.

A job's output array at ``out`` (and ``name``) and every stored array behind
its inputs (a collection's members, a subset's base, the Zarr arrays a dask
array or xarray object is read from) are each reduced to a :class:`Location`:
a *domain* (one local file system, one bucket of an object store, one
in-memory store object, one zip file) and the path in it as parts, local
paths resolved (relative, ``~``, ``..``, symlinks, trailing slashes) and
URLs as ``protocol://bucket/path`` whichever backend (obstore or fsspec)
opened them.  An output whose location is an input's, holds it (the group an
input is a member of) or lies inside it is refused (:func:`check_not_input`)
before anything is created or deleted: ``overwrite=True`` would delete the
input before it is read.  Pure inspection, no I/O beyond ``os.path.realpath``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import dask.array as da
import zarr
import zarr.storage

from ..errors import ArgumentValueError
from ..store.sources import Source, is_xarray
from ..store.zarr_adapter import memory_store_dict, unwrapped_store
from ..streams.base import stored_sources

__all__ = ["Location", "check_not_input", "input_arrays", "lazy_xarray_arrays", "location_of"]

#: one name per object-store protocol, as fsspec and obstore spell them
_PROTOCOLS = {"s3a": "s3", "gcs": "gs", "abfs": "az", "abfss": "az", "adl": "az", "https": "http"}


@dataclass(frozen=True)
class Location:
    """Where an array is (or would be) stored: a domain and the path's parts within it."""

    domain: tuple[Any, ...]
    parts: tuple[str, ...]
    text: str  # how a message names it
    #: a zip store's file, as parts of the local file system (``None``: not in a zip)
    container: tuple[str, ...] | None = None

    def relation(self, other: Location) -> str | None:
        """How this output's location meets input ``other``'s (``None``: apart)."""
        if self.domain != other.domain:
            return self._zip_relation(other)
        if self.parts == other.parts:
            return "is the input"
        if other.parts[: len(self.parts)] == self.parts:
            return "holds the input (a group the input is a member of)"
        if self.parts[: len(other.parts)] == other.parts:
            return "lies inside the input"
        return None

    def _zip_relation(self, other: Location) -> str | None:
        """A zip store's file against a local path: a directory holding it, a zip inside one."""
        mine, theirs = self._on_disk(), other._on_disk()
        if mine is None or theirs is None or (self.container is None and other.container is None):
            return None
        if mine == theirs:
            return "is the input's zip file"
        if theirs[: len(mine)] == mine:
            return "holds the input's zip file (a directory it is in)"
        if mine[: len(theirs)] == theirs:
            return (
                "lies inside the input's zip file" if other.container else "lies inside the input"
            )
        return None

    def _on_disk(self) -> tuple[str, ...] | None:
        """The local file system's parts: a zip store's file, a local path; else ``None``."""
        if self.container is not None:
            return self.container
        return self.parts if self.domain == ("file",) else None


def _split(path: str) -> tuple[str, ...]:
    return tuple(part for part in path.replace("\\", "/").split("/") if part and part != ".")


def _local(path: str, inner: str = "") -> Location:
    real = os.path.realpath(os.path.expanduser(path))
    parts = (*_split(real), *_split(inner))
    return Location(("file",), parts, "/" + "/".join(parts))


def _url(protocol: str, path: str) -> Location:
    protocol = _PROTOCOLS.get(protocol, protocol)
    parts = _split(path)
    return Location((protocol,), parts, f"{protocol}://" + "/".join(parts))


def _protocol(fs: Any) -> str:
    protocol = fs.protocol
    return str(protocol[0] if isinstance(protocol, tuple | list) else protocol).lower()


def location_of(store: Any, path: str = "") -> Location:
    """The location of the node ``path`` of ``store`` (a Zarr store, a path or URL string)."""
    if isinstance(store, zarr.storage.StorePath):
        store, path = store.store, "/".join(_split(store.path) + _split(path))
    if isinstance(store, os.PathLike):
        store = os.fspath(store)
    if isinstance(store, str):
        if "://" in store and not store.lower().startswith("file://"):
            protocol, rest = store.split("://", 1)
            return _url(protocol.lower(), f"{rest}/{path}")
        return _local(store.split("://", 1)[-1], path)
    store = unwrapped_store(store)
    if isinstance(store, zarr.storage.LocalStore):
        return _local(str(store.root), path)
    if isinstance(store, zarr.storage.ZipStore):
        zipped = os.path.realpath(str(store.path))
        return Location(("zip", zipped), _split(path), f"{zipped}::{path or '/'}", _split(zipped))
    if isinstance(store, zarr.storage.MemoryStore):
        held = memory_store_dict(store)
        return Location(("memory", id(held)), _split(path), f"MemoryStore at {path or '/'!r}")
    if isinstance(store, zarr.storage.FsspecStore):
        protocol = _protocol(store.fs)
        where = f"{store.path}/{path}"
        if protocol in ("file", "local"):
            return _local(where)
        if protocol == "memory":  # one file system per process
            parts = _split(where)
            return Location(("fsspec-memory",), parts, "memory://" + "/".join(parts))
        return _url(protocol, where)
    if type(store).__name__ == "ObjectStore":  # zarr's wrapper of an obstore store
        return _obstore(store.store, path)
    if isinstance(store, Mapping):  # a dict given as a store: zarr keeps it as it is
        return Location(("memory", id(store)), _split(path), f"a dict store at {path or '/'!r}")
    return Location(("store", id(store)), _split(path), f"{type(store).__name__} at {path!r}")


def _obstore(upstream: Any, path: str) -> Location:
    kind = type(upstream).__name__
    prefix = str(getattr(upstream, "prefix", None) or "")
    config = getattr(upstream, "config", None) or {}
    if kind == "LocalStore":
        return _local(prefix or "/", path)
    if kind == "S3Store":
        return _url("s3", f"{config.get('bucket', '')}/{prefix}/{path}")
    if kind == "GCSStore":
        return _url("gs", f"{config.get('bucket', '')}/{prefix}/{path}")
    if kind == "AzureStore":
        return _url("az", f"{config.get('container_name', '')}/{prefix}/{path}")
    if kind == "HTTPStore":
        url = str(getattr(upstream, "url", "") or "").split("://", 1)[-1]
        return _url("http", f"{url}/{prefix}/{path}")
    return Location(("store", id(upstream)), _split(path), f"{kind} at {path!r}")


def input_arrays(inputs: Sequence[tuple[str, Source]]) -> Iterator[tuple[str, zarr.Array]]:
    """``(what, Zarr array)`` of every stored array behind each ``(what, source)`` of ``inputs``.

    Bases and members (``stored_sources``), and the Zarr arrays inside a dask
    array's graph (``da.from_zarr(x) * 2``, an xarray object opened from Zarr).
    """
    for what, source in inputs:
        for stored in stored_sources(source):
            array = getattr(stored, "array", None)
            if isinstance(array, zarr.Array):
                yield what, array
            elif isinstance(array, da.Array):  # its own graph, as built (not fused)
                for found in _zarr_in(dict(array.__dask_graph__()), 0):
                    yield what, found


def lazy_xarray_arrays(data: Any) -> Iterator[tuple[str, zarr.Array]]:
    """``(what, Zarr array)`` behind each ``xarray.DataArray`` of ``data`` backed without dask.

    ``xr.open_zarr(..., chunks=None)``: the source holds the values xarray
    loaded, no longer the array they came from, so it is found in the
    DataArray's lazy wrappers, before the job reads it (``data``: as given
    to a job, a dict or tuple of arrays, named as ``_Inputs.described`` names
    them).
    """
    if isinstance(data, Mapping):
        named: list[tuple[str, Any]] = [(f"data[{str(k)!r}]", v) for k, v in data.items()]
    elif isinstance(data, tuple):
        named = [(f"data[{i!r}]", v) for i, v in enumerate(data)]
    else:
        named = [("data", data)]
    for what, value in named:
        if is_xarray(value, "DataArray"):
            for found in _zarr_in(value.variable._data, 0):
                yield what, found


def _zarr_in(value: Any, depth: int) -> Iterator[zarr.Array]:
    """The Zarr arrays in a dask graph's values, tasks and wrappers (a few levels down)."""
    if isinstance(value, zarr.Array):
        yield value
        return
    if depth > 6 or isinstance(value, str | bytes | int | float) or value is None:
        return
    if isinstance(value, Mapping):
        items: Any = value.values()
    elif isinstance(value, tuple | list):
        items = value
    elif type(value).__module__.startswith(("dask", "xarray")):
        # dask's task objects (DataNode.value, Task.args), xarray's lazy array wrappers
        items = [getattr(value, n, None) for n in ("value", "args", "kwargs", "array", "_array")]
    else:
        return
    for item in items:
        yield from _zarr_in(item, depth + 1)


def check_not_input(
    job: str,
    out: Any,
    store: Any,
    names: Sequence[str | None],
    inputs: Sequence[tuple[str, Source]],
    lazy: Sequence[tuple[str, zarr.Array]] = (),
) -> None:
    """Refuse output arrays at ``store`` (``names``: their paths) that meet an input's array.

    ``out`` is the argument as given (for the message), ``inputs`` each
    input as the message names it (``"data"``, ``"data['x']"``) and its source,
    ``lazy`` the arrays :func:`lazy_xarray_arrays` found in the job's
    ``data`` before it was read (xarray replaces its lazy wrappers with the
    values it loads).

    Raises
    ------
    ArgumentValueError
        An output is where an input array is stored, the group that holds
        one, or a node inside one; the message names both locations.
        Raised before any output is created, so nothing is deleted.
    """
    arrays = [*input_arrays(inputs), *lazy]
    stored = [(what, location_of(array.store_path)) for what, array in arrays]
    for name in names:
        output = location_of(store, name or "")
        for what, where in stored:
            relation = output.relation(where)
            if relation is not None:
                array = "" if name is None else f", array {name!r}"
                raise ArgumentValueError(
                    f"{job} would write its output at {output.text} (out={out!r}{array}), "
                    f"which {relation}: {what} is stored at {where.text}; a job never writes "
                    "onto its own input (overwriting deletes what is there first, before the "
                    "input is read): write to another path, then move it"
                )
