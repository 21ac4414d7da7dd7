"""The stream base: one pass, ``len()``, ``close()``, ``with``, a lock around ``next()``, stats.

A stream stops at its first error and names it on every later ``next()``;
everything its generator holds is released on exhaustion, ``close()``, errors
and garbage collection."""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import threading
import time
import uuid
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Self, TypeVar

import numpy as np
import zarr

from ..errors import (
    CacheWarning,
    ChunkReadError,
    MissingChunksWarning,
    StreamFailedError,
    WindowError,
    WindowTimeoutError,
    warn_caller,
)
from ..execute.runners import Runner
from ..plan.quality import LabelCounter, QualityCounter, ShuffleQuality
from ..plan.summary import read_amplification
from ..store.policy import ReadPolicy, ReadReport, is_program_error, program_error
from ..store.sources import Source
from .timing import Bottleneck, bottleneck_of

__all__ = ["SkippedChunk", "Stream", "StreamStats", "T"]


T = TypeVar("T")


@dataclass(frozen=True)
class SkippedChunk:
    """A chunk whose samples left the epoch because it does not decode.

    Attributes
    ----------
    array : str
        The array's name.
    chunk : int or tuple of int
        The axis-0 chunk (batch streams) or block index (chunk streams).
    samples : range
        The samples the chunk holds.
    """

    array: str
    chunk: int | tuple[int, ...]
    samples: range


class DeliveredIds:
    """The sample ids of the consumed windows, fed to a :class:`QualityCounter`
    as their batches are handed out.

    A batch stream pushes each window's kept ids (in plan order) and epoch
    positions when it takes the window; the stream's ``samples_yielded`` says
    how many of them were delivered, and only those are counted, in one
    vectorised call per window (the per-batch hot path does nothing).
    """

    __slots__ = ("counter", "fed", "pending")

    def __init__(self, counter: QualityCounter) -> None:
        self.counter = counter
        self.pending: deque[tuple[np.ndarray, np.ndarray]] = deque()
        self.fed = 0

    def push(self, ids: np.ndarray, positions: np.ndarray, delivered: int) -> None:
        """A consumed window's ids; counts those delivered so far first."""
        self.flush(delivered)
        if len(ids):
            self.pending.append((ids, positions))

    def flush(self, delivered: int) -> None:
        """Count the ids up to the ``delivered``-th."""
        while self.fed < delivered and self.pending:
            ids, positions = self.pending[0]
            need = delivered - self.fed
            if len(ids) <= need:
                self.pending.popleft()
            else:
                self.pending[0] = (ids[need:], positions[need:])
                ids, positions = ids[:need], positions[:need]
            self.counter.add(ids, positions)
            self.fed += len(ids)

    def quality(self, delivered: int) -> ShuffleQuality:
        self.flush(delivered)
        return self.counter.quality()


@dataclass
class StreamStats:
    """Counters of one stream, updated as items are consumed.

    Attributes
    ----------
    chunks_read : int
        Stored chunks decoded (for batch streams: axis-0 chunks, each covering
        every stored chunk along the other axes; per paired array).
    bytes_read : int
        Decoded bytes of those chunks.
    bytes_yielded : int
        Bytes of the arrays handed to the consumer.
    items_yielded : int
        Batches (or chunks) handed to the consumer.
    samples_yielded : int
        Samples (rows of axis 0) handed to the consumer.
    windows_read : int
        Dask graphs whose results were consumed.
    wait_seconds : float
        Time the consumer spent blocked in ``next()`` waiting for data.
    chunks_missing : int
        Chunks (batch streams: axis-0 chunks per array) with stored objects
        absent from the store, read as the fill value; each counted once per
        stream, however many windows read it; not in ``chunks_read``.
    retries : int
        Reads retried after a transient fault.
    skipped : list of SkippedChunk
        Chunks left out because they do not decode (``on_error="skip"``).
    samples_filled : int
        Samples yielded in place of skipped ones so that a rank keeps its
        steps: a [`Loader`][daskzarr_batches.Loader] with ``world_size > 1`` fills the shortfall
        of skipped chunks from the start of the rank's own share, as
        ``even_batches`` pads.
    time_to_first_batch : float or None
        Seconds from the stream's creation to the first batch (chunk streams:
        the first chunk) handed out; ``None`` before it.  The start-up cost:
        sequential and buffered streams read a one-unit window first, so it is
        about one chunk read (``docs/architecture.md``, *Fast start*).
    cache_hits, cache_misses : int
        Stored chunks served by the stream's ``cache`` (neither fetched nor
        decoded), and chunks it did not hold (read from the store, then kept).
    bytes_from_cache : int
        Decoded bytes of the chunks served by the cache.
    cache_damaged : int
        Cache files found damaged (truncated, altered): dropped and read
        again from the store.
    samples_per_source : list of int or None
        Streams over a collection or a mixture: samples of the consumed
        windows drawn from each member / source (a mixture's realised
        shares); ``None`` for other streams.
    bytes_distinct : int or None
        Patch streams: decoded bytes of the distinct stored chunks read so far
        (each counted once); ``None`` for other streams, whose samples do not
        overlap.
    quality : ShuffleQuality or None
        Batch streams: how well mixed the samples handed out so far are,
        beside an exact shuffle (the figures of ``summary().quality``, over
        the sample ids actually delivered: skipped chunks and a rank's share
        included); ``None`` for chunk streams.  Computed when asked, from the
        ids of the windows consumed (no cost per batch).
    consumer_seconds, next_seconds : float
        Wall seconds the consumer spent outside ``next()`` between items (its
        own step) and inside it (``wait_seconds`` of which blocked on reads).
    store_requests, store_request_seconds, store_busy_seconds, store_queued_seconds
        Store requests of this stream's reads in this process (not a
        cluster's workers', nor the zarrs pipeline's, which are not
        clocked): how many, their seconds summed, the wall seconds with one
        in flight, and the seconds they waited for a slot of
        ``io_concurrency`` (the stream's, ``io_concurrency``).
    """

    chunks_read: int = 0
    bytes_read: int = 0
    bytes_yielded: int = 0
    items_yielded: int = 0
    samples_yielded: int = 0
    windows_read: int = 0
    wait_seconds: float = 0.0
    chunks_missing: int = 0
    retries: int = 0
    skipped: list[SkippedChunk] = field(default_factory=list)
    samples_filled: int = 0
    time_to_first_batch: float | None = None
    bytes_distinct: int | None = None
    samples_per_source: list[int] | None = None
    cache_hits: int = 0
    cache_misses: int = 0
    bytes_from_cache: int = 0
    cache_damaged: int = 0
    consumer_seconds: float = 0.0
    next_seconds: float = 0.0
    store_requests: int = 0
    store_request_seconds: float = 0.0
    store_busy_seconds: float = 0.0
    store_queued_seconds: float = 0.0
    io_concurrency: int | None = None
    delivered: DeliveredIds | None = field(default=None, repr=False, compare=False)
    labels: LabelCounter | None = field(default=None, repr=False, compare=False)

    @property
    def quality(self) -> ShuffleQuality | None:
        """The shuffle quality of the samples yielded so far (batch streams).

        With ``labels=`` (the array of discrete labels named), also the label
        mixing of the batches yielded (``label_mixing``, ``label_distance``).
        """
        if self.delivered is None:
            return None
        quality = self.delivered.quality(self.samples_yielded)
        figures = None if self.labels is None else self.labels.figures()
        if figures is not None:
            quality = dataclasses.replace(
                quality, label_mixing=figures[0], label_distance=figures[1]
            )
        return quality

    def bottleneck(self) -> Bottleneck:
        """The stage that limited the epoch so far, the numbers and the setting to change.

        See [`Bottleneck`][daskzarr_batches.streams.timing.Bottleneck]; ``str()`` of
        it is one line (what ``daskzarr-batches bench`` prints).
        """
        return bottleneck_of(self)

    @property
    def read_amplification(self) -> float:
        """``bytes_read / bytes_yielded`` (1.0 means every byte read once).

        Patch streams, whose patches may overlap: ``bytes_read /
        bytes_distinct``, how often each stored chunk read was decoded.
        0.0 when nothing was read or yielded, ``inf`` when bytes were read
        but nothing yielded: the rule ``PlanSummary`` follows too.
        """
        if self.bytes_distinct is not None:
            return read_amplification(self.bytes_read, self.bytes_distinct)
        return read_amplification(self.bytes_read, self.bytes_yielded)


class Stream(abc.ABC, Generic[T]):
    """An iterator with ``len()``, ``close()``, context-manager use and stats.

    One pass: once exhausted (or closed) it stays exhausted, as Python's
    iterators do.  Once ``next()`` has raised an error (a chunk that cannot
    be read, a timeout, an interrupt), every later ``next()`` raises
    [`StreamFailedError`][daskzarr_batches.StreamFailedError] naming it: an epoch cut short never
    looks
    finished.  ``next()`` may be called from several threads: calls are
    serialised, and each item goes to exactly one caller.

    Subclasses provide ``_produce()``, a generator of items; everything it
    holds (futures, threads) is released in its ``finally`` block, which runs
    on exhaustion, ``close()``, errors, and when the stream is dropped
    (``break`` out of a ``for`` loop over it, or garbage collection).  The
    generator sees the stream through a weak proxy, so the stream and its
    generator form no reference cycle: a stream dropped after ``break`` is
    finalised at once by reference counting, and its work in flight is
    released right away.
    """

    def __init__(
        self, length: int, runner: Runner, timeout: float | None, policy: ReadPolicy
    ) -> None:
        self._created = time.perf_counter()
        self._left: float | None = None  # when the last next() returned
        self.stats = StreamStats()
        self._length = length
        self._runner = runner
        self._timeout = timeout
        self._token = uuid.uuid4().hex[:12]
        self._items: Iterator[T] | None = None
        self._closed = False
        self._failure: BaseException | None = None  # the error that stopped the stream
        self._lock = threading.Lock()
        #: how the stream's reads treat faults; it alone says whether missing chunks warn
        self.policy = policy
        self._missing_seen: set[tuple[str, object]] = set()  # (array, chunk), each counted once
        self._clocked = -1  # the store clock's changes when next() last copied its figures
        self._warned = False

    @abc.abstractmethod
    def _produce(self) -> Iterator[T]:
        """The stream's items, one pass (run through a weak proxy of the stream)."""

    def __len__(self) -> int:
        return self._length

    def __iter__(self) -> Self:
        return self

    def __next__(self) -> T:
        entered = time.perf_counter()
        stats = self.stats
        if self._left is not None:
            stats.consumer_seconds += entered - self._left
        try:
            return self._next()
        finally:
            self._left = time.perf_counter()
            stats.next_seconds += self._left - entered
            limit = self.policy.requests
            # unchanged since the last next() and none in flight: the same figures (per batch)
            if limit is not None and (limit.active or limit.changes != self._clocked):
                self._clocked = limit.changes
                stats.io_concurrency = limit.n
                stats.store_requests = limit.requests
                stats.store_request_seconds = limit.request_seconds
                stats.store_busy_seconds = limit.busy_now()
                stats.store_queued_seconds = limit.queued_seconds

    def _next(self) -> T:
        with self._lock:
            if self._failure is not None:
                raise self._failed()
            if self._closed:
                raise StopIteration
            if self._items is None:
                proxy: Any = weakref.proxy(self)
                self._items = type(self)._produce(proxy)
            try:
                return next(self._items)
            except BaseException as exc:  # StopIteration included: exhausted
                closed_elsewhere = self._closed  # close() from another thread stopped it
                if not closed_elsewhere and not isinstance(exc, StopIteration):
                    self._failure = exc  # every later next() names it
                self._close(force=True)
                if closed_elsewhere:
                    raise StopIteration from None
                raise

    def _failed(self) -> StreamFailedError:
        """The error a ``next()`` after the stream's first error raises."""
        first = self._failure
        assert first is not None
        error = StreamFailedError(
            f"this stream stopped at an earlier error and yields nothing more "
            f"({self.stats.items_yielded} of {len(self)} items were yielded): "
            f"{type(first).__name__}: {first}; make a new stream (a Loader resumes from "
            "its state_dict()) to go on"
        )
        error.__cause__ = first
        return error

    def close(self) -> None:
        """Stop the stream: cancel work in flight and release its results.

        From another thread while ``next()`` runs, the stream stops handing
        out items once that call returns.
        """
        if self._lock.acquire(blocking=False):
            try:
                self._close()
            finally:
                self._lock.release()
        else:  # next() is running on another thread: stop its work, it returns
            self._closed = True
            self._runner.close()

    def _close(self, force: bool = False) -> None:
        if self._items is None and self._closed and not force:
            return
        self._closed = True
        items, self._items = self._items, None
        try:
            if items is not None:
                # A stream collected in a reference cycle (a suspended Loader at interpreter
                # exit) has its weak references cleared before this runs: the generator's
                # cleanup then finds its proxy of the stream dead and stops there.
                with contextlib.suppress(ReferenceError):
                    items.close()  # type: ignore[attr-defined]
        finally:
            self._runner.close()  # releases anything the generator could not

    def _note(self, name: str, report: ReadReport, chunks: Sequence[object] | None = None) -> None:
        """Count what the read policy saw in one task; warn at the first missing chunk.

        ``chunks``: the chunks the report's missing keys stand for (default:
        its axis-0 chunks); each (array, chunk) is counted once per stream,
        however many windows read it (an exact shuffle reads a chunk in
        several).
        """
        self.stats.retries += report.retries
        if report.cache is not None:
            cache = self.policy.cache
            problem = None if cache is None else cache.take_write_error()
            if problem is not None:
                warn_caller(CacheWarning(problem))
            self.stats.cache_hits += report.cache.hits
            self.stats.cache_misses += report.cache.misses
            self.stats.bytes_from_cache += report.cache.bytes_hit
            self.stats.cache_damaged += report.cache.damaged
        if not report.missing_keys:
            return
        found = report.missing_chunks if chunks is None else chunks
        new = {(name, chunk) for chunk in found} - self._missing_seen
        self._missing_seen |= new
        self.stats.chunks_missing += len(new)
        self._warn_missing(name, report.missing_keys[0])

    def _warn_missing(self, name: str, key: str) -> None:
        """One warning per stream, at its first missing chunk (``missing="warn"``).

        Attributed to the caller's line (the first frame outside the package),
        from the ``next()`` that hands out the first item holding the chunk.
        """
        if self._warned or self.policy.missing != "warn":
            return
        self._warned = True
        count = self.stats.chunks_missing
        warn_caller(
            MissingChunksWarning(
                f"{count} chunk(s) of array {name} were missing from the store and read as the "
                f"fill value (first: {key!r}; stream.stats.chunks_missing counts them all); "
                "missing='fill' (the default: an absent chunk is the fill value in Zarr) "
                "counts them silently, missing='error' raises",
                array=name,
                key=key,
                count=count,
            )
        )

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown
            self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<{type(self).__name__} {self._describe_self()}, {state}>"

    @abc.abstractmethod
    def _describe_self(self) -> str:
        """What ``repr`` shows between the class name and the open/closed state."""

    def _place(self, sources: Sequence[Source]) -> list[Source]:
        """Sources as the runner wants them in graphs (sent to a cluster once)."""
        try:
            return self._runner.place(sources, self._timeout)
        except Exception as exc:
            names = ", ".join(source.name for source in sources)
            error = WindowTimeoutError if isinstance(exc, TimeoutError) else WindowError
            raise error(
                f"could not send {names} to the cluster's workers: {type(exc).__name__}: {exc}"
            ) from exc

    def _submit(
        self, dsk: dict[Any, Any], key: Any, priority: int, what: Callable[..., str]
    ) -> Any:
        """Hand a graph to the runner; a refusal (e.g. a closed client) names the work."""
        try:
            return self._runner.submit(dsk, key, priority)
        except Exception as exc:
            raise WindowError(
                f"{what()} could not be submitted: {type(exc).__name__}: {exc}"
            ) from exc

    def _submit_many(
        self, graphs: Sequence[tuple[dict[Any, Any], Any]], priority: int, what: Callable[..., str]
    ) -> list[Any]:
        """Hand several graphs to the runner at once (one graph on a cluster); their futures."""
        try:
            return self._runner.submit_many(graphs, priority)
        except Exception as exc:
            raise WindowError(
                f"{what()} could not be submitted: {type(exc).__name__}: {exc}"
            ) from exc

    def _wait(self, future: Any, what: Callable[..., str]) -> Any:
        """Block for ``future``'s result, turning failures into our errors."""
        started = time.perf_counter()
        try:
            return future.result(timeout=self._timeout)
        except ChunkReadError:
            raise
        except TimeoutError as exc:
            if future.done():  # the task itself raised a TimeoutError
                raise WindowError(f"{what()} failed: {exc!r}") from exc
            raise WindowTimeoutError(
                f"{what()} was not ready after timeout={self._timeout} s{self._runner.timeout_note}"
            ) from exc
        except Exception as exc:
            if is_program_error(exc):  # a bug or an incompatible dependency: as what it is
                error = program_error(exc, what())
                raise error from error.__cause__
            raise WindowError(f"{what()} failed: {type(exc).__name__}: {exc}") from exc
        finally:
            self.stats.wait_seconds += time.perf_counter() - started


def stored_sources(source: Source) -> list[Source]:
    """The sources of the stored arrays behind ``source``.

    A chunk subset's or a patch source's base, a collection's members (each
    as far down as it goes); any other source itself.
    """
    return source.stored_sources()


def stored_arrays(sources: Sequence[Source]) -> list[Any]:
    """The Zarr arrays behind ``sources`` (:func:`stored_sources`: bases, members)."""
    found = []
    for source in sources:
        for stored in stored_sources(source):
            array = getattr(stored, "array", None)
            if isinstance(array, zarr.Array):
                found.append(array)
    return found


def _aligned(value: Any) -> Any:
    """``value``, copied if it is an array whose data is not aligned for its dtype.

    A result received from a distributed worker sits wherever the message put
    it; on an unaligned address ``np.take`` is many times slower (see
    docs/benchmarks.md), so one copy of the window pays for itself.
    """
    if isinstance(value, np.ndarray) and not value.flags.aligned:
        return np.require(value, requirements=["A"])
    return value
