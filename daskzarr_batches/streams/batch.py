"""Batch streams: an epoch plan read window by window and cut into batches.

A :class:`BatchStream` keeps a bounded number of window graphs in flight on a
runner, consumes them in plan order, leaves out undecodable samples, fills a
rank's shortfall, and cuts owned batches (``plan.batching.Batcher``)."""

from __future__ import annotations

import dataclasses
import time
import weakref
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

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
from ..plan.quality import LABEL_MIXING_WARNING, LabelCounter
from ..plan.summary import PlanSummary
from ..plan.windows import Window
from ..read.buffers import shared_pool
from ..read.context import ReadContext
from ..read.graphs import (
    read_threads,
    window_graph,
)
from ..read.kept import read_kept_chunk
from ..read.window import release_free_memory
from ..store.policy import (
    ReadReport,
)
from ..store.sources import Source
from .base import DeliveredIds, SkippedChunk, Stream, _aligned, stored_arrays
from .batch_summary import (  # noqa: F401
    _cached_summary,
    _chunk_shares,
    _share_capacities,
    _summary,
)
from .batch_windows import (
    RAMP_WINDOWS,
    _after_first,
    _Delivery,
    _first_rows,
    _ids,
    _Progress,
    _Reads,
    _windows_of,
    _WindowSource,
)
from .epoch_array import epoch_arrays, pack_arrays
from .spec import (
    StreamSpec,
)

__all__ = ["RAMP_WINDOWS", "BatchStream"]


class BatchStream(Stream[Any]):
    """Batches along axis 0, computed window by window from an epoch plan.

    Yields one ``numpy.ndarray`` per batch, or a tuple of them (one per
    array) for paired streams.  Created by [`batch_stream`][daskzarr_batches.batch_stream] and
    friends
    from a [`StreamSpec`][daskzarr_batches.streams.StreamSpec].

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
        # a local patch stream's windows are read in plan order into fresh outputs (no
        # pool), so a batch lying in one window is handed out as a view of it, not copied
        # again (forecast pairs: each patch a stored chunk, the copy was a third of an
        # epoch from the cache); not the exact shuffle, whose budget counts windows alive
        self._views = (
            not runner.plan_order
            and spec.shuffle != "exact"
            and any(source.patched is not None for source in spec.sources)
        )
        if self._views:
            self._pool = None
        self._plan_order = runner.plan_order or self._views

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
        batcher = Batcher(spec.batch_size, drop_remainder=self._drop, views=self._views)
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
            policy, runner.scope, self._plan_order, spec.decode_bytes, pool, shares, kept
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
        order = None if self._plan_order else window.gather_index()
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
        member_of = first.member_index()
        if member_of is None:  # not a collection
            return
        counts = self.stats.samples_per_source
        if counts is None:
            counts = self.stats.samples_per_source = [0] * len(first.member_sources)
        samples = window.samples[:size]
        if isinstance(samples, range) and samples.step == 1:  # sequential: by overlap
            per = member_of.counts(samples.start, samples.stop)
        else:
            per = np.bincount(member_of(_ids(samples)), minlength=len(counts))
        for m, n in enumerate(per.tolist()):
            counts[m] += n

    def to_dask(self) -> Any:
        """The stream's epoch as lazy dask arrays, in the order the stream delivers it.

        Each window the stream would read is one block along axis 0, computed
        by the window's own graph: every stored chunk the window touches is
        decoded once, so computing the arrays reads what iterating the stream
        reads (the same read amplification), through the stream's read
        policy and cache (the cache checked against the arrays' stored
        versions at each compute, as a stream checks it when it is made: an
        array written again in place is read again, not served from the
        cache).  Nothing is read until the arrays are computed;
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
        listed = any(report.decoded is not None for report in reports)
        for source, pieces, report in zip(self.spec.sources, window.pieces, reports, strict=True):
            self._note(source.name, report)
            if report.decoded is not None:  # a patch read lists its stored chunks
                stats.chunks_read += len(report.decoded)
                for block, nbytes in report.decoded:
                    stats.bytes_read += nbytes
                    self._distinct_chunk(source.name, block, nbytes)
                continue
            gone = set(report.missing_chunks) | {chunk for chunk, _, _ in report.skipped}
            read = [piece for piece in pieces if piece.chunk not in gone]
            stats.chunks_read += len(read)
            stats.bytes_read += sum(piece.rows for piece in read) * source.row_bytes
            if listed:  # beside sparse rows or patches, which list their stored chunks
                for piece in read:
                    self._distinct_chunk(source.name, piece.chunk, piece.rows * source.row_bytes)

    def _distinct_chunk(self, name: str, block: Any, nbytes: int) -> None:
        """Count a stored chunk's bytes in ``stats.bytes_distinct`` the first time it is read."""
        if (name, block) not in self._distinct:
            self._distinct.add((name, block))
            self.stats.bytes_distinct = (self.stats.bytes_distinct or 0) + nbytes

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
