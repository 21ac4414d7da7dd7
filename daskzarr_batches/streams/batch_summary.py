"""What a batch stream's plan says in numbers: its summary, cached chunks and chunk shares.

:func:`_summary` (the plan of a spec in numbers, shared by ``plan_epoch``
and ``BatchStream.summary``), :func:`_cached_summary` (each window's chunk
reads the cache holds now, no data read), and a patch stream's chunk
shares (:func:`_chunk_shares`, sized by :func:`_share_capacities`).  The
stream itself is ``streams/batch.py``'s.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import zarr

from ..plan.summary import PlanSummary
from ..plan.windows import Window
from ..read.chunk_share import ChunkShare
from ..read.graphs import count_tasks
from ..store.cache import ChunkCache, array_token, chunk_name, kept_part, rows_name
from ..store.layout import chunk_grid
from ..store.sources import Source
from .patch import chunk_uses, patch_summary
from .spec import StreamSpec


def _summary(spec: StreamSpec, shared: bool = True) -> PlanSummary:
    """The plan of ``spec`` in numbers (shared by ``plan_epoch`` and ``summary()``).

    ``shared``: whether a sequential patch stream's windows hand on their
    shared chunks (read in this process, not on a cluster).
    """
    plan = spec.plan()
    summary = plan.summary(task_count=lambda window: count_tasks(spec.sources, window))
    if any(source.patch_grid is not None for source in spec.sources):
        capacities = _share_capacities(spec, spec.sources) if shared else None
        summary = patch_summary(spec.sources, plan, summary, shared, capacities)
    if spec.cache is not None:
        summary = _cached_summary(summary, spec.sources, spec.cache)
    figure = spec.buffer_figure()
    if figure is not None:
        summary = dataclasses.replace(summary, buffer_figure=figure)
    return summary


def _cached_summary(
    summary: PlanSummary, sources: Sequence[Source], cache: ChunkCache
) -> PlanSummary:
    """``summary`` with each window's chunk reads the cache holds now (no data read).

    A window's chunk (an axis-0 chunk of a row source, a stored block of a
    patch source's base array; a chunk subset's and a collection's mapped to
    their stored array's) counts when its axis-0 chunk is kept whole on a
    cluster, or every stored chunk of it is in the cache's memory or
    directory, under the name its read would look up (:func:`chunk_name`: a
    sharded array's inner chunks, or whole shards for patches, which Zarr's
    pipeline reads).  Arrays not in a Zarr store (numpy, dask) are never
    cached.
    """
    known: dict[str, bool] = {}
    tokens: dict[int, str] = {}

    def token_of(array: zarr.Array) -> str:
        token = tokens.get(id(array))
        if token is None:
            token = tokens[id(array)] = array_token(array)
        return token

    def held(array: zarr.Array, blocks: Iterable[tuple[int, ...]], whole: bool) -> bool:
        token = token_of(array)
        for block in blocks:
            key = cache.key(token, chunk_name(array, block, whole))
            if key not in known:
                known[key] = cache.contains(key)
            if not known[key]:
                return False
        return True

    def kept(array: zarr.Array, bounds: Sequence[int], chunk: int) -> bool:
        """Whether axis-0 chunk ``chunk`` is kept whole on a cluster (its rows)."""
        name = rows_name(bounds[chunk], bounds[chunk + 1])
        return cache.contains(cache.key(token_of(array), name))

    def counter(source: Source) -> Callable[[int], bool] | None:
        base = source.patched
        if base is not None:  # patches: chunks are raveled blocks of the base array
            stored = getattr(base, "base", base)  # a subset's stored array
            array = getattr(stored, "array", None)
            if stored is None or not isinstance(array, zarr.Array):
                return None
            grid = tuple(len(sizes) for sizes in base.chunks)
            stored_array: zarr.Array = array
            patch_base: Any = base

            def block(chunk: int) -> bool:
                index = patch_base.block_index(tuple(int(i) for i in np.unravel_index(chunk, grid)))
                name = kept_part(stored, index).name  # kept on a cluster
                if cache.contains(cache.key(token_of(stored_array), name)):
                    return True
                return held(stored_array, [index], True)

            return block
        parts = [counter(part) for part in source.parts()]
        if any(part is not None for part in parts):  # a subset's or collection's: its part's

            def part_chunk(chunk: int) -> bool:  # the base's chunk, or the member's
                found = source.part_chunk(chunk)
                assert found is not None
                count_held = parts[found[0]]
                return count_held is not None and count_held(found[1])

            return part_chunk
        array = getattr(source, "array", None)
        if not isinstance(array, zarr.Array):
            return None
        rest = [range(n) for n in chunk_grid(array)[1:]]
        bounds = np.cumsum([0, *source.chunks[0]]).tolist()

        def row(chunk: int) -> bool:
            if kept(array, bounds, chunk):  # kept whole on a cluster
                return True
            if array.shards is not None:  # the shard reader keeps inner chunks
                per = array.chunks[0]
                size = source.chunks[0][chunk]
                start = bounds[chunk]
                rows = range(start // per, (start + size - 1) // per + 1)
            else:
                rows = range(chunk, chunk + 1)
            return held(array, ((r, *b) for r in rows for b in itertools.product(*rest)), False)

        return row

    counters = [counter(source) for source in sources]
    rows = []
    for window in summary.windows:
        count = sum(
            sum(1 for chunk in chunks if count_held(chunk))
            for count_held, chunks in zip(counters, window.chunks, strict=True)
            if count_held is not None
        )
        rows.append(dataclasses.replace(window, chunks_cached=count))
    return dataclasses.replace(summary, windows=tuple(rows), cached=True)


def _share_capacities(spec: StreamSpec, sources: Sequence[Source]) -> dict[int, int]:
    """The bytes of finished chunks a patch stream's ``ChunkShare`` keeps, per base array.

    Up to two windows' bytes (``2 * window_bytes``, and two shuffle buffers'
    of a shuffled stream), and at least four rows of chunks along the first
    patched dim (two windows' shared rows: a window's first row and the halo
    after its last; with 8 x 180 x 360 chunks of a 721 x 1440 field, 33 MB a
    row, a 32 MiB share let 6% of the halo chunks be decoded twice).
    """
    found: dict[int, int] = {}
    for source in sources:
        base = source.patched
        if base is None:
            continue
        if id(base) in found:
            continue
        cut = source.patch_cut  # the patch source's cut of ``base``
        lead = cut.axes[0] if cut is not None and cut.axes else 0
        row = math.prod(
            max(sizes, default=0) if axis == lead else sum(sizes)
            for axis, sizes in enumerate(base.chunks)
        )
        windows = 2 * max(spec.window_bytes, spec.window_rows * spec.row_bytes)
        found[id(base)] = max(windows, 4 * row * base.dtype.itemsize)
    return found


def _chunk_shares(
    spec: StreamSpec,
    sources: Sequence[Source],
    plan_order: bool,
    windows: Callable[[], Iterable[Window]] | None = None,
) -> dict[int, ChunkShare]:
    """A :class:`ChunkShare` per base array of a patch stream read locally.

    Sequential: consecutive windows decode each chunk at their edges once
    (forecast targets and patches that cross a window's edge).  Buffered:
    ``windows()`` are the windows the stream reads; the
    share counts how many of them need each chunk, so a chunk several need
    (a forecast target at ``t + 1`` that another window has as its input) is
    decoded once and released at its last use, while the share holds it
    (:func:`_share_capacities`); no share when no chunk is needed twice.
    Exact: no share (its windows are sized to the memory budget, which a
    share would exceed).  On a cluster each window decodes its own.
    """
    if plan_order or not any(s.patched is not None for s in sources):
        return {}
    capacities = _share_capacities(spec, sources)
    if spec.shuffle == "none":
        return {base: ChunkShare(capacity) for base, capacity in capacities.items()}
    if windows is None or spec.shuffle == "exact":
        return {}  # an exact window is sized to the memory budget: a share would exceed it
    uses = chunk_uses(sources, windows())
    return {
        base: ChunkShare(capacities[base], counts)
        for base, counts in uses.items()
        if base in capacities and any(n > 1 for n in counts.values())
    }
