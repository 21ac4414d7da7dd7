"""What a chunk reader is asked for: :class:`ChunkRequest`, and the :class:`ChunkReader` protocol.

Every decode of a stored chunk, by every stream kind, is one request to the
reader of its array (``store.reader_hook``): the stored chunk's grid
coordinates (a sharded array's inner chunk), the part of it wanted and where
that part goes.  A reader fills ``out[where]`` with ``chunk[selection]`` for
each request it is given, or raises.  The public names are re-exported by
``daskzarr_batches.readers``.

This module also builds the requests of a window's pieces and of a block, and
reads any list of requests chunk by chunk (:func:`read_each`), which is what
the library's reader does with requests it did not plan itself.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
import zarr

from .zarr_adapter import async_array, sync

if TYPE_CHECKING:
    from ..plan.windows import ChunkPiece

__all__ = [
    "ChunkReader",
    "ChunkRequest",
    "ReaderFactory",
    "block_requests",
    "chunk_region",
    "chunk_shape_of",
    "read_each",
    "window_requests",
]


@dataclass(frozen=True, eq=False, slots=True)
class ChunkRequest:
    """One stored chunk to decode, the part of it wanted, and where that part goes.

    Attributes
    ----------
    chunk : tuple of int
        The stored chunk's coordinates in the array's chunk grid (a sharded
        array's inner chunk; an array in memory: the chunks its stream
        declares).
    region : tuple of slice
        The chunk's region of the array (cropped at the array's edge).
    selection : tuple
        What of the chunk is wanted, in the chunk's own coordinates: one
        item per axis, a ``slice`` or (first axis only) an ascending 1-D
        integer array.
    out : numpy.ndarray
        The array the part goes into (made by the read context: a window's
        output, a block of its own).
    where : tuple
        Where in ``out``: the reader does ``out[where] = chunk[selection]``.

    Examples
    --------
    A reader that counts its requests and lets the library read them:

    >>> from daskzarr_batches.readers import ChunkRequest
    >>> class Counting:
    ...     def __init__(self, inner):
    ...         self.inner, self.seen = inner, []
    ...     def read(self, requests):
    ...         self.seen.extend(r.chunk for r in requests)
    ...         self.inner.read(requests)
    """

    chunk: tuple[int, ...]
    region: tuple[slice, ...]
    selection: tuple[Any, ...]
    out: np.ndarray
    where: tuple[Any, ...]

    def fill(self, decoded: Any) -> None:
        """Put the wanted part of ``decoded`` (the whole chunk, as stored) into its place.

        ``decoded`` may be the chunk as stored (an edge chunk at the full
        chunk shape) or cropped to the array: it is cropped to ``region`` first.
        """
        self.out[self.where] = self.part(decoded)

    def part(self, decoded: Any) -> Any:
        """The wanted part of ``decoded`` (the whole chunk, as stored or cropped), a view."""
        crop = tuple(slice(0, where.stop - where.start) for where in self.region)
        return np.asarray(decoded)[crop][self.selection]

    def wanted(self) -> tuple[Any, ...]:
        """The selection in the array's coordinates (orthogonal: a slice or indices per axis)."""
        out: list[Any] = []
        for part, where in zip(self.selection, self.region, strict=True):
            if isinstance(part, slice):
                first, stop, step = part.indices(where.stop - where.start)
                out.append(slice(where.start + first, where.start + stop, step))
            else:
                out.append(np.asarray(part) + where.start)
        return tuple(out)


@runtime_checkable
class ChunkReader(Protocol):
    """Reads stored chunks: ``read(requests)`` fills each request's place, or raises.

    The library hands a reader factory (``ReadOptions(reader=factory)``) the
    reader it chose for an array (``default``); a reader of your own may
    serve some requests itself and pass the rest on to it, or read them all
    (a format the library does not know).  ``read`` is called from the
    thread that runs the read task, several at once on a stream's threads.
    """

    def read(self, requests: Sequence[ChunkRequest]) -> None:
        """Fill ``request.out[request.where]`` with ``chunk[request.selection]``, for each."""


#: ``factory(array, default) -> ChunkReader``: called once per stored array per stream,
#: in each process that reads it; ``default`` is the reader the library chose.
ReaderFactory = Callable[[Any, ChunkReader], ChunkReader]


def chunk_shape_of(array: Any) -> tuple[int, ...]:
    """The shape of one stored chunk (an inner chunk when sharded; in memory: the whole array)."""
    if isinstance(array, zarr.Array):
        return tuple(array.chunks)
    chunks = getattr(array, "chunks", None)
    if chunks and isinstance(chunks[0], tuple):  # a dask array: its first block's shape
        return tuple(int(c[0]) if c else 0 for c in chunks)
    return tuple(max(int(n), 1) for n in np.shape(array))


def _starts(array: Any, axis: int, index: int) -> tuple[int, int]:
    chunks = getattr(array, "chunks", None)
    if not isinstance(array, zarr.Array) and chunks and isinstance(chunks[0], tuple):
        sizes = chunks[axis]  # dask: uneven blocks
        start = int(sum(sizes[:index]))
        return start, start + int(sizes[index])
    size = chunk_shape_of(array)[axis]
    start = index * size
    return start, min(start + size, int(array.shape[axis]))


def chunk_region(array: Any, chunk: Sequence[int]) -> tuple[slice, ...]:
    """Chunk ``chunk``'s region of ``array``: one slice per axis, cropped at its edge."""
    return tuple(slice(*_starts(array, axis, i)) for axis, i in enumerate(chunk))


def _trailing_chunks(array: Any) -> list[tuple[tuple[int, ...], tuple[slice, ...]]]:
    """Each chunk position along the axes after the first, with its region there."""
    axes = []
    for axis in range(1, len(array.shape)):
        size = chunk_shape_of(array)[axis]
        n = int(array.shape[axis])
        count = -(-n // size) if size else 0
        axes.append([(i, slice(*_starts(array, axis, i))) for i in range(count)])
    out = []
    for combo in itertools.product(*axes):
        out.append((tuple(i for i, _ in combo), tuple(s for _, s in combo)))
    return out


def window_requests(
    array: Any,
    ordered: Sequence[ChunkPiece],
    out: np.ndarray,
    plan_order: bool,
    at: int = 0,
) -> list[ChunkRequest]:
    """The requests of a window's pieces (ascending chunk order), its rows going to ``out``.

    Each piece's rows ``take`` of axis-0 chunk ``piece.chunk`` (samples
    ``piece.start:piece.stop``), from every chunk across the other axes, go
    to ``out`` from row ``at`` on in ascending sample order, or to the
    piece's ``dest`` with ``plan_order``.
    """
    from .rows import taken

    trailing = [
        (coords, region, tuple(slice(0, s.stop - s.start) for s in region))
        for coords, region in _trailing_chunks(array)
    ]
    requests = []
    for piece in ordered:
        rows = taken(piece)
        where0 = piece.dest if plan_order else slice(at, at + rows)
        at += rows
        first = slice(piece.start, piece.stop)
        for coords, region, local in trailing:
            requests.append(
                ChunkRequest(
                    (piece.chunk, *coords), (first, *region), (piece.take, *local), out,
                    (where0, *region),
                )
            )  # fmt: skip
    return requests


def block_requests(
    array: Any,
    slices: tuple[slice, ...],
    out: np.ndarray,
    block: tuple[int, ...] | None = None,
) -> list[ChunkRequest]:
    """The requests of the stored chunks under region ``slices`` of ``array``, into ``out``.

    ``out`` has the region's shape; each chunk the region overlaps gives its
    overlap, cut from the chunk.  ``block``: the region is that one chunk
    (an array in memory, whose chunks its stream declares).
    """
    if block is not None:
        whole = tuple(slice(0, s.stop - s.start) for s in slices)
        return [ChunkRequest(tuple(block), tuple(slices), whole, out, whole)]
    shape = chunk_shape_of(array)
    ranges = []
    for axis, s in enumerate(slices):
        first = s.start // shape[axis] if shape[axis] else 0
        last = (s.stop - 1) // shape[axis] if shape[axis] and s.stop > s.start else first - 1
        ranges.append(range(first, last + 1))
    requests = []
    for chunk in itertools.product(*ranges):
        region = chunk_region(array, chunk)
        sel, where = [], []
        for r, s in zip(region, slices, strict=True):
            lo, hi = max(r.start, s.start), min(r.stop, s.stop)
            sel.append(slice(lo - r.start, hi - r.start))
            where.append(slice(lo - s.start, hi - s.start))
        requests.append(ChunkRequest(tuple(chunk), region, tuple(sel), out, tuple(where)))
    return requests


def _plain(selection: tuple[Any, ...]) -> bool:
    return all(isinstance(part, slice) and part.step in (None, 1) for part in selection)


def read_each(
    view: Any,
    requests: Sequence[ChunkRequest],
    run: Callable[[Any], Any] = sync,
    limit: int | None = None,
) -> None:
    """Read ``requests`` of ``view`` chunk by chunk: Zarr's reads concurrent on its loop.

    What the library's reader does with requests it did not plan (a wrapper
    that serves some itself): each request reads its part of its chunk (an
    orthogonal selection), the parts at most ``limit`` at a time; an array
    in memory is sliced, a dask array computed on this thread.  ``run`` runs
    a coroutine on Zarr's loop (a cancellation scope's, else ``sync``).
    """
    if not requests:
        return
    inner = async_array(view) if isinstance(view, zarr.Array) else None
    if inner is None:
        for request in requests:
            wanted = request.wanted()
            part = view[wanted] if _plain(wanted) else _orthogonal(view, wanted)
            compute = getattr(part, "compute", None)
            request.out[request.where] = np.asarray(part if compute is None else compute())
        return

    async def read_all() -> None:
        gate = asyncio.Semaphore(limit or zarr.config.get("async.concurrency") or 10)

        async def one(request: ChunkRequest) -> None:
            async with gate:
                wanted = request.wanted()
                if _plain(wanted):
                    part = await inner.getitem(wanted)
                else:
                    part = await inner.get_orthogonal_selection(wanted)
                request.out[request.where] = np.asarray(part)

        async with asyncio.TaskGroup() as group:
            for request in requests:
                group.create_task(one(request))

    run(read_all())


def _orthogonal(array: Any, wanted: tuple[Any, ...]) -> Any:
    """``array`` at an orthogonal selection, one axis at a time (numpy or dask)."""
    part = array
    for axis, index in enumerate(wanted):
        part = part[(slice(None),) * axis + (index,)]
    return part


def chunks_of(requests: Sequence[ChunkRequest]) -> Iterator[tuple[int, ...]]:
    """The distinct chunks of ``requests``, in order."""
    return iter(dict.fromkeys(request.chunk for request in requests))
