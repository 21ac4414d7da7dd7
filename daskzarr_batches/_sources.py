"""Sources: anything array-like as a dask array whose chunks are the stored chunks.

:func:`open_array` is the public entry point.  Internally every stream works on
a :class:`Source`: a description of one array (name, shape, dtype, chunk
grid) and what a worker needs to read it.  Sources know nothing of tasks or
graphs; the read layer (``_read``) builds those from them.

Two kinds exist:

:class:`SliceSource`
    Zarr arrays and numpy arrays, read by slicing the array object inside a
    task, so the error for a chunk that cannot be decoded names the array and
    the chunk.  A dask array made by :func:`open_array` (or ``da.from_zarr``
    without rechunking) is recognised and read this way too.
:class:`DaskSource`
    Any other dask array, read through its own (optimised) graph.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import dask.array as da
import numpy as np
import zarr
import zarr.abc.store

from ._errors import ArgumentTypeError, ArgumentValueError, ArrayNotFoundError

__all__ = ["DaskSource", "SliceSource", "Source", "as_source", "open_array"]

Chunks = tuple[tuple[int, ...], ...]


def open_array(
    source: Any,
    path: str | None = None,
    *,
    storage_options: dict[str, Any] | None = None,
) -> da.Array:
    """Open a Zarr array as a dask array whose chunks are the stored chunks.

    Parameters
    ----------
    source : zarr.Array, zarr.Group, zarr store, str or os.PathLike
        Where the array lives: an open array, a group (then ``path`` names the
        array inside it), a store object, or a path/URL to a directory store,
        a ``.zip`` store or an fsspec URL such as ``"s3://bucket/data.zarr"``.
    path : str, optional
        Path of the array inside a group or store.
    storage_options : dict, optional
        Passed to fsspec for URL sources (credentials, endpoint, ...).

    Returns
    -------
    dask.array.Array
        ``.chunks`` equals the Zarr chunk grid with edge chunks cropped, and
        ``.dtype`` the Zarr dtype.  Nothing is read until computed.

    Raises
    ------
    ArrayNotFoundError
        No array at ``source``/``path``; the message lists the arrays that do
        exist.
    ArgumentTypeError
        ``source`` is not something Zarr can open.
    """
    array = _open_zarr(source, path, storage_options)
    return da.from_zarr(array)


def _open_zarr(source: Any, path: str | None, storage_options: dict[str, Any] | None) -> zarr.Array:
    if isinstance(source, zarr.Array):
        if path not in (None, ""):
            raise ArgumentValueError(
                f"path={path!r} was given but source is already an array ({source.store_path})"
            )
        return source
    if isinstance(source, zarr.Group):
        return _array_in_group(source, path, where=str(source.store_path))
    if isinstance(source, os.PathLike):
        source = os.fspath(source)
    if isinstance(source, str) and source.endswith(".zip"):
        source = zarr.storage.ZipStore(source, mode="r")
    if not isinstance(source, str | zarr.abc.store.Store | dict):
        raise ArgumentTypeError(
            "source must be a zarr.Array, zarr.Group, zarr store, path or URL, "
            f"got {type(source).__name__}"
        )
    kwargs: dict[str, Any] = {"mode": "r"}
    if storage_options:  # zarr rejects even {} for local paths and store objects
        kwargs["storage_options"] = storage_options
    try:
        node = zarr.open(store=source, **kwargs)
    except (FileNotFoundError, KeyError) as exc:
        raise ArrayNotFoundError(f"no Zarr array or group at {source!r}") from exc
    except TypeError as exc:  # e.g. storage_options for a local path
        raise ArgumentTypeError(f"cannot open {source!r} as Zarr: {exc}") from exc
    except ValueError as exc:  # e.g. an unknown URL protocol
        raise ArgumentValueError(f"cannot open {source!r} as Zarr: {exc}") from exc
    if isinstance(node, zarr.Array):
        if path not in (None, ""):
            raise ArrayNotFoundError(
                f"{source!r} holds a single array, not a group; there is nothing at path {path!r}"
            )
        return node
    return _array_in_group(node, path, where=repr(source))


def _array_in_group(group: zarr.Group, path: str | None, where: str) -> zarr.Array:
    arrays = sorted(
        name for name, node in group.members(max_depth=None) if isinstance(node, zarr.Array)
    )
    listing = ", ".join(repr(a) for a in arrays) if arrays else "none"
    if path in (None, ""):
        raise ArrayNotFoundError(
            f"{where} is a group; pass path= to choose one of its arrays: {listing}"
        )
    assert path is not None
    try:
        node = group[path.strip("/")]
    except KeyError:
        node = None
    if not isinstance(node, zarr.Array):
        what = "a group" if isinstance(node, zarr.Group) else "no array"
        raise ArrayNotFoundError(
            f"{what} at path {path!r} in {where}; arrays that exist: {listing}"
        )
    return node


# --------------------------------------------------------------------------
# Sources used by the read layer


@dataclass(frozen=True)
class Source:
    """An array the streams can read, with its chunk grid.

    Attributes
    ----------
    name : str
        How errors refer to the array (store path for Zarr arrays).
    shape : tuple of int
    dtype : numpy.dtype
    chunks : tuple of tuple of int
        Dask-style chunk sizes per axis, edge chunks cropped.
    """

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    chunks: Chunks

    @property
    def n_samples(self) -> int:
        """Length of axis 0."""
        return self.shape[0]

    @property
    def row_bytes(self) -> int:
        """Decoded bytes of one sample (one row of axis 0)."""
        return math.prod(self.shape[1:]) * self.dtype.itemsize

    def blocks(self) -> Iterator[tuple[int, ...]]:
        """Block indices of every non-empty stored chunk, in C order."""
        return itertools.product(
            *([i for i, size in enumerate(sizes) if size > 0] for sizes in self.chunks)
        )

    def block_slices(self, block: tuple[int, ...]) -> tuple[slice, ...]:
        """Index of ``block`` in array coordinates."""
        slices = []
        for axis, i in enumerate(block):
            start = sum(self.chunks[axis][:i])
            slices.append(slice(start, start + self.chunks[axis][i]))
        return tuple(slices)


@dataclass(frozen=True)
class SliceSource(Source):
    """A Zarr or numpy array, read by slicing it inside a task.

    ``token`` is unique per source object: graphs hold the array under a key
    made from it, so two arrays never share a key.
    """

    array: Any = field(repr=False, default=None)
    token: str = field(repr=False, default="")

    @property
    def carries_data(self) -> bool:
        """Whether pickling the array copies its data (numpy, Zarr in memory).

        Such a source is sent to a cluster's workers once per stream instead
        of inside every graph.
        """
        if isinstance(self.array, np.ndarray):
            return True
        store = getattr(self.array, "store", None)
        while isinstance(store, zarr.storage.WrapperStore):  # a latency or logging wrapper
            store = store._store
        return isinstance(store, zarr.storage.MemoryStore)


@dataclass(frozen=True)
class DaskSource(Source):
    """A general dask array, read through its own graph."""

    array: da.Array = field(repr=False, default=None)  # type: ignore[assignment]
    graph: dict[Any, Any] = field(repr=False, default_factory=dict)


def as_source(array: Any, role: str = "array") -> Source:
    """Validate ``array`` and wrap it as a :class:`Source`.

    ``role`` ("array", "features", "labels") names it in error messages.
    """
    if isinstance(array, Source):
        return array
    if isinstance(array, da.Array):
        behind = _zarr_behind(array)
        if behind is not None:
            array = behind
    if isinstance(array, zarr.Array):
        shape = tuple(array.shape)
        _check_dims(role, shape)
        dtype = np.dtype(array.dtype)
        chunks = da.core.normalize_chunks(array.chunks, shape)
        name = str(array.store_path)
        return SliceSource(name, shape, dtype, chunks, array, _token(array))
    if isinstance(array, np.ndarray):
        shape = array.shape
        _check_dims(role, shape)
        if array.size == 0:  # dask's auto chunking divides by the row size
            chunks = tuple((size,) for size in shape)
        else:
            auto = {0: "auto", **{axis: -1 for axis in range(1, array.ndim)}}
            chunks = da.core.normalize_chunks(auto, shape, dtype=array.dtype)
        name = f"<numpy {role} shape={shape} dtype={array.dtype}>"
        return SliceSource(name, shape, array.dtype, chunks, array, _token(array))
    if isinstance(array, da.Array):
        shape = tuple(array.shape)
        _check_dims(role, shape)
        if any(math.isnan(size) for sizes in array.chunks for size in sizes):
            raise ArgumentValueError(
                f"{role} has unknown chunk sizes {array.chunks}; "
                "call .compute_chunk_sizes() on it first"
            )
        graph = dict(array.__dask_optimize__(array.__dask_graph__(), array.__dask_keys__()))
        return DaskSource(array.name, shape, array.dtype, array.chunks, array, graph)
    raise ArgumentTypeError(
        f"{role} must be a zarr.Array, dask.array.Array or numpy.ndarray, "
        f"got {type(array).__name__}"
    )


def _check_dims(role: str, shape: tuple[int, ...]) -> None:
    if len(shape) == 0:
        raise ArgumentValueError(
            f"{role} is a 0-d array (shape ()); streams need at least one "
            "dimension, with samples along axis 0"
        )


def _token(array: Any) -> str:
    # Unique per Source object: the array itself is placed in each graph
    # under this key, so it must never collide with another array's.
    return f"{id(array):x}-{os.urandom(4).hex()}"


def _zarr_behind(array: da.Array) -> zarr.Array | None:
    """The Zarr array behind a plain ``da.from_zarr`` dask array, if any."""
    graph = array.__dask_graph__()
    layers = getattr(graph, "layers", None)
    if layers is None or len(layers) != 2:
        return None
    original = layers.get("original-" + array.name)
    if original is None or len(original) != 1:
        return None
    (value,) = original.values()
    if not isinstance(value, zarr.Array):
        return None
    same = (
        tuple(value.shape) == tuple(array.shape)
        and np.dtype(value.dtype) == array.dtype
        and da.core.normalize_chunks(value.chunks, value.shape) == array.chunks
    )
    return value if same else None
