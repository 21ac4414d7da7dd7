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
fill value exactly as Zarr does (``missing="warn"`` or ``"fill"``), or is an
error (``"error"``).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextvars
import errno
import os
import random
import threading
import weakref
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import zarr
import zarr.storage
from zarr.abc.store import ByteRequest
from zarr.core.buffer import Buffer, BufferPrototype, default_buffer_prototype

from ..errors import (
    ArgumentTypeError,
    ArgumentValueError,
    MissingChunkError,
    ReadCancelledError,
    StoreGoneError,
)
from .layout import is_metadata_key, metadata_key
from .pipelines import array_view, codec_pipeline_of, is_zarrs_pipeline, zarr_pipeline
from .threads import drain, zarr_loop

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
    "absent_keys",
    "is_transient",
    "native_view",
    "policy_view",
    "read_array",
]

MissingMode = Literal["warn", "fill", "error"]
OnError = Literal["raise", "skip"]

#: Retries of one read after a transient fault (so up to 4 attempts).
DEFAULT_RETRIES = 3
#: First backoff before a retry; it doubles each attempt, with jitter, up to the cap.
RETRY_BASE_SECONDS = 0.05
RETRY_MAX_SECONDS = 2.0

#: The store requests in flight allowed to the read running in this context (set by
#: :meth:`CancelScope.run` for the coroutines of one stream; ``None``: no stream-wide limit).
_REQUESTS: contextvars.ContextVar[asyncio.Semaphore | None] = contextvars.ContextVar(
    "dzb_requests", default=None
)


@dataclass(frozen=True)
class ReadPolicy:
    """What a read does about missing chunks, undecodable chunks and transient faults.

    Parameters
    ----------
    missing : {"warn", "fill", "error"}, default "warn"
        A chunk the store does not hold: filled with the fill value as Zarr
        does, with one warning per stream (``"warn"``) or silently
        (``"fill"``, for arrays that leave empty chunks unwritten on
        purpose), or :class:`MissingChunkError` (``"error"``).  Not an
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
    """

    missing: MissingMode = "warn"
    on_error: OnError = "raise"
    retries: int = DEFAULT_RETRIES

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
        with the samples they hold.
    """

    missing_keys: tuple[str, ...] = ()
    missing_chunks: tuple[int, ...] = ()
    retries: int = 0
    skipped: tuple[tuple[int, int, int], ...] = ()


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
    gone : str or None
        Set when the array's metadata was looked up (once per task, at the
        first absent chunk key): ``""`` if it is there, else the message of
        the :class:`StoreGoneError` every absent key then raises.
    """

    missing: list[str] = field(default_factory=list)
    retries: int = 0
    failed: dict[str, Exception] = field(default_factory=dict)
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
        self.policy = policy
        self.ledger = ledger
        self.name = name
        self.metadata = metadata

    def _with_store(self, store: Any) -> PolicyStore:
        return type(self)(store, self.policy, self.ledger, self.name, self.metadata)

    async def get(
        self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        limit = _REQUESTS.get()
        if limit is None:
            result = await self._retrying(key, self._store.get, key, prototype, byte_range)
        else:
            async with limit:  # the stream's io_concurrency: requests, not decodes
                result = await self._retrying(key, self._store.get, key, prototype, byte_range)
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
                        self.metadata, self._store.get, self.metadata, default_buffer_prototype()
                    )
                    ledger.gone = (
                        ""
                        if found is not None
                        else gone_message(self._store, self.metadata, self.name)
                    )
        ledger.check_gone()

    async def get_partial_values(
        self, prototype: BufferPrototype, key_ranges: Any
    ) -> list[Buffer | None]:
        ranges = list(key_ranges)
        label = ranges[0][0] if ranges else "<no key>"
        limit = _REQUESTS.get()
        if limit is None:
            values: list[Buffer | None] = await self._retrying(
                label, self._store.get_partial_values, prototype, ranges
            )
        else:
            async with limit:
                values = await self._retrying(
                    label, self._store.get_partial_values, prototype, ranges
                )
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


class CancelScope:
    """The reads in flight of one stream in this process, cancelled together.

    Read tasks run their Zarr coroutines through :meth:`run` instead of
    Zarr's blocking ``sync``; :meth:`cancel` (when the stream closes, times
    out or is dropped) cancels every one of them on Zarr's event loop, so a
    store that never answers holds no read thread, and every read asked for
    afterwards fails at once instead of being issued.  A read blocked in the
    operating system keeps the executor thread it runs on, a daemon that the
    executor abandons (:mod:`.threads`): it holds neither the process at
    exit nor later reads.

    ``requests``: store requests (``get`` calls through a :class:`PolicyStore`)
    the reads run through this scope keep in flight at most, together (the
    stream's ``io_concurrency``); ``None``: no limit beyond Zarr's own.
    Decoding is not counted: Zarr decodes on its own executor.  ``cpu``
    bounds the chunk transforms (``map_chunks``) running at once to the CPU
    count, however many reads are in flight.
    """

    def __init__(self, requests: int | None = None) -> None:
        self._lock = threading.Lock()
        self._futures: set[concurrent.futures.Future[Any]] = set()
        self.cancelled = False
        self.requests = requests
        self._limit = None if requests is None else asyncio.Semaphore(requests)
        self.cpu = threading.BoundedSemaphore(os.cpu_count() or 1)
        _SCOPES.add(self)

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run ``coro`` on Zarr's event loop and wait for it, unless cancelled."""
        with self._lock:
            if self.cancelled:
                coro.close()
                raise ReadCancelledError("the stream was closed; no read is issued any more")
            future = asyncio.run_coroutine_threadsafe(self._limited(coro), zarr_loop())
            self._futures.add(future)
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            raise ReadCancelledError(
                "the stream was closed while this read was in flight"
            ) from None
        finally:
            with self._lock:
                self._futures.discard(future)

    async def _limited(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run ``coro`` with this scope's request limit (tasks it starts inherit it)."""
        task = asyncio.current_task()
        if task is not None:
            task.add_done_callback(_retrieved)
        _REQUESTS.set(self._limit)  # this task's own context: nothing to reset
        return await coro

    def cancel(self) -> None:
        """Cancel every read in flight, and refuse the ones asked for later."""
        with self._lock:
            self.cancelled = True
            futures = list(self._futures)
        for future in futures:
            future.cancel()


def _retrieved(task: asyncio.Task[Any]) -> None:
    """Mark a read's error as seen: :meth:`CancelScope.cancel` may have stopped the wait.

    A read that fails as it is cancelled (a task group whose reads raised
    while being cancelled ends with their errors, or one that failed just
    before) has nobody left to take its error, and asyncio would print
    "Task exception was never retrieved" with a traceback when it is freed.
    """
    if not task.cancelled():
        task.exception()


#: Every live scope, cancelled together when the interpreter exits.
_SCOPES: weakref.WeakSet[CancelScope] = weakref.WeakSet()
#: Seconds the exit waits for the calls still running on the library's threads.
EXIT_DRAIN_SECONDS = 2.0


def _stop_at_exit() -> None:
    """At exit, cancel every stream's reads and let running calls end, before Zarr's loop closes.

    Registered after Zarr's own ``cleanup_resources`` (Zarr is imported
    first), so it runs before it: the cancellations reach a running loop
    (nothing is left pending for a closed one), and no daemon thread is
    still decoding when the interpreter is finalized.  A read blocked in the
    operating system is abandoned by the cancellation, so it is not waited for.
    """
    for scope in list(_SCOPES):
        scope.cancel()
    drain(EXIT_DRAIN_SECONDS)


atexit.register(_stop_at_exit)


def read_array(array: Any, selection: tuple[slice, ...], scope: CancelScope | None) -> Any:
    """``array[selection]``; for a Zarr array with a scope, cancellable."""
    if scope is not None and isinstance(array, zarr.Array):
        return scope.run(array._async_array.getitem(selection))
    return array[selection]


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
    from zarr.storage import StorePath

    zarr_loop()  # Zarr's blocking I/O on daemon threads, before any read of a task
    inner = array._async_array
    store = PolicyStore(inner.store_path.store, policy, ledger, name, metadata_key(array))
    zarrs = is_zarrs_pipeline(inner.codec_pipeline)
    return array_view(
        array,
        store_path=StorePath(store, inner.store_path.path),
        codec_pipeline=zarr_pipeline(inner.metadata) if zarrs else None,
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
    thread (cheap beside the read: docs/architecture.md, *Codec pipelines*),
    any other with ``store.exists`` on Zarr's event loop, all at once.
    """
    if not keys:
        return []
    if type(store) is zarr.storage.LocalStore:
        root = os.fspath(store.root)
        return [key for key in keys if not os.path.isfile(os.path.join(root, key))]

    async def found() -> list[bool]:
        return list(await asyncio.gather(*(store.exists(key) for key in keys)))

    if scope is not None:
        exists = scope.run(found())
    else:
        from zarr.core.sync import sync

        exists = sync(found())
    return [key for key, there in zip(keys, exists, strict=True) if not there]


def is_transient(exc: BaseException) -> bool:
    """Whether a read that raised ``exc`` may succeed if tried again.

    Walks the exception chain (causes, contexts, exception groups).  Never
    transient: not found, permission, and anything that is not an I/O fault
    (a decoding error).  Transient: connection errors, timeouts, resets, and
    HTTP 5xx / 429 / throttling answers as s3fs, aiohttp and botocore report
    them.
    """
    chain = list(_chain(exc))
    if any(_never(error) for error in chain):
        return False
    return any(_transient(error) for error in chain)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    todo = [exc]
    while todo:
        error = todo.pop()
        if id(error) in seen:
            continue
        seen.add(id(error))
        yield error
        todo.extend(e for e in (error.__cause__, error.__context__) if e is not None)
        if isinstance(error, BaseExceptionGroup):
            todo.extend(error.exceptions)


_TRANSIENT_NAMES = {
    "ClientConnectionError",
    "ClientConnectorError",
    "ClientOSError",
    "ClientPayloadError",
    "ConnectTimeoutError",
    "ConnectionClosedError",
    "EndpointConnectionError",
    "IncompleteReadError",
    "ReadTimeoutError",
    "ResponseStreamingError",
    "ServerDisconnectedError",
    "ServerTimeoutError",
}
_TRANSIENT_CODES = {
    "InternalError",
    "RequestLimitExceeded",
    "RequestTimeout",
    "ServiceUnavailable",
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "TooManyRequestsException",
}
_TRANSIENT_ERRNOS = {
    errno.ECONNRESET,
    errno.ECONNREFUSED,
    errno.ECONNABORTED,
    errno.ETIMEDOUT,
    errno.EPIPE,
    errno.EAGAIN,
    errno.EBUSY,
}


def _never(error: BaseException) -> bool:
    if isinstance(error, FileNotFoundError | PermissionError | IsADirectoryError):
        return True
    status = _status(error)
    return status is not None and status in (401, 403, 404)


def _transient(error: BaseException) -> bool:
    if isinstance(error, ConnectionError | TimeoutError):
        return True
    if type(error).__name__ in _TRANSIENT_NAMES:
        return True
    if isinstance(error, OSError) and error.errno in _TRANSIENT_ERRNOS:
        return True
    status = _status(error)
    if status is not None and (status >= 500 or status == 429):
        return True
    return _error_code(error) in _TRANSIENT_CODES


def _status(error: BaseException) -> int | None:
    for name in ("status", "status_code"):
        value = getattr(error, name, None)
        if isinstance(value, int):
            return value
    response = getattr(error, "response", None)
    if isinstance(response, dict):
        value = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if isinstance(value, int):
            return value
    return None


def _error_code(error: BaseException) -> str | None:
    response = getattr(error, "response", None)
    if isinstance(response, dict):
        code = response.get("Error", {}).get("Code")
        return code if isinstance(code, str) else None
    return None
