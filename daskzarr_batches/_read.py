"""Reading: a planned window (or one stored block) becomes one dask graph.

The functions at the top run inside dask tasks (threads or distributed
workers), so they are plain module-level functions of picklable arguments.
The graph builders below them only arrange those tasks; they do no I/O.

A window graph, for each array of the stream::

    read/take (chunk c0) ─┐
    read/take (chunk c1) ─┼─> gather (window rows in plan order) ─┐
    ...                  ─┘                                       ├─> window
    (same for labels) ────────────────────────────────────────────┘

Each stored chunk is decoded by exactly one task per window, which keeps only
the rows the window needs, so an exact-shuffle window never holds whole
chunks it does not need.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ._errors import ChunkReadError
from ._plan import Selector, Window
from ._sources import Key, Source

__all__ = ["block_graph", "window_graph"]


# --------------------------------------------------------------------------
# Task functions (run on the scheduler's workers)


def read_rows(
    array: Any, name: str, chunk: int, start: int, stop: int, take: Selector
) -> np.ndarray:
    """Decode axis-0 chunk ``chunk`` (rows ``start:stop``) and keep ``take``."""
    try:
        slab = np.asarray(array[start:stop])
    except Exception as exc:
        raise ChunkReadError(
            f"could not read axis-0 chunk {chunk} (samples {start}:{stop}) of "
            f"array {name}: {type(exc).__name__}: {exc}"
        ) from exc
    return slab[take]


def read_block(
    array: Any, name: str, block: tuple[int, ...], slices: tuple[slice, ...]
) -> np.ndarray:
    """Decode one stored block, returned as an array the caller owns."""
    try:
        result = np.asarray(array[slices])
    except Exception as exc:
        raise ChunkReadError(
            f"could not read chunk {block} of array {name}: {type(exc).__name__}: {exc}"
        ) from exc
    return _owned(result)


def read_block_result(block: Any) -> np.ndarray:
    """Copy a dask array's block result into an array the caller owns.

    Always a copy: the result may be an object held by the graph itself (a
    literal or delayed array) or shared between blocks, even when it owns its
    data.
    """
    return np.array(block, copy=True)


def assemble_rows(
    name: str,
    chunk: int,
    start: int,
    stop: int,
    take: Selector,
    layout: tuple[int, ...],
    blocks: Sequence[np.ndarray],
) -> np.ndarray:
    """Join the blocks of one axis-0 chunk of a dask array and keep ``take``."""
    if len(blocks) == 1:
        slab = np.asarray(blocks[0])
    else:
        nested: Any = np.empty(layout, dtype=object)
        for index, block in zip(itertools.product(*map(range, layout)), blocks, strict=True):
            nested[index] = np.asarray(block)
        slab = np.block(nested.tolist()) if layout else np.asarray(blocks[0])
    if slab.shape[0] != stop - start:
        raise ChunkReadError(
            f"axis-0 chunk {chunk} of array {name} has {slab.shape[0]} rows, "
            f"expected {stop - start} (samples {start}:{stop})"
        )
    return slab[take]


def gather(size: int, dests: Sequence[Selector], pieces: Sequence[np.ndarray]) -> np.ndarray:
    """Place each piece's rows at its destination positions of the window."""
    if len(pieces) == 1 and isinstance(dests[0], slice) and dests[0] == slice(0, size):
        return pieces[0]
    first = pieces[0]
    out = np.empty((size, *first.shape[1:]), dtype=first.dtype)
    for dest, piece in zip(dests, pieces, strict=True):
        out[dest] = piece
    return out


def _owned(array: np.ndarray) -> np.ndarray:
    if array.flags.owndata and array.flags.writeable:
        return array
    return array.copy()


# --------------------------------------------------------------------------
# Graph builders (run on the client, no I/O)


def window_graph(
    sources: Sequence[Source], window: Window, token: str
) -> tuple[dict[Key, Any], Key]:
    """The dask graph of one window; its result is one array per source."""
    dsk: dict[Key, Any] = {}
    outputs = []
    for position, (source, pieces) in enumerate(zip(sources, window.pieces, strict=True)):
        piece_keys = []
        for piece in pieces:
            key = (f"dzb-read-{token}", window.index, position, piece.chunk)
            source.add_rows_task(dsk, key, piece.chunk, piece.start, piece.stop, piece.take)
            piece_keys.append(key)
        out_key = (f"dzb-gather-{token}", window.index, position)
        dests = [piece.dest for piece in pieces]
        dsk[out_key] = (gather, window.size, dests, piece_keys)
        outputs.append(out_key)
    window_key = (f"dzb-window-{token}", window.index)
    dsk[window_key] = (tuple, outputs)
    return dsk, window_key


def block_graph(
    source: Source,
    block: tuple[int, ...],
    token: str,
    transform: Callable[[np.ndarray], Any] | None = None,
) -> tuple[dict[Key, Any], Key]:
    """The dask graph reading one stored block (all axes) of ``source``.

    With ``transform``, a second task applies it to the block; the scheduler
    runs it where the block was read, so only its result moves.
    """
    dsk: dict[Key, Any] = {}
    key = (f"dzb-block-{token}", *block)
    source.add_block_task(dsk, key, block)
    if transform is None:
        return dsk, key
    mapped = (f"dzb-map-{token}", *block)
    dsk[mapped] = (transform, key)
    return dsk, mapped
