"""Cancellation: the reads in flight of one stream in this process, stopped together.

:class:`Cancellation` is the one implementation of the small
:class:`~daskzarr_batches.store.policy.CancelScope` protocol that store and
read code take as a parameter.  A :class:`~.runners.ThreadRunner` owns one and
cancels it when it closes; an atexit hook cancels every live one before Zarr's
event loop is closed.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import threading
import weakref
from collections.abc import Coroutine
from typing import Any

from ..errors import ReadCancelledError
from ..store import zarr_adapter  # noqa: F401  (first: Zarr's atexit hook is registered before ours)
from ..store.threads import drain, zarr_loop

__all__ = ["EXIT_DRAIN_SECONDS", "Cancellation"]


class Cancellation:
    """The reads in flight of one stream in this process, cancelled together.

    Read tasks run their Zarr coroutines through :meth:`run` instead of
    Zarr's blocking ``sync``; :meth:`cancel` (when the stream closes, times
    out or is dropped) cancels every one of them on Zarr's event loop, so a
    store that never answers holds no read thread, and every read asked for
    afterwards fails at once instead of being issued.  A read blocked in the
    operating system keeps the executor thread it runs on, a daemon that the
    executor abandons (:mod:`~daskzarr_batches.store.threads`): it holds
    neither the process at exit nor later reads.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._futures: set[concurrent.futures.Future[Any]] = set()
        self.cancelled = False
        _SCOPES.add(self)

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run ``coro`` on Zarr's event loop and wait for it, unless cancelled."""
        with self._lock:
            if self.cancelled:
                coro.close()
                raise ReadCancelledError("the stream was closed; no read is issued any more")
            future = asyncio.run_coroutine_threadsafe(_watched(coro), zarr_loop())
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

    def cancel(self) -> None:
        """Cancel every read in flight, and refuse the ones asked for later."""
        with self._lock:
            self.cancelled = True
            futures = list(self._futures)
        for future in futures:
            future.cancel()


async def _watched(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run ``coro`` in a task whose error is marked as seen (:func:`_retrieved`)."""
    task = asyncio.current_task()
    if task is not None:
        task.add_done_callback(_retrieved)
    return await coro


def _retrieved(task: asyncio.Task[Any]) -> None:
    """Mark a read's error as seen: :meth:`Cancellation.cancel` may have stopped the wait.

    A read that fails as it is cancelled (a task group whose reads raised
    while being cancelled ends with their errors, or one that failed just
    before) has nobody left to take its error, and asyncio would print
    "Task exception was never retrieved" with a traceback when it is freed.
    """
    if not task.cancelled():
        task.exception()


#: Every live scope, cancelled together when the interpreter exits.
_SCOPES: weakref.WeakSet[Cancellation] = weakref.WeakSet()
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
