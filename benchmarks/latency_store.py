"""The one latency wrapper store, shared by the benchmarks and the tests.

:class:`LatencyStore` wraps a Zarr store and sleeps before each request, as an
object store answers after tens of milliseconds, and counts the requests and
how many were in flight at once.  The tests import it as
``from benchmarks.latency_store import LatencyStore`` (pytest runs from the
repository root; ``pythonpath`` in ``pyproject.toml``).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import zarr.storage
from zarr.abc.store import ByteRequest
from zarr.core.buffer import Buffer, BufferPrototype

__all__ = ["METADATA", "LatencyStore", "is_metadata_key"]

#: the names of Zarr metadata documents (v2 and v3)
METADATA = (".zarray", ".zattrs", ".zgroup", ".zmetadata", "zarr.json")


def is_metadata_key(key: str) -> bool:
    """Whether ``key`` names a metadata document rather than a chunk or shard."""
    return key.rsplit("/", 1)[-1].endswith(METADATA)


class LatencyStore(zarr.storage.WrapperStore[Any]):
    """Sleeps ``delay`` seconds (``asyncio.sleep``) before each request, then asks ``store``.

    Parameters
    ----------
    store : zarr store
        The wrapped store.
    delay : float
        Seconds before each request; ``delays[key]`` overrides it per key.
    state : dict, optional
        The counters, shared by the copies zarr makes of the store: ``requests``
        (made), ``now`` (in flight) and ``peak`` (most in flight at once; set it
        to ``now`` to measure a span).
    delays : dict, optional
        Per-key delays.
    metadata : bool, default False
        Whether metadata reads wait and count too (as on an object store).  By
        default only chunk (and shard) requests do.

    ``get`` (a whole key or a byte range) is one request; ``get_partial_values``
    makes one request per range, all in flight at once (so one delay).
    """

    def __init__(
        self,
        store: Any,
        delay: float = 0.05,
        state: dict[str, int] | None = None,
        *,
        delays: dict[str, float] | None = None,
        metadata: bool = False,
    ) -> None:
        super().__init__(store)
        self.delay = delay
        self.delays = {} if delays is None else delays
        self.metadata = metadata
        self.state = {"requests": 0, "now": 0, "peak": 0} if state is None else state
        self._lock = threading.Lock()

    def _with_store(self, store: Any) -> LatencyStore:
        return type(self)(store, self.delay, self.state, delays=self.delays, metadata=self.metadata)

    def __reduce__(self) -> Any:
        """A copy for another process (a cluster's worker): same delays, its own counters."""
        return (_rebuild, (self._store, self.delay, self.delays, self.metadata))

    def __dask_tokenize__(self) -> Any:
        return (type(self).__name__, str(self._store), self.delay, self.metadata)

    @property
    def requests(self) -> int:
        """Requests made so far."""
        return self.state["requests"]

    @property
    def peak(self) -> int:
        """The most requests in flight at once (since ``state["peak"]`` was last reset)."""
        return self.state["peak"]

    async def get(
        self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        if not self.metadata and is_metadata_key(key):
            return await self._store.get(key, prototype, byte_range)
        with self._lock:
            self.state["requests"] += 1
            self.state["now"] += 1
            self.state["peak"] = max(self.state["peak"], self.state["now"])
        try:
            delay = self.delays.get(key, self.delay)
            if delay:
                await asyncio.sleep(delay)
            return await self._store.get(key, prototype, byte_range)
        finally:
            with self._lock:
                self.state["now"] -= 1

    async def get_partial_values(
        self, prototype: BufferPrototype, key_ranges: Any
    ) -> list[Buffer | None]:
        ranges = list(key_ranges)
        return list(await asyncio.gather(*(self.get(k, prototype, r) for k, r in ranges)))


def _rebuild(store: Any, delay: float, delays: dict[str, float], metadata: bool) -> LatencyStore:
    """A :class:`LatencyStore` unpickled (its counters start at zero)."""
    return LatencyStore(store, delay, delays=delays, metadata=metadata)
