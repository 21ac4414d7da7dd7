"""Read policy: how every read of a stored object behaves when the store misbehaves.

A :class:`ReadPolicy` says what happens when a chunk is missing (``missing``),
when a chunk cannot be decoded (``on_error``) and how often a transient fault
(a dropped connection, a timeout, HTTP 5xx or throttling) is retried
(``retries``).  The read layer applies it inside every read task, locally and
on workers, by reading through :func:`policy_view`: the same Zarr array over a
:class:`PolicyStore`, which wraps the array's store for the duration of one
task and writes what happened into a :class:`Ledger` (missing keys, retries,
failed reads) that the task returns beside its data.

Nothing here changes the bytes a read returns: a retried read returns what a
first successful read would have; a missing chunk is filled with the array's
fill value exactly as Zarr does (``missing="fill"``, the default, or ``"warn"``),
or is an error (``"error"``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, get_args

import zarr
import zarr.storage
from zarr.abc.store import ByteRequest

from ..errors import (
    ArgumentTypeError,
    ArgumentValueError,
    MissingChunkError,
    StoreGoneError,
)
from .cache import CacheCounts, CachingPipeline, ChunkCache, array_token
from .faults import is_program_error, is_transient, program_error
from .layout import is_metadata_key, metadata_key
from .pipelines import array_view, codec_pipeline_of, is_zarrs_pipeline, zarr_pipeline
from .threads import zarr_loop
from .zarr_adapter import (
    Buffer,
    BufferPrototype,
    async_array,
    buffer_prototype,
    codec_pipeline,
    is_zarr_pipeline,
    nd_buffer,
    sync,
)

__all__ = [
    "DEFAULT_POLICY",
    "DEFAULT_RETRIES",
    "NO_REPORT",
    "CancelScope",
    "Ledger",
    "MissingMode",
    "OnError",
    "PolicyStore",
    "ReadPolicy",
    "ReadReport",
    "RequestLimit",
    "absent_keys",
    "is_program_error",
    "is_transient",
    "native_view",
    "policy_view",
    "program_error",
    "read_array",
    "read_into",
]

MissingMode = Literal["warn", "fill", "error"]
OnError = Literal["raise", "skip"]

#: Retries of one read after a transient fault (so up to 4 attempts).
DEFAULT_RETRIES = 3
#: First backoff before a retry; it doubles each attempt, with jitter, up to the cap.
RETRY_BASE_SECONDS = 0.05
RETRY_MAX_SECONDS = 2.0


class RequestLimit:
    """At most ``n`` store requests in flight among the reads that share this object.

    A stream makes one and puts it in its :class:`ReadPolicy` (``requests``);
    every :class:`PolicyStore` built with that policy waits on it around each
    ``get`` (decoding is not counted: Zarr decodes on its own executor).
    Locally the read tasks of a stream share the policy object, so the limit
    is the stream's.  Pickled (to a cluster's workers) it travels as its
    number and is rebuilt empty: there each read task has its own limit.

    It also clocks the requests it lets through (what ``stats.bottleneck()``
    reads): ``requests``, ``request_seconds`` (summed over requests),
    ``busy_seconds`` (wall seconds with at least one in flight) and
    ``queued_seconds`` (summed waits for a free slot).
    """

    def __init__(self, n: int | None) -> None:
        self.n = n  # None: no limit, the requests only clocked
        self._semaphore: asyncio.Semaphore | None = None
        self.requests = 0
        self.request_seconds = self.busy_seconds = self.queued_seconds = 0.0
        self._active = 0
        self._busy_since = 0.0
        self.changes = 0  # begins and ends so far: a reader of the clock skips an unchanged one

    @property
    def active(self) -> int:
        """Requests in flight now."""
        return self._active

    def begin(self, asked: float) -> float:
        """Count a request let through after waiting since ``asked``; its start time."""
        now = time.perf_counter()
        self.queued_seconds += now - asked
        if self._active == 0:
            self._busy_since = now
        self._active += 1
        self.changes += 1
        return now

    def end(self, started: float) -> None:
        """Count the end of a request that :meth:`begin` let through at ``started``."""
        now = time.perf_counter()
        self.requests += 1
        self.request_seconds += now - started
        self._active -= 1
        self.changes += 1
        if self._active == 0:
            self.busy_seconds += now - self._busy_since

    def busy_now(self) -> float:
        """``busy_seconds``, the time of the requests now in flight included."""
        active = time.perf_counter() - self._busy_since if self._active else 0.0
        return self.busy_seconds + active

    def __reduce__(self) -> tuple[Any, ...]:
        return (RequestLimit, (self.n,))

    def __dask_tokenize__(self) -> object:
        return ("RequestLimit", self.n)

    def __repr__(self) -> str:
        return f"RequestLimit({self.n})"

    async def __aenter__(self) -> None:
        if self.n is None:
            return
        if self._semaphore is None:  # made on Zarr's event loop, where every read waits
            self._semaphore = asyncio.Semaphore(self.n)
        await self._semaphore.acquire()

    async def __aexit__(self, *exc: object) -> None:
        if self.n is None:
            return
        assert self._semaphore is not None
        self._semaphore.release()


class CancelScope(Protocol):
    """What a read needs from the cancellation scope it runs in.

    Implemented by :class:`~daskzarr_batches.execute.cancel.Cancellation`;
    defined here so that the store and read layers can take one without
    importing the execution layer.
    """

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run ``coro`` on Zarr's event loop and wait for it, unless cancelled."""
        ...


@dataclass(frozen=True)
class ReadPolicy:
    """What a read does about missing chunks, undecodable chunks and transient faults.

    Parameters
    ----------
    missing : {"fill", "warn", "error"}, default "fill"
        A chunk the store does not hold: filled with the fill value as the
        Zarr spec says (``"fill"``: Zarr leaves chunks of only the fill value
        unwritten by default; counted in the stream's stats), the same with
        one warning per stream (``"warn"``), or :class:`MissingChunkError`
        (``"error"``).  Not an
        array that is gone (its metadata absent too): that is
        :class:`StoreGoneError` whatever ``missing`` says.
    on_error : {"raise", "skip"}, default "raise"
        A chunk whose bytes do not decode: :class:`CorruptChunkError`
        (``"raise"``), or its samples leave the epoch with a warning
        (``"skip"``).
    retries : int, default 3
        Retries of one read after a transient fault, with exponential backoff
        and jitter; not-found, permission and decoding errors are never
        retried.
    requests : RequestLimit, optional
        Store requests the reads sharing this policy keep in flight at most
        (a stream's ``io_concurrency``, see :meth:`limited`); ``None``: no
        limit beyond Zarr's own.
    cache : ChunkCache, optional
        Decoded chunks served from (and kept in) this cache: reads through
        :func:`policy_view` use a :class:`CachingPipeline`.
    readers : ReaderHook, optional
        The user's reader factory (``ReadOptions(reader=...)``) and the key
        its readers are remembered under (``store.reader_hook``); a fresh
        key per stream (:meth:`limited`).
    """

    missing: MissingMode = "fill"
    on_error: OnError = "raise"
    retries: int = DEFAULT_RETRIES
    requests: RequestLimit | None = field(default=None, compare=False)
    cache: ChunkCache | None = field(default=None, compare=False)
    cache_tokens: tuple[tuple[str, str], ...] = field(default=(), compare=False)
    readers: Any = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.missing not in get_args(MissingMode):
            raise ArgumentValueError(
                f"missing must be one of {get_args(MissingMode)}, got {self.missing!r}"
            )
        if self.on_error not in get_args(OnError):
            raise ArgumentValueError(
                f"on_error must be one of {get_args(OnError)}, got {self.on_error!r}"
            )
        if isinstance(self.retries, bool) or not isinstance(self.retries, int):
            raise ArgumentTypeError(
                f"retries must be a non-negative integer, got {self.retries!r} of type "
                f"{type(self.retries).__name__}"
            )
        if self.retries < 0:
            raise ArgumentValueError(f"retries must be >= 0, got {self.retries}")

    def tokened(self, arrays: Iterable[Any]) -> ReadPolicy:
        """This policy with the cache tokens of ``arrays`` (Zarr arrays) looked up once.

        A stream calls it on the client, so a remote array's version (an
        ETag) is asked for once per stream, not once per read task.
        """
        if self.cache is None:
            return self
        tokens = tuple(
            (str(array.store_path), array_token(array))
            for array in arrays
            if isinstance(array, zarr.Array)
        )
        return dataclasses.replace(self, cache_tokens=tokens)

    def limited(self, requests: int | None) -> ReadPolicy:
        """This policy with a fresh :class:`RequestLimit` of ``requests`` (``None``: no limit).

        Called once per stream, so the stream's reads share one limit (and one
        clock of their requests, also without a limit), and the stream's
        reader factory remembers its readers under a key of its own.
        """
        readers = None if self.readers is None else self.readers.fresh()
        return dataclasses.replace(self, requests=RequestLimit(requests), readers=readers)


DEFAULT_POLICY = ReadPolicy()


@dataclass(frozen=True)
class ReadReport:
    """What the policy saw in one read task; travels back with the task's data.

    Attributes
    ----------
    missing_keys : tuple of str
        Store keys that were absent (read as the fill value).
    missing_chunks : tuple of int
        Axis-0 chunks (of the array's chunk grid) with at least one absent key.
    retries : int
        Reads retried after a transient fault.
    skipped : tuple of (chunk, start, stop)
        Axis-0 chunks left out because they do not decode (``on_error="skip"``),
        with the samples they hold (patch streams: a chunk's block index and a
        run of patch ids it took out; a chunk may have several runs).
    cache : CacheCounts, optional
        What the task's lookups in the stream's :class:`ChunkCache` found.
    decoded : tuple of (chunk, bytes), optional
        The stored chunks decoded (block index) and their decoded bytes, when
        the task lists them itself (patch streams); ``None``: the stream
        counts its pieces.
    """

    missing_keys: tuple[str, ...] = ()
    missing_chunks: tuple[Any, ...] = ()
    retries: int = 0
    skipped: tuple[tuple[Any, int, int], ...] = ()
    decoded: tuple[tuple[Any, int], ...] | None = None
    cache: CacheCounts | None = None


NO_REPORT = ReadReport()


@dataclass
class Ledger:
    """What happened during one read task (returned beside its data).

    Attributes
    ----------
    missing : list of str
        Chunk keys the store did not hold, in the order they were asked for.
    retries : int
        Reads retried after a transient fault.
    failed : dict of str to BaseException
        Keys whose read failed for good (after the retries), with the error.
    cache : CacheCounts
        What the lookups in a :class:`ChunkCache` found (a policy with a cache).
    gone : str or None
        Set when the array's metadata was looked up (once per task, at the
        first absent chunk key): ``""`` if it is there, else the message of
        the :class:`StoreGoneError` every absent key then raises.
    """

    missing: list[str] = field(default_factory=list)
    retries: int = 0
    failed: dict[str, Exception] = field(default_factory=dict)
    cache: CacheCounts = field(default_factory=CacheCounts)
    gone: str | None = None
    _looking: asyncio.Lock | None = field(default=None, repr=False)

    def check_gone(self) -> None:
        """Raise :class:`StoreGoneError` if the lookup found the array gone."""
        if self.gone:
            raise StoreGoneError(self.gone)


class PolicyStore(zarr.storage.WrapperStore[Any]):
    """A store that applies a :class:`ReadPolicy` to every ``get`` and records it.

    ``metadata``: the store key of the array's metadata document; when a
    chunk key comes back absent it is looked up (once per ledger) and, if it
    is gone too, every absent key raises :class:`StoreGoneError`.
    """

    def __init__(
        self, store: Any, policy: ReadPolicy, ledger: Ledger, name: str, metadata: str | None = None
    ) -> None:
        super().__init__(store)
        self.base = store  # the store wrapped (zarr keeps it in a private field)
        self.policy = policy
        self.ledger = ledger
        self.name = name
        self.metadata = metadata

    def _with_store(self, store: Any) -> PolicyStore:
        return type(self)(store, self.policy, self.ledger, self.name, self.metadata)

    async def get(
        self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        result: Buffer | None = await self.get_with(key, self.base.get, prototype, byte_range)
        return result

    async def get_with(self, key: str, fetch: Callable[..., Any], *args: Any) -> Any:
        """``await fetch(key, *args)`` as a get of ``key`` under the policy.

        The wrapped store's ``get`` (:meth:`get`), or a read of the same object
        of one's own (``store.direct``: a local chunk file read into a reused
        buffer): the request limit, the retries and an absent key (``None``)
        are handled as for any get.
        """
        limit = self.policy.requests
        if limit is None:
            result = await self._retrying(key, fetch, key, *args)
        else:
            asked = time.perf_counter()
            async with limit:  # the stream's io_concurrency: requests, not decodes
                started = limit.begin(asked)
                try:
                    result = await self._retrying(key, fetch, key, *args)
                finally:
                    limit.end(started)
        if result is None and not is_metadata_key(key):
            await self._check_gone()
            self.ledger.missing.append(key)
            if self.policy.missing == "error":
                raise missing_error(key, self.name)
        return result

    async def _check_gone(self) -> None:
        """Raise :class:`StoreGoneError` if the array's metadata is gone (looked up once)."""
        ledger = self.ledger
        if ledger.gone is None and self.metadata is not None:
            if ledger._looking is None:
                ledger._looking = asyncio.Lock()
            async with ledger._looking:  # the task's other absent chunks wait for the answer
                if ledger.gone is None:
                    found = await self._retrying(
                        self.metadata, self.base.get, self.metadata, buffer_prototype()
                    )
                    ledger.gone = (
                        ""
                        if found is not None
                        else gone_message(self.base, self.metadata, self.name)
                    )
        ledger.check_gone()

    async def get_partial_values(
        self, prototype: BufferPrototype, key_ranges: Any
    ) -> list[Buffer | None]:
        ranges = list(key_ranges)
        label = ranges[0][0] if ranges else "<no key>"
        limit = self.policy.requests
        if limit is None:
            values: list[Buffer | None] = await self._retrying(
                label, self.base.get_partial_values, prototype, ranges
            )
        else:
            asked = time.perf_counter()
            async with limit:
                started = limit.begin(asked)
                try:
                    values = await self._retrying(
                        label, self.base.get_partial_values, prototype, ranges
                    )
                finally:
                    limit.end(started)
        return values

    async def _retrying(self, key: str, call: Any, *args: Any) -> Any:
        attempt = 0
        while True:
            try:
                return await call(*args)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if attempt >= self.policy.retries or not is_transient(exc):
                    self.ledger.failed.setdefault(key, exc)
                    raise
                self.ledger.retries += 1
                delay = min(RETRY_MAX_SECONDS, RETRY_BASE_SECONDS * 2**attempt)
                await asyncio.sleep(delay * random.uniform(0.5, 1.0))
                attempt += 1


def read_array(array: Any, selection: tuple[slice, ...], scope: CancelScope | None) -> Any:
    """``array[selection]``; for a Zarr array with a scope, cancellable."""
    if scope is not None and isinstance(array, zarr.Array):
        return scope.run(async_array(array).getitem(selection))
    return array[selection]


def read_into(
    array: Any, selection: tuple[slice, ...], out: Any, scope: CancelScope | None
) -> None:
    """``out[...] = array[selection]`` for a Zarr array, decoded straight into ``out``.

    Zarr's ``out=``: no array of Zarr's own (fresh pages to fault in) and no
    copy; with a scope, cancellable.
    """
    coro = async_array(array).get_orthogonal_selection(selection, out=nd_buffer(out))
    if scope is not None:
        scope.run(coro)
        return
    sync(coro)


def gone_message(store: Any, metadata: str, name: str) -> str:
    """What :class:`StoreGoneError` says: the store, the array, what is gone."""
    if type(store) is zarr.storage.LocalStore and not os.path.isdir(os.fspath(store.root)):
        what = f"the store's directory {os.fspath(store.root)!r} no longer exists"
    else:
        what = f"its metadata {metadata!r} is no longer in the store {store}"
    return (
        f"array {name} is gone: {what} (deleted or moved while it was read?); its chunks "
        "would all read as the fill value, so this is an error whatever missing= says"
    )


def missing_error(key: str, name: str) -> MissingChunkError:
    """The error for chunk ``key`` of array ``name`` missing under ``missing="error"``."""
    return MissingChunkError(
        f"chunk {key!r} of array {name} is missing from the store "
        "(pass missing='fill' or 'warn' to read it as the fill value)"
    )


def policy_view(array: Any, name: str, policy: ReadPolicy, ledger: Ledger) -> Any:
    """``array`` read through a :class:`PolicyStore` (a Zarr array), else as is.

    No I/O: the view reuses the array's metadata and codec pipeline, except
    that a zarrs pipeline is replaced by zarr-python's (zarrs reads no
    wrapper store natively: its reads would bypass the policy store).
    """
    if not isinstance(array, zarr.Array):
        return array
    zarr_loop()  # Zarr's blocking I/O on daemon threads, before any read of a task
    store = PolicyStore(array.store_path.store, policy, ledger, name, metadata_key(array))
    zarrs = is_zarrs_pipeline(codec_pipeline(array))
    pipeline = zarr_pipeline(array.metadata) if zarrs else None
    if policy.cache is not None:  # chunks the cache holds are neither fetched nor decoded
        base = pipeline if pipeline is not None else codec_pipeline(array)
        if is_zarr_pipeline(base):
            token = dict(policy.cache_tokens).get(str(array.store_path)) or array_token(array)
            pipeline = CachingPipeline.of(base, policy.cache, token, ledger.cache)
    return array_view(
        array,
        store_path=zarr.storage.StorePath(store, array.store_path.path),
        codec_pipeline=pipeline,
    )


def native_view(
    array: Any,
    name: str,
    policy: ReadPolicy,
    ledger: Ledger,
    keys: Callable[[], list[str]],
    scope: CancelScope | None = None,
) -> Any:
    """``array`` itself when zarrs reads its store natively, else None.

    Such reads bypass the :class:`PolicyStore`, so the policy's missing-chunk
    rule is applied here first: ``keys()`` (the store keys the read will
    touch) are looked up with :func:`absent_keys`; absent ones are recorded in
    ``ledger`` (zarrs fills them as zarr does), or raise
    :class:`MissingChunkError` for ``missing="error"``.  If some are absent,
    the array's metadata is looked up too (once per ledger): if it is gone,
    :class:`StoreGoneError`, whatever ``missing`` says.  A native read that
    fails is read again by the caller through :func:`policy_view`, which
    retries transient faults and names (or skips) the chunk that fails.
    """
    if not isinstance(array, zarr.Array) or codec_pipeline_of(array) != "zarrs":
        return None
    if policy.cache is not None:  # a cache is consulted by zarr-python's pipeline only
        return None
    wanted = list(dict.fromkeys(keys()))
    store = array.store_path.store
    absent = absent_keys(store, wanted, scope)
    meta = metadata_key(array)
    if absent and ledger.gone is None and meta is not None:
        there = not absent_keys(store, [meta], scope)
        ledger.gone = "" if there else gone_message(store, meta, name)
    ledger.check_gone()
    ledger.missing.extend(absent)
    if absent and policy.missing == "error":
        raise missing_error(absent[0], name)
    return array


def absent_keys(store: Any, keys: list[str], scope: CancelScope | None = None) -> list[str]:
    """The ``keys`` that ``store`` does not hold, in order.

    A local directory store is asked with one ``stat`` per key on this
    thread (cheap beside the read: docs/reading.md, *Inside*),
    any other with ``store.exists`` on Zarr's event loop, all at once.
    """
    if not keys:
        return []
    if type(store) is zarr.storage.LocalStore:
        root = os.fspath(store.root)
        return [key for key in keys if not os.path.isfile(os.path.join(root, key))]

    async def found() -> list[bool]:
        return list(await asyncio.gather(*(store.exists(key) for key in keys)))

    exists = scope.run(found()) if scope is not None else sync(found())
    return [key for key, there in zip(keys, exists, strict=True) if not there]
