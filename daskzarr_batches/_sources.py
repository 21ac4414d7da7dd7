"""Sources: anything array-like as a dask array whose chunks are the stored chunks.

:func:`open_array` is the public entry point.  Internally every stream works on
a :class:`Source`, which knows the chunk grid and how to add a read task for
one axis-0 chunk (or one block) to a dask graph.  Nothing outside this module
cares where the bytes live.

Two kinds exist:

:class:`SliceSource`
    Zarr arrays and numpy arrays: a task slices the array directly, so the
    error for a chunk that cannot be decoded names the array and the chunk.
    A dask array made by :func:`open_array` (or ``da.from_zarr`` without
    rechunking) is recognised and read this way too.
:class:`DaskSource`
    Any other dask array: the read tasks are that array's own block tasks.
"""

from __future__ import annotations

import itertools
import math
import os
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import dask.array as da
import numpy as np
import zarr
import zarr.abc.store
from dask.optimization import cull

from ._errors import ArgumentTypeError, ArgumentValueError, ArrayNotFoundError

__all__ = ["DaskSource", "SliceSource", "Source", "as_source", "open_array"]

Chunks = tuple[tuple[int, ...], ...]
Key = Any  # a dask key: str or tuple starting with str


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
        No array at ``source``/``path`` (or no such ``.zip`` file); the
        message lists the arrays that do exist.
    ArgumentTypeError
        ``source`` is not something Zarr can open, or ``path`` is not a str.
    ArgumentValueError
        ``path`` has a ``..`` or ``.`` segment (a Zarr path only goes down),
        or a ``.zip`` path is not a zip file.
    """
    array = _open_zarr(source, path, storage_options)
    return da.from_zarr(array)


def _open_zarr(source: Any, path: str | None, storage_options: dict[str, Any] | None) -> zarr.Array:
    _check_path(path)
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
    named = source  # how messages refer to it (a zip path rather than its ZipStore)
    if isinstance(source, str) and source.endswith(".zip") and not os.path.isdir(source):
        source = _zip_store(source)
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
    except zipfile.BadZipFile as exc:  # passed is_zipfile, but its directory is broken
        raise ArgumentValueError(f"{named!r} is not a zip file Zarr can read: {exc}") from exc
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


def _check_path(path: object) -> None:
    """A path inside a group or store: None, or a str whose segments only go down."""
    if path is None:
        return
    if not isinstance(path, str):
        raise ArgumentTypeError(
            "path must be a str naming an array inside the group or store (such as "
            f"'images' or 'train/images'), got {type(path).__name__} {path!r}"
        )
    for segment in path.strip("/").split("/"):
        if segment in (".", ".."):
            raise ArgumentValueError(
                f"path {path!r} has a {segment!r} segment; a Zarr path names a node below "
                "the group or store and cannot go up (or name the same node): open the "
                "parent group or store and give the path from there"
            )


def _zip_store(path: str) -> zarr.storage.ZipStore:
    """Open ``path`` as a read-only zip store, with library errors for non-zip files."""
    if not os.path.exists(path):
        raise ArrayNotFoundError(f"no Zarr array or group at {path!r}: no such file")
    if not zipfile.is_zipfile(path):
        raise ArgumentValueError(
            f"{path!r} is not a zip file; a path ending in .zip is opened as a zipped Zarr "
            "store (zarr.storage.ZipStore)"
        )
    return zarr.storage.ZipStore(path, mode="r")


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

    def add_rows_task(
        self, dsk: dict[Key, Any], key: Key, chunk: int, start: int, stop: int, take: Any
    ) -> None:
        """Add task ``key`` computing rows ``take`` of axis-0 chunk ``chunk``."""
        raise NotImplementedError

    def add_block_task(self, dsk: dict[Key, Any], key: Key, block: tuple[int, ...]) -> None:
        """Add task ``key`` computing the stored block ``block``."""
        raise NotImplementedError

    def add_window_task(
        self, dsk: dict[Key, Any], key: Key, size: int, pieces: Sequence[Any]
    ) -> bool:
        """Add one task ``key`` reading a whole window, if this source can.

        Returns ``False`` when the window must be built from one task per
        chunk (:meth:`add_rows_task`) and a gather.
        """
        return False


@dataclass(frozen=True)
class SliceSource(Source):
    """A Zarr or numpy array, read by slicing it inside a task."""

    array: Any = field(repr=False, default=None)
    token: str = field(repr=False, default="")

    @property
    def _array_key(self) -> str:
        return f"dzb-source-{self.token}"

    def add_block_task(self, dsk: dict[Key, Any], key: Key, block: tuple[int, ...]) -> None:
        from ._read import read_block

        dsk[self._array_key] = self.array
        dsk[key] = (read_block, self._array_key, self.name, block, self.block_slices(block))

    def add_window_task(
        self, dsk: dict[Key, Any], key: Key, size: int, pieces: Sequence[Any]
    ) -> bool:
        from ._read import read_window

        if not pieces:
            return False
        dsk[self._array_key] = self.array
        dsk[key] = (read_window, self._array_key, self.name, size, self.row_bytes, tuple(pieces))
        return True


@dataclass(frozen=True)
class DaskSource(Source):
    """A general dask array, read through its own graph."""

    array: da.Array = field(repr=False, default=None)  # type: ignore[assignment]
    graph: dict[Key, Any] = field(repr=False, default_factory=dict)

    def _add_keys(self, dsk: dict[Key, Any], keys: list[Key]) -> None:
        culled, _ = cull(self.graph, keys)
        dsk.update(culled)

    def add_rows_task(
        self, dsk: dict[Key, Any], key: Key, chunk: int, start: int, stop: int, take: Any
    ) -> None:
        from ._read import assemble_rows

        grid = [range(len(c)) for c in self.chunks[1:]]
        keys = [(self.array.name, chunk, *rest) for rest in itertools.product(*grid)]
        self._add_keys(dsk, keys)
        layout = tuple(len(c) for c in self.chunks[1:])
        dsk[key] = (assemble_rows, self.name, chunk, start, stop, take, layout, keys)

    def add_block_task(self, dsk: dict[Key, Any], key: Key, block: tuple[int, ...]) -> None:
        from ._read import read_block_result

        block_key = (self.array.name, *block)
        self._add_keys(dsk, [block_key])
        dsk[key] = (read_block_result, block_key)


def as_source(array: Any, role: str = "array") -> Source:
    """Validate ``array`` and wrap it as a :class:`Source`.

    ``role`` ("array", "features", "labels") names it in error messages.

    Raises
    ------
    ArgumentTypeError
        ``array`` is not an array, is a masked array (whose mask would be
        dropped), or has a dtype that is not fixed-size numbers (strings,
        bytes, Python objects; see :func:`_check_dtype`).
    ArgumentValueError
        ``array`` is 0-d, or a dask array with unknown chunk sizes.
    """
    _check_not_masked(role, array)
    if isinstance(array, da.Array):
        behind = _zarr_behind(array)
        if behind is not None:
            array = behind
    if isinstance(array, zarr.Array):
        shape = tuple(array.shape)
        _check_dims(role, shape)
        dtype = np.dtype(array.dtype)
        _check_dtype(role, dtype)
        chunks = da.core.normalize_chunks(array.chunks, shape)
        name = str(array.store_path)
        return SliceSource(name, shape, dtype, chunks, array, _token(array))
    if isinstance(array, np.ndarray):
        shape = array.shape
        _check_dims(role, shape)
        _check_dtype(role, array.dtype)
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
        _check_dtype(role, array.dtype)
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


# Kinds of fixed-size numbers: bool, signed and unsigned integers, floats,
# complex, timedelta64, datetime64.  Structured dtypes ("V" with fields) are
# checked field by field; raw fixed-size bytes ("V" without fields) are opaque
# records and stream like numbers.
_FIXED_SIZE_KINDS = frozenset("biufcmMV")
_KIND_NAMES = {
    "U": "fixed-width strings",
    "S": "fixed-width byte strings",
    "T": "variable-width strings",
    "O": "Python objects",
}


def _check_dtype(role: str, dtype: np.dtype[Any]) -> None:
    """Refuse dtypes whose elements are not fixed-size numbers.

    Strings, byte strings and Python objects have no meaningful fixed row
    size (window sizing and memory budgets rely on ``itemsize``), dask cannot
    chunk object arrays, and they are not what a training batch holds; they
    are refused for every stream and chunk job, from numpy, dask and Zarr
    alike.
    """
    bad, where = _first_unsupported(dtype, "")
    if bad is None:
        return
    what = _KIND_NAMES.get(bad.kind, f"kind {bad.kind!r}")
    field_note = f" (field {where!r} has dtype {bad}: {what})" if where else f" ({what})"
    raise ArgumentTypeError(
        f"{role} has dtype {dtype}{field_note}, which cannot be streamed; use a fixed-size "
        "numeric dtype (bool, integer, float, complex, datetime64, timedelta64) or a "
        "structured dtype of those, e.g. encode strings as integer ids first"
    )


def _first_unsupported(dtype: np.dtype[Any], where: str) -> tuple[np.dtype[Any] | None, str]:
    """The first (sub)dtype of ``dtype`` that is not fixed-size numbers, and its field path."""
    if dtype.subdtype is not None:  # a sub-array field such as ("y", "i2", (3,))
        return _first_unsupported(dtype.subdtype[0], where)
    if dtype.names is not None:
        for name in dtype.names:
            inner = f"{where}.{name}" if where else name
            found = _first_unsupported(dtype[name], inner)
            if found[0] is not None:
                return found
        return None, ""
    return (None, "") if dtype.kind in _FIXED_SIZE_KINDS else (dtype, where)


def _check_not_masked(role: str, array: Any) -> None:
    """Refuse masked arrays: slicing their data would drop the mask silently."""
    if isinstance(array, np.ma.MaskedArray):
        fill, mask = f"{role}.filled(value)", f"np.ma.getmaskarray({role})"
    elif isinstance(array, da.Array) and isinstance(array._meta, np.ma.MaskedArray):
        fill, mask = f"da.ma.filled({role}, value)", f"da.ma.getmaskarray({role})"
    else:
        return
    raise ArgumentTypeError(
        f"{role} is a masked array (shape {array.shape}, dtype {array.dtype}); streams "
        f"would drop its mask. Pass {fill} instead and, if the mask matters, stream "
        f"{mask} as a separate array of the same length"
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
