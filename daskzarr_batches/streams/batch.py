"""Batch streams: an epoch plan read window by window and cut into batches.

A :class:`BatchStream` keeps a bounded number of window graphs in flight on a
runner, consumes them in plan order, leaves out undecodable samples, fills a
rank's shortfall, and cuts owned batches (``plan.batching.Batcher``)."""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import zarr

from ..errors import (
    ArgumentValueError,
    ChunkReadError,
    ShuffleQualityWarning,
    SkippedChunksWarning,
    warn_caller,
)
from ..execute.runners import make_runner
from ..plan.batching import Batcher, Ranges, positions_between
from ..plan.batching import count_batches as _count
from ..plan.epoch import EpochPlan
from ..plan.quality import LABEL_MIXING_WARNING, LabelCounter
from ..plan.summary import PlanSummary
from ..plan.windows import Window
from ..read.buffers import shared_pool
from ..read.context import ReadContext
from ..read.graphs import (
    count_tasks,
    read_threads,
    window_graph,
)
from ..read.kept import read_kept_chunk
from ..read.patches import ChunkShare
from ..read.window import release_free_memory
from ..store.cache import ChunkCache, array_token, chunk_name, kept_part, rows_name
from ..store.collections import ConcatSource
from ..store.layout import chunk_grid
from ..store.patches import PatchSource
from ..store.policy import (
    ReadReport,
)
from ..store.sources import Source
from ..store.subsets import SubsetSource
from .base import DeliveredIds, SkippedChunk, Stream, StreamStats, T, _aligned, stored_arrays
from .epoch_array import epoch_arrays, pack_arrays
from .patch import chunk_uses, patch_summary
from .spec import (
    StreamSpec,
)

__all__ = ["RAMP_WINDOWS", "BatchStream"]


def _summary(spec: StreamSpec, shared: bool = True) -> PlanSummary:
    """The plan of ``spec`` in numbers (shared by ``plan_epoch`` and ``summary()``).

    ``shared``: whether a sequential patch stream's windows hand on their
    shared chunks (read in this process, not on a cluster).
    """
    plan = spec.plan()
    summary = plan.summary(task_count=lambda window: count_tasks(spec.sources, window))
    if any(isinstance(source, PatchSource) for source in spec.sources):
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
        if isinstance(source, PatchSource):  # chunks: raveled blocks of the base array
            base = source.base
            stored = getattr(base, "base", base)  # a subset's stored array
            array = getattr(stored, "array", None)
            if base is None or stored is None or not isinstance(array, zarr.Array):
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
        if isinstance(source, SubsetSource):  # a subset's chunk: its stored chunk's
            inner, spans = counter(source.base), source.spans
            return None if inner is None else (lambda chunk: inner(spans[chunk][0]))
        if isinstance(source, ConcatSource):  # a collection's chunk: its member's
            members = [counter(member) for member in source.members]
            member_of, local = source.chunk_member, source.chunk_local

            def member_chunk(chunk: int) -> bool:
                count_held = members[int(member_of[chunk])]
                return count_held is not None and count_held(int(local[chunk]))

            return member_chunk
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


class BatchStream(Stream[Any]):
    """Batches along axis 0, computed window by window from an epoch plan.

    Yields one ``numpy.ndarray`` per batch, or a tuple of them (one per
    array) for paired streams.  Created by [`batch_stream`][daskzarr_batches.batch_stream] and
    friends
    from a [`StreamSpec`][daskzarr_batches.plan.StreamSpec].

    Attributes
    ----------
    spec : StreamSpec
        The validated settings of the epoch.
    plan : EpochPlan
        The epoch's plan (pure, inspectable without reading data).
    seed : int or None
        The entropy behind the shuffle; pass it as ``seed=`` to repeat an
        epoch drawn with ``seed=None``.
    positions : list of (int, int)
        The epoch positions the stream walks, in order (the whole epoch, a
        rank's share, a worker's part).
    position : int
        Where the stream is in ``positions``: the offset after the last
        sample it has yielded (skipped samples before it included), from
        which a stream started with ``start=position`` yields exactly the
        batches this one has still to yield.
    stats : StreamStats

    Notes
    -----
    ``positions``, ``start``, ``quota`` and ``fill`` are how a
    [`Loader`][daskzarr_batches.Loader] runs a rank's share and resumes it: the stream walks the
    offsets ``start, start + 1, ...`` of ``positions``; it stops after
    ``quota`` samples (all of them: ``None``); with ``fill=True`` it goes on
    past the end of ``positions``, wrapping around to their start, until it
    has yielded ``quota`` samples, so that samples skipped as undecodable
    (``on_error="skip"``) do not cost a rank a step.
    """

    def __init__(
        self,
        spec: StreamSpec,
        *,
        positions: Ranges | None = None,
        drop_remainder: bool | None = None,
        start: int = 0,
        quota: int | None = None,
        fill: bool = False,
    ) -> None:
        created = time.perf_counter()
        self.spec = spec
        self.plan = spec.plan()
        assert spec.prefetch is not None  # resolved by the spec
        #: epoch positions this stream yields, in order (a rank's share, the rest of an epoch)
        self.positions: Ranges = (
            [(0, self.plan.n_used)] if positions is None else [r for r in positions if r[1] > r[0]]
        )
        self._total = sum(b - a for a, b in self.positions)
        if start < 0 or (start > self._total and not fill):
            raise ArgumentValueError(
                f"start={start} is outside the stream's {self._total} positions"
            )
        if fill and quota is None:
            raise ArgumentValueError("fill=True needs a quota of samples to fill up to")
        self._start = start
        self._fill = fill and self._total > 0
        self._drop = spec.drop_remainder if drop_remainder is None else drop_remainder
        self._quota = quota
        runner = make_runner(
            spec.client,
            in_flight=spec.prefetch + 1 + RAMP_WINDOWS,
            read_workers=read_threads(spec.sources),
        )
        planned = max(self._total - start, 0) if quota is None else quota
        length = _count(planned, spec.batch_size, self._drop)
        # one request limit for all of this stream's reads (io_concurrency)
        policy = spec.read.policy.limited(spec.io_concurrency).tokened(stored_arrays(spec.sources))
        super().__init__(length, runner, spec.timeout, policy)
        self._created = created
        self.stats.delivered = DeliveredIds(self.plan.quality_counter())
        if spec.labels is not None:
            self.stats.labels = LabelCounter()
        # offsets (from ``start``) of the samples left out as undecodable, ascending
        self._skipped: list[np.ndarray] = []
        self._walked = False  # every position read: a short last batch ends the epoch
        self._distinct: set[tuple[str, Any]] = set()  # stored chunks a patch stream decoded
        # a sequential or buffered stream read in this process reuses its window outputs
        # (read.buffers: fresh 32 MiB windows cost page faults and made epochs two-speed,
        # issue 20); not the exact shuffle, whose memory_budget counts the windows alive
        # and whose next window is read before the last one is cut
        self._pool = shared_pool() if not runner.plan_order and spec.shuffle != "exact" else None

    @property
    def seed(self) -> int | None:
        """The entropy behind the shuffle (``None`` for a sequential stream)."""
        return self.spec.seed

    @property
    def position(self) -> int:
        """Offset in ``positions`` after the last sample yielded (skipped ones included)."""
        yielded = self.stats.samples_yielded
        if self._walked and not self._fill:  # skipped samples after the last one yielded
            return max(self._total, self._start)
        if yielded == 0:
            return self._start
        if not self._skipped:
            return self._start + yielded
        skipped = np.concatenate(self._skipped)
        # the k-th kept offset is k plus the number of skipped offsets below it
        below = int(np.searchsorted(skipped - np.arange(len(skipped)), yielded - 1, "right"))
        return self._start + yielded + below

    def _produce(self) -> Iterator[Any]:
        spec = self.spec
        prefetch = spec.prefetch
        assert prefetch is not None
        batcher = Batcher(spec.batch_size, drop_remainder=self._drop)
        deliver = _Delivery(self.stats, spec.paired, self._created, spec.layout)
        if spec.labels is not None:
            deliver.labels = spec.roles.index(spec.labels)
        if spec.return_sources:  # the provenance is computed, not read: not counted
            deliver.counted = len(spec.sources) - 1
        progress = _Progress()
        windows = _WindowSource(self.plan, self.positions, self._start, self._fill)
        quota = self._quota

        def short() -> int:  # past the positions' end: only what skipped samples left short
            return 0 if quota is None else quota - (windows.planned - progress.skipped)

        submit = self._window_submitter(self._place(spec.sources))
        reads = _Reads(windows, spec.window_rows, short, submit)
        try:
            # Fast start: the first window is read alone (no read competes with it) and
            # its first batch is handed out before the next windows are planned and sent.
            first = True
            reads.top_up(1, most=1)
            while True:
                if not first:
                    reads.top_up(prefetch + 1)
                if not reads.queue:
                    break
                outputs, order = self._take(reads, progress)
                if first:  # the next windows go out after the first batch (or window)
                    batches = _after_first(
                        batcher.feed(outputs, order), lambda: reads.top_up(prefetch)
                    )
                    first = False
                else:
                    reads.top_up(prefetch)
                    batches = batcher.feed(outputs, order)
                recycled = outputs if self._pool is not None else ()
                del outputs  # hold at most prefetch + 1 windows (memory_budget relies on it)
                for batch in batches:
                    yield deliver(batch)
                del batches
                for rows in {id(rows): rows for rows in recycled}.values():  # each once
                    self._pool.give(rows)  # type: ignore[union-attr]  # batches are copies
                del recycled
                if spec.decode_bytes is not None:
                    release_free_memory()  # the window's memory, not kept by the C heap
                if quota is not None and progress.fed >= quota:
                    break
            self._walked = not reads.queue  # every window read, not stopped at the quota
            rest = batcher.finish()  # only after skipped chunks: the plan drops the rest
            if rest is not None:
                yield deliver(rest)
            self._warn_labels()
        finally:
            for _, _, future in reads.queue:
                self._runner.release(future)
            reads.queue.clear()

    def _warn_labels(self) -> None:
        """At the epoch's end: warn if the batches' labels were far from the epoch's."""
        counter = self.stats.labels
        figures = None if counter is None else counter.figures()
        if figures is None or figures[0] >= LABEL_MIXING_WARNING:
            return
        mixing, distance = figures
        warn_caller(
            ShuffleQualityWarning(
                f"label mixing {mixing:.3f} (below {LABEL_MIXING_WARNING}): the batches' "
                f"label distributions were on average {distance:.3f} from the epoch's (total "
                "variation), overlapping it less than an exact shuffle's batches, which "
                "tends to hurt training. Ways out: the exact shuffle "
                "(shuffle_buffer_size=None; with cache=ChunkCache(...) later epochs read "
                "from the cache), a larger shuffle buffer, write_shuffled(...) once and a "
                "buffered shuffle of its output, or smaller chunks"
            )
        )

    def _window_submitter(self, sources: list[Source]) -> Any:
        """``submit(window, offset)``: the window's graph sent to the runner; its future.

        It holds the stream through a weak proxy, as the generator does: the
        generator keeps it, and the stream must stay free of reference cycles.
        """
        spec, runner, policy, token = self.spec, self._runner, self.policy, self._token
        stream = weakref.proxy(self)
        plan, positions, start = self.plan, self.positions, self._start

        def windows() -> Iterator[Window]:  # those this stream reads (not past the end)
            total = sum(stop - first for first, stop in positions)
            return _windows_of(plan, positions_between(positions, start, total))

        shares = _chunk_shares(spec, sources, runner.plan_order, windows)
        pool = self._pool
        # a cache on a cluster: decoded chunks kept as cluster futures, windows cut from them
        kept = (
            None if policy.cache is None else runner.keeper(policy.cache, read_kept_chunk, policy)
        )

        ctx = ReadContext(
            policy, runner.scope, runner.plan_order, spec.decode_bytes, pool, shares, kept
        )

        def submit(window: Window, offset: int) -> Any:
            # the token is unique: a wrapped share meets a window again
            dsk, key = window_graph(sources, window, f"{token}-{offset}", ctx)
            return stream._submit(dsk, key, -window.index, lambda w=window: stream._where(w))

        return submit

    def _take(
        self, reads: _Reads, progress: _Progress
    ) -> tuple[tuple[np.ndarray, ...], np.ndarray | None]:
        """The oldest window's outputs and plan order, its skipped and surplus samples out."""
        window, offset, future = reads.queue[0]  # stays in flight (released) if this fails
        results = self._wait(future, lambda w=window: self._where(w))
        reads.consumed(window)
        self._runner.release(future)  # a distributed result leaves the worker now
        del future
        order = None if self._runner.plan_order else window.gather_index()
        # slices copy fast from any address; np.take needs aligned rows
        outputs = tuple(rows if order is None else _aligned(rows) for rows, _ in results)
        reports = [report for _, report in results]
        del results
        self._count_reads(window, reports)
        size = window.size
        # a sequential window's ids stay a range: the quality counter adds a run in O(1)
        ids: Any = window.samples if isinstance(window.samples, range) else _ids(window.samples)
        positions: Any = range(window.position, window.position + size)
        if any(report.skipped for report in reports):
            outputs, order, gone = self._skip(window, outputs, order, reports)
            self._skipped.append(offset + gone)
            progress.skipped += len(gone)
            size -= len(gone)
            ids, positions = np.delete(_ids(ids), gone), np.delete(_ids(positions), gone)
        quota = self._quota
        if quota is not None and progress.fed + size > quota:  # the quota's last window
            size = quota - progress.fed
            outputs, order = _first_rows(outputs, order, size)
        if self.stats.delivered is not None:
            self.stats.delivered.push(ids[:size], positions[:size], self.stats.samples_yielded)
        progress.fed += size
        self._count_sources(window, size)
        if offset >= self._total - self._start:  # a window past the end: filling
            self.stats.samples_filled += size
            progress.filled_read += window.size
            progress.filled_kept += size
            if progress.filled_read >= self._total and not progress.filled_kept:
                raise ChunkReadError(
                    f"cannot fill the {(quota or 0) - progress.fed} samples still due to keep "
                    f"this stream's {len(self)} steps: every sample of its positions was "
                    "skipped as undecodable (on_error='skip')"
                )
        return outputs, order

    def _count_sources(self, window: Window, size: int) -> None:
        """``stats.samples_per_source``: the window's first ``size`` samples by member."""
        first = self.spec.sources[0]
        if not isinstance(first, ConcatSource):
            return
        counts = self.stats.samples_per_source
        if counts is None:
            counts = self.stats.samples_per_source = [0] * len(first.members)
        samples = window.samples[:size]
        if isinstance(samples, range) and samples.step == 1:  # sequential: by overlap
            per = first.member_of.counts(samples.start, samples.stop)
        else:
            per = np.bincount(first.member_of(_ids(samples)), minlength=len(counts))
        for m, n in enumerate(per.tolist()):
            counts[m] += n

    def to_dask(self) -> Any:
        """The stream's epoch as lazy dask arrays, in the order the stream delivers it.

        Each window the stream would read is one block along axis 0, computed
        by the window's own graph: every stored chunk the window touches is
        decoded once, so computing the arrays reads what iterating the stream
        reads (the same read amplification), through the stream's read
        policy and cache.  Nothing is read until the arrays are computed;
        they compute on whatever scheduler dask uses (a ``distributed``
        client's workers), like any dask array, and ``to_zarr`` writes the
        epoch's order (shuffled) to a store.  The graph holds a few tasks per
        window and per array or collection member it touches, never one per
        sample.

        The stream itself is left as it is (not started, not counted in
        ``stats``).  Sequential windows are not ramped here: the blocks are
        the plan's full windows (the fast start only matters to a first
        batch).

        Returns
        -------
        dask.array.Array, tuple of dask.array.Array, or dict
            Shaped as the stream's batches: one array; a tuple for a paired
            stream (features, labels; a collection's ``(member, position)``
            last with ``return_sources=True``); a patch stream's tuple or
            dict (origins with their xarray coordinates).  The arrays of one
            stream share their reads: compute them together
            (``dask.compute(x, y)``) to read each window once.  Their length
            is the epoch's samples as delivered (the batches concatenated,
            ``drop_remainder`` applied).

        Raises
        ------
        ArgumentValueError
            The stream was made with ``on_error="skip"`` (a dask array's block
            sizes are known before it is read; use ``on_error="raise"``), or
            is a [`Loader`][daskzarr_batches.Loader]'s rank share kept to a quota.

        Notes
        -----
        The arrays compute on dask's scheduler of the moment (a default
        ``distributed`` client, or ``scheduler=``), not necessarily the
        stream's ``client=``, and as many windows at once as it has threads:
        an exact shuffle's ``memory_budget`` sizes each window for
        ``prefetch + 1`` at once.  Without a cancellation scope the reads
        cannot be stopped once running, as on a cluster.  A numpy source travels inside each
        window's task (the stream scatters it to a cluster once): prefer a
        Zarr array for large in-memory data.  ``missing="warn"`` warns per
        block that met a missing chunk (from the task), ``"error"`` raises
        from ``compute()``.
        """
        spec = self.spec
        if spec.on_error == "skip":
            raise ArgumentValueError(
                "to_dask() needs on_error='raise': a dask array knows its block sizes before "
                "it is read, and on_error='skip' would leave samples out of them"
            )
        if self._quota is not None or self._fill:
            raise ArgumentValueError(
                "to_dask() covers a stream's own positions, not a Loader's quota of samples"
            )
        plan = self.plan
        if plan.shuffle == "none" and plan.mix is None and plan.ramp:
            plan = dataclasses.replace(plan, ramp=False)  # the same order, in full windows
        windows: Iterable[Window] = ()
        if self._start < self._total:
            windows = _windows_of(plan, positions_between(self.positions, self._start, self._total))
        flat = epoch_arrays(spec.sources, windows, self.policy, spec.decode_bytes)
        planned = max(self._total - self._start, 0)
        delivered = len(self) * spec.batch_size if self._drop else planned
        if delivered < planned:  # a stream whose own drop_remainder differs from its plan's
            flat = tuple(array[:delivered] for array in flat)
        if spec.layout is not None:
            return pack_arrays(spec.layout.template, flat)
        return flat if spec.paired else flat[0]

    def summary(self) -> PlanSummary:
        """The epoch's plan in numbers, per window and in total; reads nothing.

        Returns
        -------
        PlanSummary
            Chunks read, decoded bytes, bytes held, samples, batches and dask
            tasks per window; read amplification, peak window bytes and task
            count for the epoch.  About ``prefetch + 1`` windows are held at
            once.  The same as [`plan_epoch`][daskzarr_batches.plan_epoch] with this stream's
            arguments.
        """
        return _summary(self.spec, shared=not self._runner.plan_order)

    def _describe_self(self) -> str:
        names = ", ".join(source.name for source in self.spec.sources)
        return (
            f"{names}: batch_size={self.spec.batch_size}, shuffle={self.spec.shuffle!r}, "
            f"batch {self.stats.items_yielded}/{len(self)}"
        )

    def _where(self, window: Window) -> str:
        batches = window.batch_range(self.spec.batch_size)
        chunks = [[piece.chunk for piece in pieces] for pieces in window.pieces]
        names = ", ".join(source.name for source in self.spec.sources)
        return (
            f"window {window.index} (batches {batches.start}..{batches.stop - 1}, "
            f"axis-0 chunks {chunks if self.spec.paired else chunks[0]} of {names})"
        )

    def _count_reads(self, window: Window, reports: Sequence[ReadReport]) -> None:
        stats = self.stats
        stats.windows_read += 1
        for source, pieces, report in zip(self.spec.sources, window.pieces, reports, strict=True):
            self._note(source.name, report)
            if report.decoded is not None:  # a patch read lists its stored chunks
                stats.chunks_read += len(report.decoded)
                for block, nbytes in report.decoded:
                    stats.bytes_read += nbytes
                    if (source.name, block) not in self._distinct:
                        self._distinct.add((source.name, block))
                        stats.bytes_distinct = (stats.bytes_distinct or 0) + nbytes
                continue
            gone = set(report.missing_chunks) | {chunk for chunk, _, _ in report.skipped}
            read = [piece for piece in pieces if piece.chunk not in gone]
            stats.chunks_read += len(read)
            stats.bytes_read += sum(piece.rows for piece in read) * source.row_bytes

    def _skip(
        self,
        window: Window,
        outputs: tuple[np.ndarray, ...],
        order: np.ndarray | None,
        reports: Sequence[ReadReport],
    ) -> tuple[tuple[np.ndarray, ...], np.ndarray | None, np.ndarray]:
        """Leave out the samples of undecodable chunks, from every array.

        Each output holds the window's samples in ascending order (``order``
        maps plan positions to them), or in plan order (``order`` is
        ``None``), less its own skipped chunks; the samples skipped by any
        array are removed from all, so pairs stay aligned, and the plan order
        is renumbered.  Also returns the plan positions (within the window)
        of the samples left out, ascending.
        """
        if order is None:  # outputs in plan order (also sequential windows: ascending)
            ascending = _ids(window.samples)
        else:
            ascending = np.concatenate(
                [p.start + np.arange(p.rows)[p.take] for p in window.pieces[0]]
            )
        dropped_by = [
            np.concatenate(
                [np.arange(lo, hi) for _, lo, hi in report.skipped] or [np.empty(0, np.int64)]
            )
            for report in reports
        ]
        keep = ~np.isin(ascending, np.concatenate(dropped_by))
        kept = []
        for rows, dropped in zip(outputs, dropped_by, strict=True):
            kept.append(rows[keep[~np.isin(ascending, dropped)]])
        renumbered = None
        kept_in_plan = keep
        if order is not None:
            kept_in_plan = keep[order]
            positions = order[kept_in_plan]
            renumbered = (np.cumsum(keep) - 1)[positions].astype(np.int64)
        gone = np.flatnonzero(~kept_in_plan)
        names = []
        for source, report in zip(self.spec.sources, reports, strict=True):
            for chunk, lo, hi in report.skipped:
                skipped = SkippedChunk(source.name, chunk, range(lo, hi))
                if skipped not in self.stats.skipped:  # an exact shuffle reads it again
                    self.stats.skipped.append(skipped)
                    names.append(f"axis-0 chunk {chunk} (samples {lo}:{hi}) of {source.name}")
        if names:
            warn_caller(
                SkippedChunksWarning(
                    f"skipped {len(names)} chunk(s) that do not decode, and their samples in "
                    f"every array (on_error='skip'): {'; '.join(names)}"
                )
            )
        return tuple(kept), renumbered, gone


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
        if not isinstance(source, PatchSource) or source.base is None:
            continue
        base = source.base
        if id(base) in found:
            continue
        lead = source.cut.axes[0] if source.cut is not None and source.cut.axes else 0
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
    if plan_order or not any(isinstance(s, PatchSource) for s in sources):
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


def _windows_of(plan: EpochPlan, positions: Ranges, index: int = 0) -> Iterator[Window]:
    """The windows delivering ``positions`` (epoch positions, in order), numbered on."""
    for first, end in positions:
        for window in plan.windows_between(first, end, index):
            yield window
            index = window.index + 1


class _WindowSource:
    """The windows a batch stream reads, each with its offset from the stream's start.

    First the windows of offsets ``start:total`` of ``positions``; then, with
    ``fill``, windows past the end (wrapping around to the positions' start),
    each asked for as many samples as are still short (:meth:`next`).  Holds
    the plan and positions, never the stream: a stream dropped with windows
    left is still finalised by reference counting.
    """

    def __init__(self, plan: EpochPlan, positions: Ranges, start: int, fill: bool) -> None:
        self.plan = plan
        self.positions = positions
        self.fill = fill
        self.start = start
        total = sum(stop - first for first, stop in positions)
        self.planned = 0  # offsets (from start) covered by the windows handed out
        self.index = 0
        self._windows: Iterator[Window] = iter(())
        if start < total:
            self._windows = _windows_of(plan, positions_between(positions, start, total))

    def next(self, short: int) -> tuple[Window, int] | None:
        """The next window and its offset; past the end, one of ``short`` samples at most."""
        window = next(self._windows, None)
        if window is None and self.fill and short > 0:
            at = self.start + self.planned  # wraps: positions_between counts modulo the total
            self._windows = _windows_of(
                self.plan, positions_between(self.positions, at, at + short), self.index
            )
            window = next(self._windows, None)
        if window is None:
            return None
        offset = self.planned
        self.planned += window.size
        self.index = window.index + 1
        return window, offset


def _ids(samples: Any) -> np.ndarray:
    """A window's sample ids as int64; a ``range`` (sequential) without a Python loop.

    ``np.asarray(range(n))`` converts element by element: 23-30 ms of CPU per
    sequential epoch of 400,000 samples, a sixth of the epoch (issue 20).
    """
    if isinstance(samples, range):
        return np.arange(samples.start, samples.stop, samples.step, dtype=np.int64)
    return np.asarray(samples, dtype=np.int64)


def _first_rows(
    outputs: tuple[np.ndarray, ...], order: np.ndarray | None, size: int
) -> tuple[tuple[np.ndarray, ...], np.ndarray | None]:
    """The first ``size`` samples (in plan order) of a window's outputs."""
    if order is None:
        return tuple(rows[:size] for rows in outputs), None
    return outputs, order[:size]


class _Progress:
    """Samples of a batch stream so far: fed to the batcher, skipped, read and kept filling."""

    __slots__ = ("fed", "filled_kept", "filled_read", "skipped")

    def __init__(self) -> None:
        self.fed = 0  # samples handed to the batcher
        self.skipped = 0  # samples left out as undecodable, in windows read so far
        self.filled_read = self.filled_kept = 0  # samples read, and kept, past the end


class _Reads:
    """The windows a batch stream has submitted and not consumed yet, in plan order.

    Windows in flight are counted by their share of a full window's samples
    (``full``), so the fast-start ramp's small windows (together one window)
    are read together: on a store with high latency each would otherwise
    cost a round trip.  ``submit(window, offset)`` sends one; ``short()`` is
    how many samples past the end are still due.
    """

    def __init__(
        self,
        windows: _WindowSource,
        full: int,
        short: Callable[[], int],
        submit: Callable[[Window, int], Any],
    ) -> None:
        self.windows = windows
        self.full = max(full, 1)
        self.short = short
        self.submit = submit
        self.queue: deque[tuple[Window, int, Any]] = deque()
        self.pending: list[tuple[Window, int]] = []
        self.held = 0.0

    def weight(self, window: Window) -> float:
        return min(1.0, window.size / self.full)

    def top_up(self, limit: int, most: int | None = None) -> None:
        """Submit windows while they fit ``limit`` full windows (and ``most`` in flight)."""
        while most is None or len(self.queue) < most:
            if not self.pending:
                upcoming = self.windows.next(self.short())
                if upcoming is None:
                    return
                self.pending.append(upcoming)
            window, offset = self.pending[0]
            if self.queue and self.held + self.weight(window) > limit + 1e-9:
                return
            self.pending.pop()
            self.held += self.weight(window)
            self.queue.append((window, offset, self.submit(window, offset)))

    def consumed(self, window: Window) -> None:
        """The oldest window's result is taken: it no longer counts as in flight."""
        self.queue.popleft()
        self.held -= self.weight(window)


def _after_first(items: Iterator[T], then: Callable[[], None]) -> Iterator[T]:
    """``items``, calling ``then()`` after the first one is consumed (or at once if none)."""
    called = False
    for item in items:
        yield item
        if not called:
            then()
            called = True
    if not called:
        then()


#: Windows beyond ``prefetch + 1`` a stream may have in flight: the fast-start ramp's
#: small windows, which together count as one (``ramp_split``: about log2 of a window's
#: chunks).
RAMP_WINDOWS = 8


class _Delivery:
    """Counts a batch in ``stats`` and hands it out (the per-batch hot path)."""

    __slots__ = ("counted", "created", "labels", "layout", "paired", "stats")

    def __init__(self, stats: StreamStats, paired: bool, created: float, layout: Any) -> None:
        self.stats = stats
        self.paired = paired
        self.created = created
        self.layout = layout
        self.counted: int | None = None  # the outputs counted in bytes_yielded (None: all)
        self.labels: int | None = None  # the output holding discrete labels (``labels=``)

    def __call__(self, batch: tuple[np.ndarray, ...]) -> Any:
        stats = self.stats
        first = batch[0]
        if stats.time_to_first_batch is None:
            stats.time_to_first_batch = time.perf_counter() - self.created
        stats.items_yielded += 1
        stats.samples_yielded += len(first)
        if self.labels is not None and stats.labels is not None:
            stats.labels.add(batch[self.labels])
        if self.layout is not None:
            stats.bytes_yielded += sum(part.nbytes for part in batch)
            return self.layout.pack(batch)
        if self.paired:
            stats.bytes_yielded += sum(part.nbytes for part in batch[: self.counted])
            return batch
        stats.bytes_yielded += first.nbytes
        return first
