"""``chunk_split``: train / validation / test subsets made of whole stored chunks.

The arguments are validated here (each error names the value); the split
itself is ``plan.splits`` (pure arithmetic) and the subsets are
``store.subsets.ChunkSubset``, which every stream, the ``Loader`` and
map/reduce accept in place of the data.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import ArgumentTypeError, ArgumentValueError, LengthMismatchError
from ..plan.splits import (
    FRACTION_TOLERANCE,
    merge_ranges,
    shared_boundaries,
    split_units,
    usable_ranges,
)
from ..plan.windows import chunk_offsets
from ..store.collections import Collection
from ..store.sources import SourceLike, as_source, dim_names, is_xarray
from ..store.subsets import ChunkSubset
from .spec import as_array, non_negative_int

__all__ = ["chunk_split"]


def chunk_split(
    data: Any, fractions: Sequence[float], *, dim: int | str = 0, seed: int = 0, gap: int = 0
) -> list[ChunkSubset]:
    """Split data into subsets of whole stored chunks along one dimension.

    Each subset is a random (seeded) set of the stored chunks along ``dim``,
    sized by its fraction; pass it wherever the data is accepted (every
    batch stream constructor, [`plan_epoch`][daskzarr_batches.plan_epoch],
    [`Loader`][daskzarr_batches.Loader],
    [`chunk_stream`][daskzarr_batches.chunk_stream], [`map_chunks`][daskzarr_batches.map_chunks],
    [`reduce_chunks`][daskzarr_batches.reduce_chunks],
    [`feature_moments`][daskzarr_batches.feature_moments]).  A stream over a subset reads only the
    subset's chunks, so a chunk is never shared between, say, training and
    validation.

    Parameters
    ----------
    data : array, path, tuple or dict of arrays
        A ``zarr.Array``, ``dask.array.Array``, ``numpy.ndarray``,
        ``xarray.DataArray``, a path or URL (opened with
        [`open_array`][daskzarr_batches.open_array]),
        or a tuple or dict of those with the same length along ``dim``
        (paired data, split together: the units are then the blocks between
        the chunk boundaries every array shares; numpy arrays, which have no
        stored chunks, do not count).
    fractions : sequence of float
        One positive fraction per subset, summing to at most 1 (plus a
        rounding tolerance of 1e-9); a sum below 1 leaves the rest of the
        chunks unused.
    dim : int or str, default 0
        The dimension to split along: an axis (negative counts from the
        end), or a dimension name: of ``xarray.DataArray`` data, or of a
        Zarr array (v3 ``dimension_names``, v2 ``_ARRAY_DIMENSIONS``).
    seed : int, default 0
        Seeds which chunks go to which subset (non-negative); the same seed
        gives the same split.
    gap : int, default 0
        Positions along ``dim`` left out of a subset next to every chunk it
        does not own (another subset's, or an unused one), so that windows
        along ``dim`` (time steps, forecast targets) of two subsets stay
        ``gap`` apart.  The ends of the array and borders between two chunks
        of the same subset are not trimmed.

    Returns
    -------
    list of ChunkSubset
        One per fraction, in order.  Subset ``i`` holds whole units (chunks)
        laid out at random; its length before the gap is within one unit of
        ``fractions[i] * n`` (a fraction below one unit still gets one
        unit).  ``subset.ranges`` are the positions it uses, ``len(subset)``
        their number.

    Raises
    ------
    ArgumentTypeError
        ``data`` is not an array (or tuple or dict of arrays), ``fractions``
        not a sequence of numbers, ``dim`` a name for data without names,
        ``seed`` or ``gap`` not an integer.
    ArgumentValueError
        A fraction is not positive, they sum to more than 1, ``dim`` is out
        of range or names no dimension, ``seed`` or ``gap`` is negative,
        the data has fewer chunks along ``dim`` than there are subsets, or
        the gap leaves a subset no position.
    LengthMismatchError
        The arrays of a tuple or dict differ in length along ``dim``.

    Examples
    --------
    >>> import numpy as np, daskzarr_batches as dzb, zarr
    >>> x = zarr.create_array(zarr.storage.MemoryStore(), shape=(1000, 4), chunks=(100, 4),
    ...                       dtype="f4")
    >>> train, valid = dzb.chunk_split(x, [0.8, 0.2], seed=1)
    >>> len(train), len(valid), len(train.chunks), valid.chunks
    (800, 200, 8, (0, 8))
    """
    data = _opened(data)
    shares = _fractions(fractions)
    seed = non_negative_int("seed", seed)
    gap = non_negative_int("gap", gap)
    named = _named(data)
    sources = [as_source(array, role) for role, array in named]
    axis = _axis(dim, named, [source.shape for source in sources])
    lengths = {role: source.shape[axis] for (role, _), source in zip(named, sources, strict=True)}
    if len(set(lengths.values())) > 1:
        described = ", ".join(f"{role} has {n}" for role, n in lengths.items())
        raise LengthMismatchError(
            f"the arrays of data must have the same length along dim={dim!r}: {described}"
        )
    offsets = [chunk_offsets(source.chunks[axis]) for source in sources]
    # a numpy array has no stored chunks: it does not constrain the units of others
    chunked = [o for o, (_, a) in zip(offsets, named, strict=True) if not _in_memory(a)]
    bounds = shared_boundaries(chunked or offsets)
    count = len(bounds) - 1
    if count < len(shares):
        unit = "chunks" if len(sources) == 1 else "blocks of chunks shared by every array"
        raise ArgumentValueError(
            f"data has {count} {unit} along dim={dim!r} (axis {axis}, chunks "
            f"{sources[0].chunks[axis]}), fewer than the {len(shares)} subsets of "
            f"fractions={list(fractions)!r}: each subset needs at least one"
        )
    units = split_units(np.diff(bounds).tolist(), shares, seed)
    subsets = []
    for index, (owned, fraction) in enumerate(zip(units, fractions, strict=True)):
        ranges = usable_ranges(bounds, owned, gap)
        if not ranges:
            raise ArgumentValueError(
                f"gap={gap} leaves subset {index} (fraction {fraction!r}, "
                f"{int(np.diff(bounds)[owned].sum())} positions in {len(owned)} chunk(s)) "
                "no usable position; use a smaller gap or larger chunks"
            )
        if len(chunked or offsets) == 1:  # chunk indices of the grid (empty chunks skipped)
            starts = bounds[owned]
            chunks = np.searchsorted((chunked or offsets)[0], starts, side="right") - 1
        else:
            chunks = owned
        extents = merge_ranges([(int(bounds[u]), int(bounds[u + 1])) for u in owned])
        subset = ChunkSubset(
            data, dim=dim, axis=axis, chunks=tuple(int(c) for c in chunks), ranges=ranges,
            index=index, fraction=fraction, extents=extents,
        )  # fmt: skip
        subsets.append(subset)
    return subsets


def _opened(data: Any) -> Any:
    """``data`` with every path opened: an array, a tuple or a dict of arrays."""
    if isinstance(data, SourceLike) and not isinstance(data, Collection):
        raise ArgumentTypeError(
            f"data is already a chunk subset ({data!r}); split the whole data instead"
        )
    if isinstance(data, Mapping):
        if not data:
            raise ArgumentValueError("data is an empty dict")
        return {key: _opened(value) for key, value in data.items()}
    if isinstance(data, tuple | list):
        if not data:
            raise ArgumentValueError("data is an empty tuple")
        return tuple(_opened(value) for value in data)
    return as_array(data)


def _in_memory(array: Any) -> bool:
    """Whether ``array`` is a numpy array (also behind an ``xarray.DataArray``)."""
    if is_xarray(array, "DataArray"):
        array = array.variable._data
    return isinstance(array, np.ndarray)


def _named(data: Any) -> list[tuple[str, Any]]:
    """``(role, array)`` for each array of ``data``: errors name them."""
    if isinstance(data, Mapping):
        return [(f"data[{key!r}]", array) for key, array in data.items()]
    if isinstance(data, tuple):
        return [(f"data[{i}]", array) for i, array in enumerate(data)]
    return [("data", data)]


def _fractions(fractions: Any) -> list[float]:
    """``fractions`` as floats: positive, finite, summing to at most 1 (+ tolerance)."""
    if isinstance(fractions, str | bytes) or not isinstance(fractions, Sequence | np.ndarray):
        raise ArgumentTypeError(
            f"fractions must be a sequence of numbers such as [0.8, 0.1, 0.1], got {fractions!r}"
        )
    if len(fractions) == 0:
        raise ArgumentValueError("fractions is empty: give one fraction per subset")
    shares = []
    for i, value in enumerate(fractions):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ArgumentTypeError(f"fractions[{i}] must be a number, got {value!r}")
        share = float(value)
        if not (share > 0 and math.isfinite(share)):
            raise ArgumentValueError(f"fractions[{i}] must be > 0 and finite, got {value!r}")
        shares.append(share)
    total = math.fsum(shares)
    if total > 1 + FRACTION_TOLERANCE:
        raise ArgumentValueError(
            f"fractions must sum to at most 1, got {list(fractions)!r} (sum {total!r})"
        )
    return shares


def _axis(dim: Any, named: list[tuple[str, Any]], shapes: list[tuple[int, ...]]) -> int:
    """The axis ``dim`` is in every array (the same for all)."""
    axes = []
    for (role, array), shape in zip(named, shapes, strict=True):
        ndim = len(shape)
        if isinstance(dim, str):
            names = dim_names(array)
            if names is None:
                raise ArgumentTypeError(
                    f"dim={dim!r} is a name, but {role} ({type(array).__name__}) has no "
                    "named dimensions (an xarray.DataArray's dims and a Zarr array's "
                    "dimension_names name them); pass an axis number"
                )
            if dim not in names:
                raise ArgumentValueError(f"dim={dim!r} is not a dimension of {role}: {names}")
            axes.append(names.index(dim))
        elif isinstance(dim, numbers.Integral) and not isinstance(dim, bool):
            if not -ndim <= int(dim) < ndim:
                raise ArgumentValueError(
                    f"dim={dim!r} is out of range for {role} of {ndim} dimension(s) (shape {shape})"
                )
            axes.append(int(dim) % ndim)
        else:
            raise ArgumentTypeError(f"dim must be an axis number or a dimension name, got {dim!r}")
    if len(set(axes)) > 1:
        where = ", ".join(f"axis {a} of {role}" for a, (role, _) in zip(axes, named, strict=True))
        raise ArgumentValueError(
            f"dim={dim!r} is not the same axis in every array ({where}); "
            "transpose them to one order first"
        )
    return axes[0]
