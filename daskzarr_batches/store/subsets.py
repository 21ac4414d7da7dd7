"""Chunk subsets: whole stored chunks of an array along one axis, read in place.

:class:`ChunkSubset` is what ``chunk_split`` returns: the data, the axis it
was split along, the chunks it owns and the ranges of positions it may use
(after the gap kept from the other subsets).  Streams read it through a
:class:`SubsetSource`: a source whose chunks along the split axis are the
usable ranges cut at the stored array's chunk boundaries, each piece mapped
to its place in the stored array, so that a read of the subset decodes only
the subset's chunks of the array itself (the read layer's graph builders map
the pieces; nothing is copied).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ArgumentTypeError
from ..plan.splits import Ranges, cut_at_chunks, merge_ranges
from ..plan.windows import ChunkPiece, chunk_offsets
from .sources import Source, SourceLike, as_source

if TYPE_CHECKING:
    from .collections import ConcatSource

__all__ = ["ChunkSubset", "SubsetSource", "subset_source"]


@dataclass(frozen=True)
class SubsetSource(Source):
    """The usable ranges of a stored array along ``axis``, as a source of their own.

    Its chunks along ``axis`` are the ``spans``: ``(chunk, start, stop)``,
    the ranges cut at the base array's chunk boundaries, in the base array's
    coordinates (each span lies in one base chunk; spans ascend).  Its other
    axes are the base array's.
    """

    base: Source = field(repr=False, default=None)  # type: ignore[assignment]
    axis: int = 0
    spans: tuple[tuple[int, int, int], ...] = ()
    ranges: Ranges = ()

    def read_collection(self) -> ConcatSource | None:
        """The collection this subset is cut from, if it is cut from one."""
        return self.base.read_collection()

    @property
    def split_axis(self) -> int:
        """``axis``."""
        return self.axis

    @property
    def subset_ranges(self) -> Ranges:
        """``ranges``."""
        return self.ranges

    def part_chunk(self, chunk: int) -> tuple[int, int]:
        """The base array's chunk that span ``chunk`` lies in."""
        return 0, self.spans[chunk][0]

    def parts(self) -> tuple[Source, ...]:
        """The base array this subset reads in place."""
        return (self.base,)

    def with_parts(self, parts: tuple[Source, ...]) -> Source:
        """This subset of ``parts[0]``."""
        (base,) = parts
        return replace(self, base=base)

    def base_piece(self, piece: ChunkPiece) -> ChunkPiece:
        """Axis-0 ``piece`` of this source as a piece of the base array's chunk.

        The piece decodes the base chunk whole (as every read does) and keeps
        the same rows, ``take`` shifted to where they sit in that chunk.
        """
        chunk, start, _ = self.spans[piece.chunk]
        first, end = int(self._base_offsets[chunk]), int(self._base_offsets[chunk + 1])
        shift = start - first
        take = piece.take
        if isinstance(take, slice):
            rows = range(piece.rows)[take]
            take = slice(rows.start + shift, rows.stop + shift, rows.step)
        else:
            take = np.asarray(take, dtype=np.int64) + shift
        return ChunkPiece(chunk, first, end, take, piece.dest)

    @functools.cached_property
    def _base_offsets(self) -> np.ndarray:
        return chunk_offsets(self.base.chunks[0])

    def local_chunks(self) -> dict[int, tuple[int, int, int]]:
        """Base axis-0 chunk -> ``(chunk, start, stop)`` of this source (for reports)."""
        out = {}
        at = 0
        for local, (chunk, start, stop) in enumerate(self.spans):
            out[chunk] = (local, at, at + stop - start)
            at += stop - start
        return out

    def block_index(self, block: tuple[int, ...]) -> tuple[int, ...]:
        """The stored block that holds ``block`` of this source."""
        index = list(block)
        index[self.axis] = self.spans[block[self.axis]][0]
        return tuple(index)

    def block_slices(self, block: tuple[int, ...]) -> tuple[slice, ...]:
        """Where ``block`` of this source sits in the base array (cropped to the ranges)."""
        slices = list(self.base.block_slices(self.block_index(block)))
        _, start, stop = self.spans[block[self.axis]]
        slices[self.axis] = slice(start, stop)
        return tuple(slices)


def subset_source(base: Source, axis: int, ranges: Ranges, index: int) -> SubsetSource:
    """``ranges`` of ``base`` along ``axis`` as a :class:`SubsetSource`."""
    spans = cut_at_chunks(ranges, chunk_offsets(base.chunks[axis]))
    shape = list(base.shape)
    shape[axis] = sum(stop - start for _, start, stop in spans)
    chunks = list(base.chunks)
    chunks[axis] = tuple(stop - start for _, start, stop in spans)
    return SubsetSource(
        f"{base.name} [chunk subset {index}]", tuple(shape), base.dtype, tuple(chunks),
        base, axis, spans, ranges,
    )  # fmt: skip


class ChunkSubset(SourceLike):
    """Whole stored chunks of some data along one axis: one part of a chunk-aligned split.

    Made by [`chunk_split`][daskzarr_batches.chunk_split]; pass it wherever the data
    itself is accepted (the stream constructors, [`plan_epoch`][daskzarr_batches.plan_epoch],
    [`Loader`][daskzarr_batches.Loader], [`chunk_stream`][daskzarr_batches.chunk_stream],
    [`map_chunks`][daskzarr_batches.map_chunks],
    [`reduce_chunks`][daskzarr_batches.reduce_chunks],
    [`feature_moments`][daskzarr_batches.feature_moments]).  A stream over a subset
    reads only the subset's chunks, in place.

    Attributes
    ----------
    data : array, tuple or dict of arrays
        The data as given to ``chunk_split`` (a path opened as an array).
    dim : int or str
        The dimension as given (a name for ``xarray.DataArray`` data).
    axis : int
        The axis the data was split along (non-negative).
    chunks : tuple of int
        The subset's chunks along ``axis``, ascending: chunk indices of the
        array's grid, or, for a tuple or dict of arrays, indices of the units
        (the blocks between chunk boundaries every array shares).
    ranges : tuple of (int, int)
        The usable positions along ``axis``: the subset's chunks less
        ``gap`` positions next to any chunk it does not own; sorted,
        disjoint, adjacent ones merged.
    index : int
        Which subset of the split (the position of its fraction).
    fraction : float
        Its fraction, as given.

    Notes
    -----
    ``len(subset)`` is the number of usable positions.  For a tuple or dict
    of arrays, ``subset[i]`` / ``subset[name]`` is the subset of that one
    array (same ranges; ``chunks`` then that array's own chunk indices),
    iterating goes over the arrays' subsets (a tuple) or the names (a dict),
    and ``keys()`` gives the names.
    """

    __slots__ = ("_axis", "_chunks", "_data", "_dim", "_extents", "_fraction", "_index", "_ranges")

    def __init__(
        self,
        data: Any,
        *,
        dim: int | str,
        axis: int,
        chunks: tuple[int, ...],
        ranges: Ranges,
        index: int,
        fraction: float,
        extents: Ranges | None = None,
    ) -> None:
        self._data = data
        self._dim = dim
        self._axis = int(axis)
        self._chunks = tuple(int(c) for c in chunks)
        self._ranges = merge_ranges(ranges)
        self._index = int(index)
        self._fraction = fraction
        #: the positions of the subset's chunks, before the gap
        self._extents = self._ranges if extents is None else merge_ranges(extents)

    data = property(lambda self: self._data, doc="The data, as given (a path opened).")
    dim = property(lambda self: self._dim, doc="The dimension, as given (int or name).")
    axis = property(lambda self: self._axis, doc="The axis split along.")
    chunks = property(lambda self: self._chunks, doc="Chunk (or unit) indices along axis.")
    ranges = property(lambda self: self._ranges, doc="Usable ``(start, stop)`` ranges.")
    index = property(lambda self: self._index, doc="Which subset of the split.")
    fraction = property(lambda self: self._fraction, doc="Its fraction, as given.")

    def __len__(self) -> int:
        return sum(stop - start for start, stop in self._ranges)

    @property
    def paired(self) -> bool:
        """Whether the data is a tuple or dict of arrays."""
        return isinstance(self._data, tuple | list | Mapping)

    def __getitem__(self, key: Any) -> ChunkSubset:
        if not self.paired:
            raise TypeError(
                f"subset {self._index} is of one array; only a subset of a tuple or dict "
                "of arrays has items"
            )
        array = self._data[key]
        offsets = chunk_offsets(as_source(array).chunks[self._axis])
        own = sorted({chunk for chunk, _, _ in cut_at_chunks(self._extents, offsets)})
        return ChunkSubset(
            array, dim=self._dim, axis=self._axis, chunks=tuple(own), ranges=self._ranges,
            index=self._index, fraction=self._fraction, extents=self._extents,
        )  # fmt: skip

    def __iter__(self) -> Iterator[Any]:
        if isinstance(self._data, Mapping):
            return iter(self._data)
        if self.paired:
            return (self[i] for i in range(len(self._data)))
        raise TypeError(f"subset {self._index} is of one array; it is not iterable")

    def keys(self) -> Any:
        """The names of a dict's arrays."""
        if not isinstance(self._data, Mapping):
            raise TypeError(f"subset {self._index} is not of a dict of arrays")
        return self._data.keys()

    def describe(self, role: str) -> Source:
        """The `SubsetSource` streams read (one array only)."""
        if self.paired:
            what = "dict" if isinstance(self._data, Mapping) else "tuple"
            raise ArgumentTypeError(
                f"{role} is chunk subset {self._index} of a {what} of {len(self._data)} "
                f"arrays; pass it whole as a stream's data (a tuple's subset streams its "
                f"arrays together), or the subset of one array, subset[key]"
            )
        return subset_source(as_source(self._data, role), self._axis, self._ranges, self._index)

    def __repr__(self) -> str:
        if isinstance(self._data, Mapping):
            what = f"dict of {len(self._data)} arrays {list(self._data)!r}"
        elif self.paired:
            what = f"tuple of {len(self._data)} arrays"
        else:
            what = f"{type(self._data).__name__} of shape {tuple(self._data.shape)}"
        dim = f"dim={self._dim!r}" + ("" if self._dim == self._axis else f" (axis {self._axis})")
        return (
            f"ChunkSubset(index={self._index}, fraction={self._fraction!r}, {dim}, "
            f"{len(self._chunks)} chunks, {len(self)} positions in {len(self._ranges)} "
            f"range(s), data={what})"
        )
