"""Chunk streams: one item per stored chunk (or its transform), in order or as reads complete."""

from __future__ import annotations

import math
import os
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

import numpy as np

from ..errors import (
    SkippedChunksWarning,
    WindowError,
    WindowTimeoutError,
    warn_caller,
)
from ..execute.runners import make_runner
from ..plan.defaults import DEFAULT_IO_BYTES, DEFAULT_IO_CONCURRENCY
from ..read.blocks import (
    block_graph,
    shard_graph,
)
from ..read.context import ReadContext
from ..read.kept import read_kept_chunk
from ..read.shard_tasks import ShardItem
from ..store.layout import blocks_by_shard
from ..store.shards import reads_by_shard
from ..store.sources import SliceSource, Source
from .base import SkippedChunk, Stream, _aligned, stored_arrays, stored_sources
from .spec import ChunkSpec

__all__ = ["ChunkStream", "build_chunk_stream"]


def build_chunk_stream(
    spec: ChunkSpec, transform: Callable[[np.ndarray], Any] | None = None
) -> ChunkStream:
    """A :class:`ChunkStream` of a validated spec (shared with ``map_chunks``)."""
    return ChunkStream(spec, transform)


def _default_io_concurrency(
    client: Any, source: Source, units: Sequence[tuple[tuple[int, ...], ...]] | None
) -> int:
    """Reads in flight of a chunk stream when ``io_concurrency`` is not given.

    On a cluster: twice its worker threads (futures in flight).  Locally:
    one per CPU for a store known to be local (no latency to hide; more reads
    in flight measured more CPU time per epoch), else
    ``DEFAULT_IO_CONCURRENCY``, lowered so that the reads in flight hold at
    most ``DEFAULT_IO_BYTES`` decoded (one chunk, or one shard, each), but
    not below the CPU count.
    """
    if client is not None:
        return max(2 * _threads(client), 1)
    cpus = os.cpu_count() or 1
    if _is_local(source):
        return cpus
    largest = max((len(unit) for unit in units), default=1) if units else 1
    chunk_bytes = source.dtype.itemsize * math.prod(
        max(sizes, default=0) for sizes in source.chunks
    )
    fits = DEFAULT_IO_BYTES // max(largest * chunk_bytes, 1)
    return max(min(DEFAULT_IO_CONCURRENCY, fits), min(cpus, DEFAULT_IO_CONCURRENCY), 1)


def _threads(client: Any) -> int:
    return sum(client.nthreads().values())


#: units a cluster's chunk stream keeps in flight per worker thread (issue 40): a unit's
#: round trip (scheduler, fetch) measured ~20x its read on a loaded 2-core LocalCluster,
#: so two per thread left the workers 82% idle
CLUSTER_DEPTH = 8


def _cluster_depth(client: Any, source: Source, units: Sequence[Any] | None) -> int:
    """Units in flight on a cluster when ``io_concurrency`` is not given: ``CLUSTER_DEPTH``
    per worker thread, fewer if their decoded bytes would pass ``DEFAULT_IO_BYTES`` (the
    items of a chunk stream come to this process), not below two per thread."""
    threads = max(_threads(client), 1)
    largest = max((len(unit) for unit in units), default=1) if units else 1
    unit_bytes = (
        largest
        * source.dtype.itemsize
        * math.prod(max(sizes, default=0) for sizes in source.chunks)
    )
    fits = DEFAULT_IO_BYTES // max(unit_bytes, 1)
    return max(min(CLUSTER_DEPTH * threads, fits), 2 * threads)


_LOCAL_STORES = ("LocalStore", "MemoryStore", "ZipStore", "GpuMemoryStore")


def _is_local(source: Source) -> bool:
    """Whether ``source`` is read without request latency: a numpy or dask array, or a
    Zarr array on a local store (a wrapper store may add latency: it is not local)."""
    for stored in stored_sources(source):
        if not stored.sliced:
            continue  # a dask array computes its own graph
        store = getattr(getattr(stored, "array", None), "store", None)
        if store is not None and type(store).__name__ not in _LOCAL_STORES:
            return False
    return True


class ChunkStream(Stream[Any]):
    """One item per stored chunk; created by [`chunk_stream`][daskzarr_batches.chunk_stream] and
    [`map_chunks`][daskzarr_batches.map_chunks].

    Without ``transform`` an item is the chunk itself; with one it is
    ``transform(chunk)``, computed in the task that read the chunk (on a
    worker, with a client), so only the result travels to the consumer.

    Each read task reads one *unit*: one stored block, or, for a sharded Zarr
    array, every inner block of one shard with one read, whose blocks are
    then handed out one by one.  At most ``io_concurrency`` units are in
    flight or held (``io_concurrency=None``: `_default_io_concurrency`
    for the array's store); the stream's store requests are capped at the
    same number.
    """

    def __init__(
        self, spec: ChunkSpec, transform: Callable[[np.ndarray], Any] | None = None
    ) -> None:
        created = time.perf_counter()
        self.spec = spec
        self.source = source = spec.source
        read = spec.read
        # a shard's inner blocks one read unit, where the shard reader reads the array
        cached = read.policy.cache is not None
        units = (
            blocks_by_shard(source)
            if reads_by_shard(getattr(source, "array", None), cached)
            else None
        )
        concurrency = read.io_concurrency
        if concurrency is None:
            concurrency = _default_io_concurrency(read.client, source, units)
        self._blocks = list(source.blocks())
        self._sharded = units is not None
        self._units = (
            [tuple(unit) for unit in units] if units else [(block,) for block in self._blocks]
        )
        # reads wait on the store in their threads, so a Zarr or numpy source gets one
        # thread per read in flight; a dask array computes its graph on one per CPU
        sliced = all(stored.sliced for stored in stored_sources(source))
        threads = concurrency if sliced else os.cpu_count() or 1
        # on a cluster (io_concurrency not given): more units in flight than reads at once
        # (each worker reads one per thread), sent in batches of half of them per graph
        depth = concurrency
        if read.client is not None and read.io_concurrency is None:
            depth = _cluster_depth(read.client, source, units)
        self._depth, self._batch = depth, 1 if read.client is None else max(depth // 2, 1)
        runner = make_runner(read.client, in_flight=depth, read_workers=threads)
        # reads in flight and store requests share the one number (io_concurrency)
        policy = read.policy.limited(concurrency).tokened(stored_arrays([self.source]))
        super().__init__(len(self._blocks), runner, read.timeout, policy)
        self._created = created
        self._concurrency = concurrency
        self._ordered = spec.ordered
        self._with_index = spec.with_index
        self._transform = transform
        # what read tasks call: locally one transform per CPU at once
        self._task_transform = None if transform is None else runner.cpu_bound(transform)

    def _produce(self) -> Iterator[Any]:
        (source,) = self._place([self.source])  # nothing in flight yet if this fails
        # a cache on a cluster: decoded blocks kept as cluster futures, each block cut from
        # its own (a sharded array's inner blocks too: one by one, not a shard per read)
        cache, policy = self.policy.cache, self.policy
        kept = None if cache is None else self._runner.keeper(cache, read_kept_chunk, policy)
        if kept is not None and self._sharded and kept.keeps(source):
            self._units, self._sharded = [(block,) for block in self._blocks], False
        reads = _UnitReads(
            self._units, self._depth, self._unit_submitter(source, kept), self._batch
        )
        try:
            # unbound, with ``self`` (the generator's weak proxy): a bound method would hold
            # the stream itself in the inner generator, a cycle through ``stream._items``
            loop = ChunkStream._in_order if self._ordered else ChunkStream._as_completed
            yield from loop(self, reads)
        finally:
            for future in reads.in_flight:
                self._runner.release(future)
            reads.in_flight.clear()
            reads.held.clear()

    def _unit_submitter(
        self, source: Source, kept: Any = None
    ) -> Callable[[Sequence[int]], list[Any]]:
        """``submit(numbers)``: the graphs of those units sent to the runner (on a cluster in
        one graph); their futures.

        ``kept``: the runner's :class:`~daskzarr_batches.execute.runners.Keeper`
        (a cache on a cluster), else ``None``.  It holds the stream through a
        weak proxy, as the generator does (no reference cycle through the
        generator).
        """
        units, transform, scope = self._units, self._task_transform, self._runner.scope
        policy, token, sharded = self.policy, self._token, self._sharded
        stream = weakref.proxy(self)
        ctx = ReadContext(policy, scope, kept=kept)

        def graph(number: int) -> tuple[dict[Any, Any], Any]:
            unit = units[number]
            if not sharded:
                here = ctx.narrowed(priority=-number)
                return block_graph(source, unit[0], token, transform, here)
            sharded_source = cast(SliceSource, source)  # only a Zarr array is sharded
            return shard_graph(sharded_source, unit, token, transform, ctx)

        def submit(numbers: Sequence[int]) -> list[Any]:
            first = units[numbers[0]]
            return stream._submit_many(
                [graph(number) for number in numbers],
                -numbers[0],
                lambda u=first: stream._where_unit(u),
            )

        return submit

    def _collect(self, reads: _UnitReads, future: Any) -> list[ShardItem]:
        """The blocks of a finished unit read, each aligned; its future released."""
        unit = self._units[reads.in_flight[future]]
        result = self._wait(future, lambda u=unit: self._where_unit(u))
        del reads.in_flight[future]
        self._runner.release(future)
        if not self._sharded:
            item, report = result
            return [(unit[0], _aligned(item), report, None)]
        return [(block, _aligned(item), report, error) for block, item, report, error in result]

    def _hand_out(self, entry: ShardItem) -> list[Any]:
        """The items ``entry`` gives the caller: its block, or none if it was skipped.

        A list, not a generator: a suspended generator of a bound method would
        hold the stream itself (see :meth:`_produce`).
        """
        block, item, report, error = entry
        self._note(self.source.name, report, [block] if report.missing_chunks else ())
        if error is not None:
            raise WindowError(
                f"{self._where(block)} failed: {type(error).__name__}: {error}"
            ) from error
        if report.skipped:
            self._skip(block)
            return []
        return [self._deliver(block, item, missing=bool(report.missing_chunks))]

    def _in_order(self, reads: _UnitReads) -> Iterator[Any]:
        """Blocks in the C order of the chunk grid, waiting for the unit holding the next."""
        held = reads.held
        unit_of = {block: number for number, unit in enumerate(self._units) for block in unit}
        for block in self._blocks:
            number = unit_of[block]
            while number not in held:
                reads.top_up()
                while reads.submitted <= number:  # held units fill the limit: read it anyway
                    reads.submit_next()
                future = next(f for f, n in reads.in_flight.items() if n == number)
                held[number] = {entry[0]: entry for entry in self._collect(reads, future)}
            entries = held[number]
            entry = entries.pop(block)
            if not entries:
                del held[number]
            reads.top_up()
            yield from self._hand_out(entry)

    def _as_completed(self, reads: _UnitReads) -> Iterator[Any]:
        """Blocks of whichever unit read finished first."""
        while True:
            reads.top_up()
            if not reads.in_flight:
                return
            ready = self._first_done(list(reads.in_flight))
            if not ready:  # nothing finished within timeout: name the oldest
                oldest = self._where_unit(self._units[next(iter(reads.in_flight.values()))])
                raise WindowTimeoutError(
                    f"{oldest} was not ready after timeout={self._timeout} s "
                    f"(nor any of the {len(reads.in_flight)} reads in flight)"
                    f"{self._runner.timeout_note}"
                )
            for future in ready:
                arrived = self._collect(reads, future)
                del future
                reads.top_up()
                for one in arrived:
                    yield from self._hand_out(one)

    def _where_unit(self, unit: tuple[tuple[int, ...], ...]) -> str:
        if not self._sharded:
            return self._where(unit[0])
        return f"the shard of chunks {unit[0]}..{unit[-1]} of array {self.source.name}" + (
            "" if self._transform is None else f" ({_name(self._transform)}() on its chunks)"
        )

    def _describe_self(self) -> str:
        order = "ordered" if self._ordered else "unordered"
        what = "" if self._transform is None else f"{_name(self._transform)}() on "
        return f"{what}{self.source.name}: chunk {self.stats.items_yielded}/{len(self)}, {order}"

    def _where(self, block: tuple[int, ...]) -> str:
        where = f"chunk {block} of array {self.source.name}"
        if self._transform is None:
            return where
        return f"{_name(self._transform)}() on {where}"

    def _first_done(self, futures: list[Any]) -> list[Any]:
        started = time.perf_counter()
        done = self._runner.wait(futures, self._timeout)
        self.stats.wait_seconds += time.perf_counter() - started
        return [f for f in futures if f in done]  # block order; empty if timed out

    def _skip(self, block: tuple[int, ...]) -> None:
        slices = self.source.block_slices(block)
        samples = range(slices[0].start, slices[0].stop)
        self.stats.skipped.append(SkippedChunk(self.source.name, block, samples))
        self.stats.windows_read += 1
        warn_caller(
            SkippedChunksWarning(
                f"skipped chunk {block} (samples {samples.start}:{samples.stop}) of array "
                f"{self.source.name}: it does not decode (on_error='skip')"
            )
        )

    def _deliver(self, block: tuple[int, ...], item: Any, missing: bool = False) -> Any:
        stats = self.stats
        if stats.time_to_first_batch is None:
            stats.time_to_first_batch = time.perf_counter() - self._created
        sizes = self.source.block_sizes(block)  # a collection's: in its member's own grid
        stats.windows_read += 1
        if not missing:
            stats.chunks_read += 1
            stats.bytes_read += math.prod(sizes) * self.source.dtype.itemsize
        stats.bytes_yielded += int(getattr(item, "nbytes", 0))
        stats.items_yielded += 1
        stats.samples_yielded += sizes[0]
        return (block, item) if self._with_index else item


class _UnitReads:
    """A chunk stream's unit reads: in flight (future -> unit number, in unit order) and
    read but not all handed out (``held``); at most ``concurrency`` of both together."""

    def __init__(
        self,
        units: Sequence[tuple[tuple[int, ...], ...]],
        concurrency: int,
        submit: Callable[[Sequence[int]], list[Any]],
        batch: int = 1,
    ) -> None:
        self.count = len(units)
        self.concurrency = concurrency
        self.submit = submit
        #: units sent together: a free slot waits until ``batch`` are free (or the rest)
        self.batch = batch
        self.in_flight: dict[Any, int] = {}
        self.held: dict[int, dict[tuple[int, ...], ShardItem]] = {}
        self.submitted = 0

    def _send(self, take: int) -> None:
        numbers = range(self.submitted, self.submitted + take)
        for future, number in zip(self.submit(numbers), numbers, strict=True):
            self.in_flight[future] = number
        self.submitted += take

    def submit_next(self) -> None:
        self._send(1)

    def top_up(self) -> None:
        free = self.concurrency - len(self.in_flight) - len(self.held)
        left = self.count - self.submitted
        take = min(free, left)
        if take > 0 and take >= min(self.batch, left):
            self._send(take)


def _name(function: Callable[..., Any]) -> str:
    return getattr(function, "__qualname__", None) or repr(function)
