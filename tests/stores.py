"""Real Zarr wrapper stores that observe, slow down or fail reads (no mocks).

:class:`CountingStore` counts ``get`` calls per chunk key, which proves how
often each stored chunk is fetched.  :class:`LatencyStore` (the benchmarks' own,
``benchmarks/latency_store.py``, one class for both) sleeps before every chunk
``get`` and records how many were in flight at once.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from typing import Any

import zarr
import zarr.storage
from zarr.abc.store import ByteRequest
from zarr.core.buffer import Buffer, BufferPrototype

from benchmarks.latency_store import LatencyStore, is_metadata_key

__all__ = [
    "CountingStore",
    "FaultStore",
    "HangStore",
    "LatencyStore",
    "NamedCountingStore",
    "chunk_keys",
    "is_chunk_key",
    "open_wrapped",
]


def is_chunk_key(key: str) -> bool:
    return not is_metadata_key(key)


class CountingStore(zarr.storage.WrapperStore[Any]):
    """Counts ``get`` calls per chunk key (metadata reads are not counted)."""

    def __init__(self, store: Any, counts: collections.Counter[str] | None = None) -> None:
        super().__init__(store)
        self.counts: collections.Counter[str] = collections.Counter() if counts is None else counts
        self._lock = threading.Lock()

    def _with_store(self, store: Any) -> CountingStore:
        return type(self)(store, self.counts)

    async def get(
        self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        if is_chunk_key(key):
            with self._lock:
                self.counts[key] += 1
        return await self._store.get(key, prototype, byte_range)


#: The counters of every :class:`NamedCountingStore` in this process, by name.
NAMED_COUNTS: dict[str, collections.Counter[str]] = {}
_NAMED_LOCK = threading.Lock()


class NamedCountingStore(zarr.storage.WrapperStore[Any]):
    """Counts chunk ``get`` calls in ``NAMED_COUNTS[name]``, wherever a copy of it reads.

    It pickles as its inner store and its name (deterministically, so dask
    can tokenize graphs holding it): copies sent to an in-process cluster's
    workers count in the same counter as the client's.
    """

    def __init__(self, store: Any, name: str) -> None:
        super().__init__(store)
        self.name = name
        with _NAMED_LOCK:
            self.counts = NAMED_COUNTS.setdefault(name, collections.Counter())

    def _with_store(self, store: Any) -> NamedCountingStore:
        return type(self)(store, self.name)

    def __reduce__(self) -> Any:
        return (type(self), (self._store, self.name))

    def __dask_tokenize__(self) -> Any:
        return (type(self).__name__, self.name, str(self._store))

    async def get(
        self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        if is_chunk_key(key):
            with _NAMED_LOCK:
                self.counts[key] += 1
        return await self._store.get(key, prototype, byte_range)


def named_counts(name: str) -> dict[str, int]:
    """``NAMED_COUNTS[name]`` in this process (run on each worker of a process cluster)."""
    with _NAMED_LOCK:
        return dict(NAMED_COUNTS.get(name, {}))


def chunk_keys(store: Any) -> set[str]:
    """Every stored chunk key of ``store`` (a memory or local store)."""

    async def collect() -> set[str]:
        return {key async for key in store.list() if is_chunk_key(key)}

    keys: set[str] = zarr.core.sync.sync(collect())
    return keys


def open_wrapped(wrapper: Any) -> zarr.Array:
    """Open the single array at the root of ``wrapper`` read-only."""
    return zarr.open_array(store=wrapper, mode="r")


class FaultStore(zarr.storage.WrapperStore[Any]):
    """Fails chunk ``get`` calls as told: ``faults[key] = [exception, ...]``.

    Each ``get`` of ``key`` pops the next exception and raises it; once the
    list is empty the key reads normally.  ``attempts`` counts every chunk
    ``get`` per key.
    """

    def __init__(
        self,
        store: Any,
        faults: dict[str, list[BaseException]] | None = None,
        attempts: collections.Counter[str] | None = None,
    ) -> None:
        super().__init__(store)
        self.faults = {} if faults is None else faults
        self.attempts: collections.Counter[str] = (
            collections.Counter() if attempts is None else attempts
        )
        self._lock = threading.Lock()

    def _with_store(self, store: Any) -> FaultStore:
        return type(self)(store, self.faults, self.attempts)

    async def get(
        self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        if is_chunk_key(key):
            with self._lock:
                self.attempts[key] += 1
                pending = self.faults.get(key)
                error = pending.pop(0) if pending else None
            if error is not None:
                await asyncio.sleep(0)
                raise error
        return await self._store.get(key, prototype, byte_range)


class HangStore(zarr.storage.WrapperStore[Any]):
    """Chunk ``get`` calls never answer (a store that hangs); they can only be cancelled.

    ``state`` counts the gets asked for (``gets``), in flight (``now``) and
    cancelled (``cancelled``).
    """

    def __init__(self, store: Any, state: dict[str, int] | None = None) -> None:
        super().__init__(store)
        self.state = {"gets": 0, "now": 0, "cancelled": 0} if state is None else state

    def _with_store(self, store: Any) -> HangStore:
        return type(self)(store, self.state)

    async def get(
        self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        if not is_chunk_key(key):
            return await self._store.get(key, prototype, byte_range)
        self.state["gets"] += 1
        self.state["now"] += 1
        try:
            await asyncio.Event().wait()  # never set
        except asyncio.CancelledError:
            self.state["cancelled"] += 1
            raise
        finally:
            self.state["now"] -= 1
        return None  # pragma: no cover
