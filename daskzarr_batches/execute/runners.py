"""Runners: compute dask graphs in the background, locally or on a cluster.

A stream hands each window (or block) graph to a :class:`Runner` and gets a
future back.  Two runners implement the same small protocol, so stream code
never asks which one it has:

:class:`ThreadRunner`
    dask's threaded scheduler on a private thread pool of this process.
:class:`ClientRunner`
    a ``distributed.Client``: graphs run on the cluster's workers, and the
    runner owns every future it made until it is released.

Futures of both are ``concurrent.futures``-like: ``future.result(timeout)``
returns the graph's result or raises its error (``TimeoutError`` when not
ready in time).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import os
import sys
import threading
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Protocol, cast

import dask.threaded

from ..errors import ArgumentTypeError
from ..plan.windows import ChunkPiece
from ..store.cache import kept_part, rows_name
from ..store.policy import CancelScope
from ..store.sources import SliceSource, Source
from ..store.threads import DaemonExecutor
from .cancel import Cancellation

__all__ = [
    "ClientRunner",
    "Fetched",
    "Keeper",
    "Runner",
    "ThreadRunner",
    "direct_fetch",
    "make_runner",
    "packed_keys",
    "resolve_client",
    "untokenized",
]

Graph = dict[Any, Any]


class Runner(Protocol):
    """What a stream needs from whatever computes its graphs.

    ``scope`` is the :class:`CancelScope` read tasks run their reads in
    (``None`` where tasks run in other processes); :meth:`close` cancels it.
    """

    scope: CancelScope | None
    #: appended to a ``WindowTimeoutError``'s message: what became of the read it gave up on
    timeout_note: str
    #: whether read tasks should return a window's rows in its plan order
    #: (results travel to the consumer's process: permute where they are read)
    plan_order: bool

    def place(self, sources: Sequence[Source], timeout: float | None) -> list[Source]:
        """``sources`` as graphs should refer to them (sent to workers once if needed)."""

    def submit(self, dsk: Graph, key: Any, priority: int) -> Any:
        """Start computing ``key`` of ``dsk``; returns its future.

        A higher ``priority`` runs first where the runner can order work.
        """

    def submit_many(self, graphs: Sequence[tuple[Graph, Any]], priority: int) -> list[Any]:
        """Start computing every ``(dsk, key)`` of ``graphs`` at once; their futures, in order.

        On a cluster one graph (one round trip to the scheduler) for all of
        them; locally one :meth:`submit` each.
        """

    def wait(self, futures: Sequence[Any], timeout: float | None) -> set[Any]:
        """Block until at least one of ``futures`` is done; the done ones.

        Empty when none finished within ``timeout`` seconds.
        """

    def release(self, future: Any) -> None:
        """Let go of ``future``: its result was consumed or is no longer wanted."""

    def cpu_bound(self, function: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """``function`` as tasks should call it: locally, one call per CPU at once."""

    def keeper(self, cache: Any, read: Callable[..., Any], policy: Any) -> Any:
        """``kept(source, piece, priority)`` for every read graph (a :class:`Keeper`), or ``None``.

        On a cluster, the cluster future of a Zarr array's axis-0 chunk that
        ``cache`` keeps (made by ``read(array, name, piece, row_bytes,
        policy)`` when it holds none); locally ``None`` (the cache is read by
        the tasks themselves).
        """

    def close(self) -> None:
        """Stop: cancel and release everything still held (idempotent)."""


class ThreadRunner:
    """Computes graphs with dask's threaded scheduler on a private pool.

    Each graph is driven by one thread of a small driver pool (one per graph
    in flight), whose tasks run on ``read_workers`` read threads.  The reads
    run through :attr:`scope`, which :meth:`close` cancels; chunk transforms
    wrapped by :meth:`cpu_bound` run at most one per CPU at once.
    """

    def __init__(self, in_flight: int, read_workers: int | None = None) -> None:
        workers = read_workers or max(os.cpu_count() or 1, in_flight)
        # daemon threads: one stuck in a read that never returns cannot block the exit
        self._pool = DaemonExecutor(workers, "dzb-read")
        self._drivers = DaemonExecutor(max(in_flight, 1), "dzb-window")
        self._cancellation = Cancellation()
        self.scope: CancelScope | None = self._cancellation
        self._cpu = threading.BoundedSemaphore(os.cpu_count() or 1)
        self.timeout_note = ""  # close() cancels the read, and its thread is let go
        self.plan_order = False  # the consumer gathers the plan order while cutting batches

    def place(self, sources: Sequence[Source], timeout: float | None) -> list[Source]:
        return list(sources)  # the threads share this process's memory

    def submit(self, dsk: Graph, key: Any, priority: int) -> Any:
        return self._drivers.submit(dask.threaded.get, dsk, key, pool=self._pool)

    def submit_many(self, graphs: Sequence[tuple[Graph, Any]], priority: int) -> list[Any]:
        return [self.submit(dsk, key, priority) for dsk, key in graphs]

    def wait(self, futures: Sequence[Any], timeout: float | None) -> set[Any]:
        done, _ = concurrent.futures.wait(
            futures, timeout=timeout, return_when=concurrent.futures.FIRST_COMPLETED
        )
        return done

    def release(self, future: Any) -> None:
        future.cancel()  # no-op once it runs or ran

    def cpu_bound(self, function: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """``function`` run at most once per CPU at once, however many reads are in flight."""
        return _Slotted(function, self._cpu)

    def keeper(self, cache: Any, read: Callable[..., Any], policy: Any) -> Any:
        return None  # read tasks consult the cache in this process

    def close(self) -> None:
        """Cancel the reads in flight on Zarr's event loop and stop the threads."""
        self._cancellation.cancel()
        self._drivers.shutdown(wait=False, cancel_futures=True)
        self._pool.shutdown(wait=False, cancel_futures=True)


class ClientRunner:
    """Computes graphs on a ``distributed.Client``, on its workers.

    The runner owns every future it creates: :meth:`release` lets go of one
    as soon as its result is consumed, and :meth:`close` releases whatever is
    left (graphs in flight, scattered sources).  Releasing is non-blocking
    (it only queues a message to the scheduler), so it is safe from
    ``__del__`` and from any thread; the scheduler then forgets the keys and
    the workers drop their results or stop waiting for them.

    Workers lost mid-computation are handled by the scheduler: their tasks
    (and the results they held) are recomputed elsewhere, up to
    ``distributed.scheduler.allowed-failures`` times per task.
    """

    def __init__(self, client: Any, in_flight: int = 1) -> None:
        self.client = client
        self.scope: CancelScope | None = None  # tasks run on the workers
        # distributed cannot stop a running task: a cancelled one keeps its worker thread
        self.timeout_note = (
            "; on a cluster the read is not interrupted: its worker thread stays blocked "
            "until the store answers or the worker restarts (client.restart())"
        )
        self.plan_order = True  # workers permute, the client cuts batches by slicing
        self._live: dict[int, Fetched] = {}  # id -> future, submitted and not released
        self._scattered: dict[str, Any] = {}  # graph key -> future of a scattered array
        # scattered keys are this runner's own: a key shared with an earlier stream
        # could be forgotten by that stream's release, queued before this scatter
        self._name = uuid.uuid4().hex[:8]
        # one thread per graph in flight brings its result here as soon as it is ready
        self._fetchers = DaemonExecutor(max(in_flight, 1), "dzb-fetch")
        self.peak_in_flight = 0
        #: whether results are fetched from the workers themselves (:func:`direct_fetch`)
        self.direct = direct_fetch(client)

    def place(self, sources: Sequence[Source], timeout: float | None) -> list[Source]:
        """``sources`` ready to embed in graphs sent to the cluster.

        A source whose pickle carries its data (a numpy array, a Zarr array in
        a memory store) is scattered to every worker once per stream, and the
        graphs refer to it by key; other sources (Zarr arrays on disk or in an
        object store, dask arrays) pickle small and are embedded as they are.
        """
        # each source placed once: a patch stream's outputs share their base array
        done: dict[int, Source] = {}

        def placed(source: Source) -> Source:
            if id(source) not in done:
                parts = source.parts()  # a subset's base, a collection's members
                done[id(source)] = (
                    source.with_parts(tuple(placed(part) for part in parts))
                    if parts
                    else self._placed(source, timeout)
                )
            return done[id(source)]

        return [placed(source) for source in sources]

    def _placed(self, source: Source, timeout: float | None) -> Source:
        """One stored source, scattered to every worker if its pickle carries its data."""
        if source.carries_data:  # a numpy array, a Zarr array in memory: a SliceSource
            sliced = cast(SliceSource, source)
            key = f"dzb-scattered-{sliced.token}-{self._name}"
            if key not in self._scattered:
                scattered = self.client.scatter(
                    {key: sliced.array},
                    broadcast=True,
                    hash=False,
                    **({} if timeout is None else {"timeout": timeout}),
                )
                self._scattered[key] = scattered[key]
            source = dataclasses.replace(sliced, array=self._scattered[key])
        return source

    def submit(self, dsk: Graph, key: Any, priority: int) -> Fetched:
        return self.submit_many([(dsk, key)], priority)[0]

    def submit_many(self, graphs: Sequence[tuple[Graph, Any]], priority: int) -> list[Fetched]:
        """Every ``(dsk, key)`` of ``graphs`` in one graph, one round trip to the scheduler.

        One ``client.get`` per unit of a per-chunk job cost a scheduler round
        trip, a graph's packing and ordering each: with few units in flight the
        workers idled between them (issue 40: 18% busy).  The graphs' keys must
        be distinct; shared keys (a dask source's culled graph) are merged.

        A ``key`` whose task only packs other keys in a tuple (a window's
        outputs, :func:`packed_keys`) is not sent: its parts are computed and
        fetched, each straight from the worker that made it, and packed here.
        As a task it waited for a worker thread behind the next window's
        read, then copied the outputs made on other workers to its own before
        the whole window travelled again (issue 40).
        """
        merged: Graph = {}
        wanted: list[tuple[list[Any], bool]] = []  # per graph: keys computed, packed here
        for dsk, key in graphs:
            merged.update(dsk)
            parts = packed_keys(dsk, key)
            if parts is None:
                wanted.append(([key], False))
            else:
                del merged[key]
                wanted.append((parts, True))
        flat = [key for keys, _ in wanted for key in keys]
        futures = iter(self.client.get(untokenized(merged), flat, sync=False, priority=priority))
        made = []
        for keys, packed in wanted:
            mine = tuple(next(futures) for _ in keys)
            fetched = Fetched(mine, self._fetchers.submit(_fetch, mine, packed, self.direct))
            self._live[id(fetched)] = fetched
            made.append(fetched)
        self.peak_in_flight = max(self.peak_in_flight, len(self._live))
        return made

    def wait(self, futures: Sequence[Fetched], timeout: float | None) -> set[Fetched]:
        by_local = {fetched.local: fetched for fetched in futures}
        done, _ = concurrent.futures.wait(
            by_local, timeout=timeout, return_when=concurrent.futures.FIRST_COMPLETED
        )
        return {by_local[local] for local in done}

    def release(self, future: Fetched) -> None:
        """Let go of ``future``: the cluster forgets its key and result."""
        self._live.pop(id(future), None)
        future.release()

    def cpu_bound(self, function: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """``function`` as it is: each worker runs as many tasks as it has threads."""
        return function

    def keeper(self, cache: Any, read: Callable[..., Any], policy: Any) -> Any:
        """Chunk futures ``cache`` keeps on this cluster, made on first use (:class:`Keeper`)."""
        return Keeper(self.client, cache, read, policy)

    def close(self) -> None:
        """Release every future still held (idempotent)."""
        leftovers = [*self._live.values(), *self._scattered.values()]
        self._live.clear()
        self._scattered.clear()
        for future in leftovers:
            future.release()  # a fetch waiting for it ends (the future is cancelled)
        self._fetchers.shutdown(wait=False, cancel_futures=True)


def untokenized(dsk: Graph) -> Any:
    """``dsk`` as ``client.get`` takes it, without tokenizing it.

    ``client.get`` names a graph by a deterministic token of every task's
    arguments: each read context, policy, source and piece normalised field by
    field, ~30 ms of this process's CPU per unit graph measured on a loaded
    LocalCluster (issue 40: more than the unit's read on the worker).  Our keys
    are unique already, so the graph's name need not be deterministic: a random
    token, as dask gives a ``HighLevelGraph`` it cannot tokenize.  Where dask's
    expression class moved, the dict as it is (tokenized, correct, slower).
    """
    try:
        from dask._expr import LLGExpr
    except ImportError:  # pragma: no cover - another dask layout
        return dsk
    return LLGExpr(dsk, _determ_token=uuid.uuid4().hex)


class Keeper:
    """``kept(source, piece, priority)``: the cluster future of a chunk a cache keeps.

    The one way a cache keeps decoded chunks on a cluster, for every read
    that needs a Zarr array's rows or blocks (batch windows, chunk streams
    and their transforms, patches, chunk subsets, collection members, the
    inputs of writes).  Each future is one task reading every row of one
    axis-0 chunk (``read``, with ``policy`` less its cache: the result is
    what is kept), keyed ``dzb-cached-<cache id>-<array token>-<start>-<stop>``;
    the cache holds the futures (not the runner: closing a stream keeps
    them).  Arrays without a cache token (numpy, scattered in-memory Zarr
    arrays) are not kept: ``kept`` returns ``None`` and :meth:`keeps` says so.
    """

    def __init__(self, client: Any, cache: Any, read: Callable[..., Any], policy: Any) -> None:
        self.client, self.cache, self.read = client, cache, read
        self.tokens = dict(policy.cache_tokens)
        self.plain = dataclasses.replace(policy, cache=None, cache_tokens=())

    def token(self, source: Source) -> str | None:
        """The cache token of ``source``'s array, if the cache can keep its chunks."""
        store_path = getattr(getattr(source, "array", None), "store_path", None)
        return None if store_path is None else self.tokens.get(str(store_path))

    def keeps(self, source: Source) -> bool:
        """Whether the chunks of ``source`` (a Zarr array's) are kept."""
        return self.token(source) is not None

    def __call__(self, source: SliceSource, piece: Any, priority: int) -> tuple[Any, bool] | None:
        """The future of ``piece``'s whole axis-0 chunk and whether it was made now; or ``None``."""
        token = self.token(source)
        if token is None:
            return None
        cache, client, array, read, plain = (
            self.cache, self.client, source.array, self.read, self.plain
        )  # fmt: skip
        key = f"dzb-cached-{cache.id}-{token}-{piece.start}-{piece.stop}"
        whole = dataclasses.replace(piece, take=slice(None), dest=slice(0, piece.rows))

        def make(retry: bool) -> Any:  # a failed one's key may still be known: a new one
            name = f"{key}-{uuid.uuid4().hex[:8]}" if retry else key
            return client.submit(
                read, array, source.name, whole, source.row_bytes, plain,
                key=name, pure=False, priority=priority,
            )  # fmt: skip

        held = cache.key(token, rows_name(piece.start, piece.stop))
        nbytes = piece.rows * source.row_bytes
        return cache.cluster_chunk(held, client.id, nbytes, make)

    def block(
        self, source: SliceSource, block: tuple[int, ...], priority: int, read: Callable[..., Any]
    ) -> tuple[Any, bool, tuple[slice, ...]] | None:
        """The kept part holding stored ``block``: its future, whether it was made now, and
        the region of the array it holds; or ``None`` (not kept).

        The part is the block's stored object decoded
        (``store.cache.kept_part``): for a block of a sharded array, every
        inner block of its shard (one fetch of the shard); for a block
        spanning every column, its axis-0 chunk, kept as batch windows keep
        it (:meth:`__call__`: the same future serves both); else the block
        alone.  A part of its own is one task,
        ``read(array, name, blocks, slices, region, policy)`` with the policy
        less its cache (``read.kept.read_kept_part``), keyed
        ``dzb-cached-<cache id>-<array token>-b<first block>``; its result is
        ``(data, report)``, ``data`` covering the region.
        """
        token = self.token(source)
        if token is None:
            return None
        part = kept_part(source, block)
        if part.rows:  # its axis-0 chunk's rows, as batch windows keep them
            rows = part.region[0]
            piece = ChunkPiece(block[0], rows.start, rows.stop, slice(None), slice(None))
            found = self(source, piece, priority)
            return None if found is None else (*found, part.region)
        array, blocks, slices, region = source.array, part.blocks, part.slices, part.region
        cache, client, plain = self.cache, self.client, self.plain
        key = f"dzb-cached-{cache.id}-{token}-b{'.'.join(map(str, blocks[0]))}"

        def make(retry: bool) -> Any:  # a failed one's key may still be known: a new one
            name = f"{key}-{uuid.uuid4().hex[:8]}" if retry else key
            return client.submit(
                read, array, source.name, blocks, slices, region, plain,
                key=name, pure=False, priority=priority,
            )  # fmt: skip

        nbytes = math.prod(s.stop - s.start for s in region) * source.dtype.itemsize
        future, made = cache.cluster_chunk(cache.key(token, part.name), client.id, nbytes, make)
        return future, made, region


class _Slotted:
    """``function`` called while holding one of a runner's CPU slots (local tasks only)."""

    __slots__ = ("function", "slots")

    def __init__(self, function: Callable[[Any], Any], slots: threading.BoundedSemaphore) -> None:
        self.function = function
        self.slots = slots

    def __call__(self, value: Any) -> Any:
        with self.slots:
            return self.function(value)


def packed_keys(dsk: Graph, key: Any) -> list[Any] | None:
    """The keys ``key``'s task packs in a tuple, if that is all it does (else ``None``).

    A window graph's result task, ``(tuple, [output keys])``; the key must be
    the graph's result (no task of ``dsk`` depends on it).
    """
    task = dsk.get(key)
    if type(task) is not tuple or len(task) != 2 or task[0] is not tuple:
        return None
    parts = task[1]
    if not isinstance(parts, list) or not parts or not all(part in dsk for part in parts):
        return None
    return list(parts)


def _fetch(futures: tuple[Any, ...], packed: bool, direct: bool) -> Any:
    """The results of ``futures``, brought to this process; the cluster then forgets them.

    One future's result, or with ``packed`` the tuple of all of theirs.
    ``direct``: fetched from the workers holding them (:func:`direct_fetch`),
    else through the scheduler, as ``future.result()`` does.
    """
    try:
        values = futures[0].client.gather(list(futures), direct=direct)
        return tuple(values) if packed else values[0]
    finally:
        for future in futures:
            future.release()  # idempotent: releasing the Fetched later is harmless


def direct_fetch(client: Any) -> bool:
    """Whether results are fetched from the workers directly, not through the scheduler.

    ``future.result()`` of a client outside the cluster asks the scheduler to
    gather the result and pass it on: every window crosses two connections
    and the scheduler's event loop, where the workers could send it straight
    to this process (issue 40: a 20 MiB array fetched directly from a worker
    of a LocalCluster in 0.6x the time).  Workers on other hosts may not be
    reachable from the client (a gateway, a NAT), which is why ``distributed``
    does not do it by default.  So: the client's own ``direct_to_workers``
    when it was given (``Client(..., direct_to_workers=True)`` or the
    ``distributed.client.direct-to-workers`` setting), else directly exactly
    when the workers are this host's (a ``LocalCluster``, a scheduler on
    loopback or in this process).
    """
    chosen = getattr(client, "direct_to_workers", None)
    if chosen is not None:
        return bool(chosen)
    try:
        from distributed import LocalCluster
    except ImportError:  # pragma: no cover - a client implies distributed
        return False
    if isinstance(getattr(client, "cluster", None), LocalCluster):
        return True
    address = str(getattr(getattr(client, "scheduler", None), "address", "") or "")
    return address.startswith(("inproc://", "tcp://127.", "tcp://localhost:", "tcp://[::1]"))


class Fetched:
    """A graph's cluster futures, whose result is fetched to this process as soon as ready.

    ``futures`` are the ``distributed.Future`` objects (one, or a window's
    outputs, :func:`packed_keys`); ``local`` a ``concurrent.futures.Future``
    that a fetch thread fills with the result (or error), so the transfer of
    a window overlaps the consumption of the one before it instead of
    starting when the consumer asks for it.  The fetch releases the
    cluster's futures once the result is here, so the workers free their
    copies at once.
    """

    __slots__ = ("futures", "local")

    def __init__(self, futures: tuple[Any, ...], local: concurrent.futures.Future[Any]) -> None:
        self.futures = futures
        self.local = local

    def result(self, timeout: float | None = None) -> Any:
        """The graph's result, as ``distributed.Future.result`` gives it."""
        return self.local.result(timeout)

    def done(self) -> bool:
        """Whether the result (or its error) is here."""
        return self.local.done()

    def release(self) -> None:
        """Release the cluster's futures (keys and results) and drop the fetched result."""
        self.local.cancel()  # not started yet: never fetch it
        for future in self.futures:
            future.release()


def resolve_client(client: Any) -> Any | None:
    """``client`` if given, else the ``distributed`` client dask would use now.

    A client is active when dask's configuration points at one, as it does
    after ``Client(...)`` (``set_as_default=True``, the default) or inside
    ``with dask.config.set(scheduler=client)``.
    ``dask.config.set(scheduler="threads")`` (or ``"sync"``) forces the local
    threaded scheduler even then.

    Raises
    ------
    ArgumentTypeError
        ``client`` is neither ``None`` nor a ``distributed.Client``.
    """
    if client is not None:
        import distributed

        if not isinstance(client, distributed.Client):
            hint = (
                f"; to connect, pass distributed.Client({client!r})"
                if isinstance(client, str)
                else ""
            )
            raise ArgumentTypeError(
                f"client must be a distributed.Client or None, got {client!r} of type "
                f"{type(client).__name__}{hint}"
            )
        return client
    if "distributed" not in sys.modules:
        return None  # no client can exist if distributed was never imported
    import dask.base
    import distributed

    scheduler = dask.base.get_scheduler()
    active = getattr(scheduler, "__self__", None)
    return active if isinstance(active, distributed.Client) else None


def make_runner(
    client: Any | None, in_flight: int, read_workers: int | None = None
) -> ThreadRunner | ClientRunner:
    """A runner on ``client``, or on the local threaded scheduler if ``None``.

    ``in_flight``: graphs computed at once.  ``read_workers``: local threads
    running read tasks (default: one per CPU, at least ``in_flight``).  The
    store-request limit (``io_concurrency``) is no runner's business: it
    travels in the read tasks' :class:`~daskzarr_batches.store.policy.ReadPolicy`.
    """
    if client is None:
        return ThreadRunner(in_flight, read_workers)
    return ClientRunner(client, in_flight)
