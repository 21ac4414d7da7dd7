"""Which reader reads an array: the library's, a user's from ``ReadOptions(reader=...)``, the cache.

A read task asks :func:`reader_of` for the :class:`~.requests.ChunkReader`
of its array and has it read the task's requests (``store.requests``).  That
reader is, from the top:

1. :class:`CachedReader`, with a cache: the chunks the cache holds copied
   from it (nothing decoded, the readers below asked nothing), the others
   asked of
2. the user's reader, ``factory(array, default)`` (:class:`ReaderHook`:
   called once per array per stream in each process, remembered here), or
   when there is no factory
3. :class:`LibraryReader` (the ``default``): the read its task planned
   (:func:`planned`: a window's pieces by the array's ``store.readers``
   engine, one slice, the direct zstd decode, the shard reader...) when
   asked for exactly the task's requests, else each request read through
   Zarr (``requests.read_each``).
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import dataclasses
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import zarr

from ..errors import ArgumentTypeError, ArgumentValueError, ChunkReadError, DaskZarrBatchesError
from .requests import ChunkReader, ChunkRequest, ReaderFactory, chunks_of, read_each
from .zarr_adapter import sync

__all__ = [
    "CachedReader",
    "LibraryReader",
    "Planned",
    "ReaderHook",
    "planned",
    "raise_users_failure",
    "reader_of",
    "users_failure",
]


@dataclasses.dataclass(eq=False)
class Planned:
    """The read a task planned for ``requests``: ``run()`` does it, by the array's engine.

    ``view``: the array as the task reads it (its policy view); ``loop``
    runs coroutines on Zarr's loop (a stream's cancellation scope, else
    ``sync``); ``narrow(some)``: the task's read of some of its requests
    only, planned the same way (a cache that holds the others); ``ran``:
    whether ``run`` was called (the task's own read), ``result``: what it
    returned; ``library_failed``: whether the library's reader raised (its
    planned read, or its read of other requests), so that a failure above
    it is a user's reader's own (:func:`users_failure`); ``served``: a dict
    the task passes to learn which requests a ``ChunkCache`` served (chunk ->
    the cache's decoded chunk, never to be written), ``None``: not recorded.
    """

    requests: Sequence[ChunkRequest]
    run: Callable[[], Any]
    view: Any
    loop: Callable[[Any], Any] = sync
    limit: int | None = None
    counts: Any = None
    narrow: Callable[[Sequence[ChunkRequest]], Callable[[], Any]] | None = None
    ran: bool = False
    result: Any = None
    library_failed: bool = False
    served: dict[tuple[int, ...], Any] | None = None

    def matches(self, requests: Sequence[ChunkRequest]) -> bool:
        """Whether ``requests`` are this plan's, the same objects in the same order."""
        mine = self.requests
        if requests is mine:
            return True
        if len(requests) != len(mine):
            return False
        return all(a is b for a, b in zip(requests, mine, strict=True))


_PLANNED: contextvars.ContextVar[Planned | None] = contextvars.ContextVar(
    "daskzarr_batches_planned", default=None
)


@contextlib.contextmanager
def planned(plan: Planned) -> Iterator[Planned]:
    """The task's planned read, for the library's reader to run while the block runs."""
    token = _PLANNED.set(plan)
    try:
        yield plan
    finally:
        _PLANNED.reset(token)


class LibraryReader:
    """The library's reader of one array: the reader a factory gets as ``default``.

    Asked for exactly the requests its task planned, it runs the task's
    planned read (the fastest way this library knows for that array and
    window); asked for any other list (a wrapper that served some requests
    itself), it reads each request's part of its chunk through the task's
    view of the array (its read policy: missing chunks, retries), or the
    array itself outside a task.
    """

    def __init__(self, array: Any) -> None:
        self.array = array

    def read(self, requests: Sequence[ChunkRequest]) -> None:
        """See :meth:`~daskzarr_batches.readers.ChunkReader.read`."""
        plan = _PLANNED.get()
        try:
            if plan is not None and not plan.ran and plan.matches(requests):
                plan.ran = True
                plan.result = plan.run()
                return
            if plan is not None:
                read_each(plan.view, requests, plan.loop, plan.limit)
            else:
                read_each(self.array, requests)
        except BaseException:
            if plan is not None:
                plan.library_failed = True
            raise

    def __repr__(self) -> str:
        return f"LibraryReader({_describe(self.array)})"


def _describe(array: Any) -> str:
    if isinstance(array, zarr.Array):
        return f"zarr array {str(array.store_path)!r}"
    return f"{type(array).__name__} of shape {getattr(array, 'shape', '?')}"


def _array_key(array: Any) -> Any:
    """What names ``array`` in a process across its copies (a worker unpickles one per task)."""
    if isinstance(array, zarr.Array):
        return ("zarr", str(array.store_path))
    name = getattr(array, "name", None)
    if isinstance(name, str) and hasattr(array, "dask"):
        return ("dask", name)
    return ("object", id(array))


#: The readers factories made in this process: (stream's hook key, array key) -> reader.
_MADE: collections.OrderedDict[tuple[str, Any], tuple[Any, ChunkReader]] = collections.OrderedDict()
_MADE_LOCK = threading.Lock()
_MOST_MADE = 4096  # the oldest streams' readers forgotten beyond that many


@dataclasses.dataclass(frozen=True)
class ReaderHook:
    """A stream's reader factory, and the key its readers are remembered under.

    Made fresh per stream (``ReadPolicy.limited``), pickled with the policy
    to the workers; ``factory(array, default)`` is called the first time an
    array is read in a process for this stream, and its reader used for
    every later read of that array there.
    """

    factory: ReaderFactory
    key: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex)

    def fresh(self) -> ReaderHook:
        """The same factory under a new key (another stream)."""
        return ReaderHook(self.factory)

    def reader(self, array: Any, default: ChunkReader) -> ChunkReader:
        """The factory's reader of ``array`` for this stream, made once per process."""
        key = (self.key, _array_key(array))
        with _MADE_LOCK:
            found = _MADE.get(key)
            if found is not None and (found[0] is array or key[1][0] != "object"):
                _MADE.move_to_end(key)
                return found[1]
        try:
            made = self.factory(array, default)
        except DaskZarrBatchesError:
            raise
        except Exception as exc:
            raise ArgumentValueError(
                f"reader factory {self.factory!r} raised {type(exc).__name__}: {exc} "
                f"for {_describe(array)}"
            ) from exc
        if not callable(getattr(made, "read", None)):
            raise ArgumentTypeError(
                f"reader factory {self.factory!r} returned {made!r} of type "
                f"{type(made).__name__} for {_describe(array)}: a ChunkReader has a "
                "read(requests) method"
            )
        with _MADE_LOCK:
            found = _MADE.get(key)
            if found is not None and (found[0] is array or key[1][0] != "object"):
                return found[1]  # another thread made it first: one reader per array
            _MADE[key] = (array, made)
            while len(_MADE) > _MOST_MADE:
                _MADE.popitem(last=False)
        return made


class CachedReader:
    """A cache above a reader: chunks the cache holds copied from it, the others asked of ``inner``.

    A hit decodes nothing and ``inner`` sees nothing; the misses are asked
    of ``inner`` (all of a task's requests when none is held, so its
    planned read runs), and kept in the cache by the read beneath (Zarr's
    caching pipeline, the shard reader; a sharded array's inner chunk is
    also cut from its shard kept whole, as Zarr's pipeline keeps it).  The
    hits are counted in the task's cache counts (``Planned.counts``).
    """

    def __init__(self, inner: ChunkReader, array: zarr.Array, cache: Any, token: str) -> None:
        self.inner, self.array, self.cache, self.token = inner, array, cache, token

    def read(self, requests: Sequence[ChunkRequest]) -> None:
        """See :meth:`~daskzarr_batches.readers.ChunkReader.read`."""
        from .cache import CacheCounts

        plan = _PLANNED.get()
        counts = None if plan is None else plan.counts
        looked = CacheCounts()  # damaged entries: the lookup beneath a miss may count them too
        held: dict[tuple[int, ...], np.ndarray | None] = {}
        misses = []
        for request in requests:
            if request.chunk not in held:
                held[request.chunk] = self._held(request.chunk, looked)
            data = held[request.chunk]
            if data is None:
                misses.append(request)
                continue
            request.fill(data)
            if plan is not None and plan.served is not None:
                plan.served[request.chunk] = data
        before = 0 if counts is None else counts.damaged
        if len(misses) == len(requests):
            self.inner.read(requests)
        elif misses and plan is not None and plan.narrow is not None and plan.matches(requests):
            fewer = dataclasses.replace(plan, requests=misses, run=plan.narrow(misses), narrow=None)
            try:
                with planned(fewer):
                    self.inner.read(misses)
            finally:
                plan.library_failed = plan.library_failed or fewer.library_failed
        elif misses:
            self.inner.read(misses)
        if counts is not None:
            counts.damaged = before + max(looked.damaged, counts.damaged - before)
            for data in held.values():
                if data is not None:
                    counts.hits += 1
                    counts.bytes_hit += data.nbytes

    def _held(self, chunk: tuple[int, ...], counts: Any) -> np.ndarray | None:
        """The decoded chunk ``chunk`` if the cache holds it (inner: alone, or in its shard)."""
        from .cache_keys import chunk_name
        from .layout import chunks_per_shard

        array, cache = self.array, self.cache
        found = cache.get(cache.key(self.token, chunk_name(array, chunk)), counts)
        if found is not None or array.shards is None:
            return found
        shard = cache.get(cache.key(self.token, chunk_name(array, chunk, True)), counts)
        if shard is None:
            return None
        per = chunks_per_shard(array)
        inner = tuple(
            slice((c % n) * size, (c % n) * size + size)
            for c, n, size in zip(chunk, per, array.chunks, strict=True)
        )
        return shard[inner]

    def __repr__(self) -> str:
        return f"CachedReader({self.inner!r})"


def users_failure(
    plan: Planned, reader: ChunkReader, name: str, exc: BaseException
) -> BaseException | None:
    """The error to raise for ``exc``, raised by ``reader`` of array ``name`` reading ``plan``.

    ``None`` when the library's own reader failed (its planned read, or its
    read of requests a wrapper passed on), which the task reads again so that
    the error names the chunk (or skips it); else a user's reader failed by
    itself, and reading around it would hide that: a ``ChunkReadError``
    naming the reader, the array and the chunks asked for (``exc`` itself
    when it is one).
    """
    inner = reader.inner if isinstance(reader, CachedReader) else reader
    if plan.ran or plan.library_failed or isinstance(inner, LibraryReader):
        return None
    if isinstance(exc, ChunkReadError):
        return exc
    chunks = list(chunks_of(plan.requests))
    shown = ", ".join(map(str, chunks[:8])) + (
        f" and {len(chunks) - 8} more" if len(chunks) > 8 else ""
    )
    return ChunkReadError(
        f"reader {inner!r} of array {name} failed reading chunks {shown}: "
        f"{type(exc).__name__}: {exc}"
    )


def raise_users_failure(plan: Planned, reader: ChunkReader, name: str, exc: BaseException) -> None:
    """Raise ``exc`` as :func:`users_failure` names it if a reader of the user's failed.

    Returns when the library's own reader failed: the task reads again, named.
    """
    failure = users_failure(plan, reader, name, exc)
    if failure is exc:
        raise exc
    if failure is not None:  # a reader of the user's failed: not read around
        raise failure from exc


def reader_of(array: Any, policy: Any) -> ChunkReader:
    """The reader a task asks for ``array``'s chunks under ``policy`` (see the module)."""
    default: ChunkReader = LibraryReader(array)
    hook = getattr(policy, "readers", None)
    reader = default if hook is None else hook.reader(array, default)
    cache = getattr(policy, "cache", None)
    if cache is None or not isinstance(array, zarr.Array):
        return reader
    token = dict(policy.cache_tokens).get(str(array.store_path))
    if token is None:
        from .cache_keys import array_token

        token = array_token(array)
    return CachedReader(reader, array, cache, token)
