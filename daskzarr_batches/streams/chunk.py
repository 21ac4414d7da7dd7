"""Chunk streams: one item per stored chunk (or its transform), in order or as reads complete."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from ..errors import (
    SkippedChunksWarning,
    WindowError,
    WindowTimeoutError,
    warn_caller,
)
from ..execute.runners import make_runner
from ..read.graphs import (
    block_graph,
    blocks_by_shard,
    shard_graph,
)
from ..read.tasks import ShardItem
from ..store.policy import (
    DEFAULT_POLICY,
    ReadPolicy,
)
from ..store.sources import SliceSource, Source
from .base import SkippedChunk, Stream, _aligned
from .spec import DEFAULT_IO_BYTES, DEFAULT_IO_CONCURRENCY, ChunkSpec

__all__ = ["ChunkStream", "build_chunk_stream"]


def build_chunk_stream(
    spec: ChunkSpec, transform: Callable[[np.ndarray], Any] | None = None
) -> ChunkStream:
    """A :class:`ChunkStream` of a validated spec (shared with ``map_chunks``).

    ``io_concurrency=None`` becomes the default for the array's store
    (:func:`_default_io_concurrency`).
    """
    source = spec.source
    read = spec.read
    units = blocks_by_shard(source)
    requests = read.io_concurrency
    if requests is None:
        requests = _default_io_concurrency(read.client, source, units)
    return ChunkStream(
        source,
        concurrency=requests,
        units=units,
        ordered=spec.ordered,
        with_index=spec.with_index,
        client=read.client,
        timeout=read.timeout,
        policy=read.policy,
        transform=transform,
    )


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
        threads = sum(client.nthreads().values())
        return max(2 * threads, 1)
    cpus = os.cpu_count() or 1
    if _is_local(source):
        return cpus
    largest = max((len(unit) for unit in units), default=1) if units else 1
    chunk_bytes = source.dtype.itemsize * math.prod(
        max(sizes, default=0) for sizes in source.chunks
    )
    fits = DEFAULT_IO_BYTES // max(largest * chunk_bytes, 1)
    return max(min(DEFAULT_IO_CONCURRENCY, fits), min(cpus, DEFAULT_IO_CONCURRENCY), 1)


_LOCAL_STORES = ("LocalStore", "MemoryStore", "ZipStore", "GpuMemoryStore")


def _is_local(source: Source) -> bool:
    """Whether ``source`` is read without request latency: a numpy or dask array, or a
    Zarr array on a local store (a wrapper store may add latency: it is not local)."""
    if not isinstance(source, SliceSource):
        return True  # a dask array computes its own graph
    store = getattr(source.array, "store", None)
    return store is None or type(store).__name__ in _LOCAL_STORES


class ChunkStream(Stream[Any]):
    """One item per stored chunk; created by :func:`chunk_stream` and :func:`map_chunks`.

    Without ``transform`` an item is the chunk itself; with one it is
    ``transform(chunk)``, computed in the task that read the chunk (on a
    worker, with a client), so only the result travels to the consumer.

    Each read task reads one *unit*: one stored block, or, for a sharded Zarr
    array, every inner block of one shard with one read (``units``), whose
    blocks are then handed out one by one.  At most ``concurrency`` units are
    in flight or held.
    """

    def __init__(
        self,
        source: Source,
        *,
        concurrency: int,
        ordered: bool,
        with_index: bool,
        client: Any,
        timeout: float | None,
        policy: ReadPolicy = DEFAULT_POLICY,
        transform: Callable[[np.ndarray], Any] | None = None,
        units: Sequence[tuple[tuple[int, ...], ...]] | None = None,
    ) -> None:
        created = time.perf_counter()
        self.source = source
        self._blocks = list(source.blocks())
        self._sharded = units is not None
        self._units = (
            [tuple(unit) for unit in units] if units else [(block,) for block in self._blocks]
        )
        # reads wait on the store in their threads, so a Zarr or numpy source gets one
        # thread per read in flight; a dask array computes its graph on one per CPU
        threads = concurrency if isinstance(source, SliceSource) else os.cpu_count() or 1
        runner = make_runner(client, in_flight=concurrency, read_workers=threads)
        # reads in flight and store requests share the one number (io_concurrency)
        super().__init__(len(self._blocks), runner, timeout, policy.limited(concurrency))
        self._created = created
        self._concurrency = concurrency
        self._ordered = ordered
        self._with_index = with_index
        self._transform = transform
        # what read tasks call: locally one transform per CPU at once
        self._task_transform = None if transform is None else runner.cpu_bound(transform)

    def _produce(self) -> Iterator[Any]:
        units = self._units
        in_flight: dict[Any, int] = {}  # future -> unit number; insertion order = unit order
        held: dict[int, dict[tuple[int, ...], ShardItem]] = {}  # read units not yet handed out
        source = self.source
        submitted = 0

        def submit_next() -> None:
            nonlocal submitted
            unit = units[submitted]
            if not self._sharded:
                dsk, key = block_graph(
                    source,
                    unit[0],
                    self._token,
                    self._task_transform,
                    self.policy,
                    self._runner.scope,
                )
            else:
                assert isinstance(source, SliceSource)
                dsk, key = shard_graph(
                    source, unit, self._token, self._task_transform, self.policy, self._runner.scope
                )
            future = self._submit(dsk, key, -submitted, lambda u=unit: self._where_unit(u))
            in_flight[future] = submitted
            submitted += 1

        def top_up() -> None:
            while len(in_flight) + len(held) < self._concurrency and submitted < len(units):
                submit_next()

        def collect(future: Any) -> list[ShardItem]:
            number = in_flight[future]
            unit = units[number]
            result = self._wait(future, lambda u=unit: self._where_unit(u))
            del in_flight[future]
            self._runner.release(future)
            if not self._sharded:
                item, report = result
                return [(unit[0], _aligned(item), report, None)]
            return [(block, _aligned(item), report, error) for block, item, report, error in result]

        def hand_out(entry: ShardItem) -> Iterator[Any]:
            block, item, report, error = entry
            self._note(self.source.name, report, [block] if report.missing_chunks else ())
            if error is not None:
                raise WindowError(
                    f"{self._where(block)} failed: {type(error).__name__}: {error}"
                ) from error
            if report.skipped:
                self._skip(block)
                return
            yield self._deliver(block, item, missing=bool(report.missing_chunks))

        try:
            (source,) = self._place([self.source])
            if self._ordered:
                unit_of = {block: number for number, unit in enumerate(units) for block in unit}
                for block in self._blocks:  # C order of the chunk grid
                    number = unit_of[block]
                    while number not in held:
                        top_up()
                        while submitted <= number:  # held units fill the limit: read it anyway
                            submit_next()
                        future = next(f for f, n in in_flight.items() if n == number)
                        held[number] = {entry[0]: entry for entry in collect(future)}
                    entries = held[number]
                    entry = entries.pop(block)
                    if not entries:
                        del held[number]
                    top_up()
                    yield from hand_out(entry)
                return
            while True:
                top_up()
                if not in_flight:
                    break
                ready = self._first_done(list(in_flight))
                if not ready:  # nothing finished within timeout: name the oldest
                    oldest = self._where_unit(units[next(iter(in_flight.values()))])
                    raise WindowTimeoutError(
                        f"{oldest} was not ready after timeout={self._timeout} s "
                        f"(nor any of the {len(in_flight)} reads in flight)"
                        f"{self._runner.timeout_note}"
                    )
                for future in ready:
                    arrived = collect(future)
                    del future
                    top_up()
                    for one in arrived:
                        yield from hand_out(one)
        finally:
            for future in in_flight:
                self._runner.release(future)
            in_flight.clear()
            held.clear()

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
        sizes = [axis[i] for axis, i in zip(self.source.chunks, block, strict=True)]
        stats.windows_read += 1
        if not missing:
            stats.chunks_read += 1
            stats.bytes_read += math.prod(sizes) * self.source.dtype.itemsize
        stats.bytes_yielded += int(getattr(item, "nbytes", 0))
        stats.items_yielded += 1
        stats.samples_yielded += sizes[0]
        return (block, item) if self._with_index else item


def _name(function: Callable[..., Any]) -> str:
    return getattr(function, "__qualname__", None) or repr(function)
