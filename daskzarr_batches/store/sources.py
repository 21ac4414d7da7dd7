"""Sources: anything array-like as a dask array whose chunks are the stored chunks.

:func:`open_array` is the public entry point.  Internally every stream works on
a :class:`Source`: a description of one array (name, shape, dtype, chunk
grid) and what a worker needs to read it.  Sources know nothing of tasks or
graphs; the read layer (``read``) builds those from them.

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
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import dask.array as da
import numpy as np
import zarr
import zarr.abc.store

from ..errors import (
    ArgumentTypeError,
    ArgumentValueError,
)
from .zarr_adapter import unwrapped_store

if TYPE_CHECKING:
    from ..plan.patches import Cut, PatchGrid
    from ..plan.splits import Ranges
    from ..plan.windows import IndexArray, RunIndex
    from .collections import ConcatSource
    from .joined import MixRule

__all__ = ["DaskSource", "SliceSource", "Source", "SourceLike", "as_source", "dim_names"]

Chunks = tuple[tuple[int, ...], ...]


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

    @property
    def carries_data(self) -> bool:
        """Whether pickling the source copies its array's data (sent to workers once)."""
        return False

    @property
    def sparse(self) -> bool:
        """Whether its windows and batches are ``scipy.sparse`` CSR matrices of rows."""
        return any(part.sparse for part in self.parts())

    @property
    def meta(self) -> Any:
        """An empty array of this source's kind (a dask array's ``meta``): numpy here."""
        return np.empty((0,) * len(self.shape), self.dtype)

    def empty_rows(self) -> Any:
        """No rows of this source, as its windows and batches hold rows."""
        return np.empty((0, *self.shape[1:]), self.dtype)

    @property
    def patched(self) -> Source | None:
        """The array a patch stream's output cuts its patches from (``None``: not one)."""
        return None

    @property
    def sliced(self) -> bool:
        """Whether this is a stored Zarr or numpy array, read by slicing it in a task."""
        return False

    @property
    def patch_grid(self) -> PatchGrid | None:
        """The grid of origins whose patches are this source's samples (``None``: rows)."""
        return None

    @property
    def patch_cut(self) -> Cut | None:
        """The cut of :attr:`patched` each sample is (``None``: not patches, or their origins)."""
        return None

    def patch_boxes(self, ids: IndexArray, counts: Sequence[int]) -> list[tuple[slice, ...]] | None:
        """The regions of :attr:`patched` that patches ``ids`` (``counts`` per unit) read,
        with the cuts read alongside (``None``: not a cut of an array)."""
        return None

    @property
    def split_axis(self) -> int | None:
        """The axis a chunk subset is split along (``None``: not a chunk subset)."""
        return None

    @property
    def subset_ranges(self) -> Ranges | None:
        """The usable positions of a chunk subset along its axis (``None``: not one)."""
        return None

    @property
    def mix_rule(self) -> MixRule | None:
        """What fixes a mixture's draws (``None``: not a mixture)."""
        return None

    @property
    def computed(self) -> bool:
        """Whether the rows are computed from the sample ids, never read (provenance)."""
        return False

    @property
    def member_sources(self) -> tuple[Source, ...]:
        """The arrays joined end to end along axis 0: a collection's members, else itself."""
        return (self,)

    def member_index(self) -> RunIndex | None:
        """The member of each sample id, for a collection (``None``: not a collection)."""
        return None

    def member_block(self, block: tuple[int, ...]) -> tuple[int, tuple[int, ...]]:
        """The member holding ``block`` and the block's index in its grid (here ``0``, itself)."""
        return 0, block

    def block_sizes(self, block: tuple[int, ...]) -> tuple[int, ...]:
        """The shape of ``block`` as a chunk stream hands it out."""
        return tuple(axis[i] for axis, i in zip(self.chunks, block, strict=True))

    def part_chunk(self, chunk: int) -> tuple[int, int] | None:
        """Which of :meth:`parts` holds chunk ``chunk`` (along a subset's axis, a collection's
        axis 0) and its chunk there (``None``: no part's chunk, e.g. patches' units)."""
        return None

    @property
    def joins_members(self) -> bool:
        """Whether a window of this source is read through a collection, members joined."""
        return any(part.joins_members for part in self.parts())

    def read_collection(self) -> ConcatSource | None:
        """The collection a window of this source is read from, member by member, if any.

        A collection itself, or the collection a chunk subset is cut from.
        """
        return None

    def member_offsets(self) -> tuple[int, ...]:
        """Where each member starts, for a collection of several; empty otherwise."""
        return ()

    def sized(self, unit_patches: int) -> Source:
        """This source with units that fit a window of ``unit_patches`` rows (patches only)."""
        return self

    def parts(self) -> tuple[Source, ...]:
        """The sources this one reads: a subset's or patch's base, a collection's members.

        None for a source that is itself a stored array (or computed, as provenance).
        """
        return ()

    def with_parts(self, parts: tuple[Source, ...]) -> Source:
        """This source reading ``parts`` (as :meth:`parts` lists them) instead."""
        return self

    def stored_sources(self) -> list[Source]:
        """The sources of the stored arrays beneath, each as far down as it goes."""
        parts = self.parts()
        if not parts:
            return [self]
        return [stored for part in parts for stored in part.stored_sources()]

    def blocks(self) -> Iterator[tuple[int, ...]]:
        """Block indices of every non-empty stored chunk, in C order."""
        return itertools.product(
            *([i for i, size in enumerate(sizes) if size > 0] for sizes in self.chunks)
        )

    def block_index(self, block: tuple[int, ...]) -> tuple[int, ...]:
        """The index of ``block`` in the chunk grid of the stored array (itself, here)."""
        return block

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
    made from it, so two arrays never share a key.  ``shards`` is the shard
    shape of a sharded Zarr array (each shard one stored object holding
    several chunks and an index of their byte ranges), ``None`` otherwise.
    """

    array: Any = field(repr=False, default=None)
    token: str = field(repr=False, default="")
    shards: tuple[int, ...] | None = None

    @property
    def sliced(self) -> bool:
        """A Zarr or numpy array: read by slicing it."""
        return True

    @property
    def stored(self) -> bool:
        """Whether the array is read from a Zarr store (not a numpy array)."""
        return isinstance(self.array, zarr.Array)

    @property
    def carries_data(self) -> bool:
        """Whether pickling the array copies its data (numpy, Zarr in memory).

        Such a source is sent to a cluster's workers once per stream instead
        of inside every graph.
        """
        if isinstance(self.array, np.ndarray):
            return True
        store = getattr(self.array, "store", None)
        return isinstance(unwrapped_store(store), zarr.storage.MemoryStore)


@dataclass(frozen=True)
class DaskSource(Source):
    """A general dask array, read through its own graph."""

    array: da.Array = field(repr=False, default=None)  # type: ignore[assignment]
    graph: dict[Any, Any] = field(repr=False, default_factory=dict)


class SourceLike:
    """An object that describes itself as a :class:`Source` (a chunk subset of an array).

    :func:`as_source` asks it through :meth:`describe`, so the store layer
    accepts such objects without knowing their kinds.
    """

    __slots__ = ()

    def describe(self, role: str) -> Source:
        """The source streams read ``self`` through (``role`` names it in errors)."""
        raise NotImplementedError


def as_source(array: Any, role: str = "array") -> Source:
    """Validate ``array`` and wrap it as a :class:`Source`.

    ``role`` ("array", "features", "labels") names it in error messages.

    An ``xarray.DataArray`` stands for its data (see :func:`_xarray_data`),
    samples along its first dimension; errors name it after its ``.name``.

    Raises
    ------
    ArgumentTypeError
        ``array`` is not an array, is a masked array (whose mask would be
        dropped), or has a dtype that is not fixed-size numbers (strings,
        bytes, Python objects; see :func:`_check_dtype`).
    ArgumentValueError
        ``array`` is 0-d, or a dask array with unknown chunk sizes.
    """
    if isinstance(array, Source):
        return array
    if isinstance(array, SourceLike):
        return array.describe(role)
    if is_xarray(array, "DataArray"):
        label = None if array.name is None else f"DataArray {str(array.name)!r}"
        if label is not None and str(array.name) != role:
            role = f"{role} ({label})"
        source = _as_source(_xarray_data(array), role)
        return source if label is None else replace(source, name=f"{label} ({source.name})")
    return _as_source(array, role)


def is_xarray(obj: Any, kind: str) -> bool:
    """Whether ``obj`` is an ``xarray.<kind>`` (``"DataArray"``, ``"Dataset"``).

    Never imports xarray: an object of it exists only if it is imported.
    """
    xarray = sys.modules.get("xarray")
    cls = getattr(xarray, kind, None) if xarray is not None else None
    return isinstance(cls, type) and isinstance(obj, cls)


def dim_names(array: Any) -> tuple[str | None, ...] | None:
    """The names of ``array``'s dims, or ``None`` if it names none.

    An ``xarray.DataArray``'s dims; a Zarr array's own names: a v3 array's
    ``dimension_names``, a v2 array's ``_ARRAY_DIMENSIONS`` attribute
    (xarray's convention), also behind a dask array made by
    :func:`open_array` or ``da.from_zarr``.  A dim Zarr leaves unnamed is
    ``None``.
    """
    if is_xarray(array, "DataArray"):
        return tuple(str(dim) for dim in array.dims)
    if isinstance(array, da.Array):
        array = _zarr_behind(array)
    if not isinstance(array, zarr.Array):
        return None
    names = getattr(array.metadata, "dimension_names", None)  # v3 (public metadata)
    if names is None and array.metadata.zarr_format == 2:
        names = array.attrs.get("_ARRAY_DIMENSIONS")
    if (
        not isinstance(names, list | tuple)
        or len(names) != array.ndim
        or not all(name is None or isinstance(name, str) for name in names)
        or all(name is None for name in names)
    ):
        return None
    return tuple(names)


def _xarray_data(array: Any) -> Any:
    """The array behind an ``xarray.DataArray``, keeping dask chunks.

    A dask-backed DataArray (``xr.open_zarr``, ``open_dataset(chunks={})``,
    ``.chunk()``) gives its dask array, whose chunks the streams read; one in
    memory gives its numpy array.  One lazily backed without dask (e.g.
    ``xr.open_zarr(..., chunks=None)``) gives ``.data``, which xarray loads
    into memory.
    """
    inner = array.variable._data
    if isinstance(inner, da.Array | np.ndarray):
        return inner
    return array.data


def _as_source(array: Any, role: str) -> Source:
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
        shards = None if array.shards is None else tuple(array.shards)
        return SliceSource(name, shape, dtype, chunks, array, _token(array), shards)
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
        f"{role} must be a zarr.Array, dask.array.Array, numpy.ndarray or xarray.DataArray, "
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
