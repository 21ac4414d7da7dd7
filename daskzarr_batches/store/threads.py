"""Daemon threads for blocking work: a read that never returns cannot keep the process alive.

``concurrent.futures.ThreadPoolExecutor`` (and asyncio's default executor,
one of them) runs non-daemon threads that the interpreter joins at exit, so
a thread blocked forever in a file read (a hung network file system, a FIFO)
keeps the process from exiting.  :class:`DaemonExecutor` is the same pool on
daemon threads that nothing joins; with ``abandon=True`` a running call
whose future is cancelled is *abandoned*: its thread no longer counts
against the pool's size, so the pool starts another one for the work still
queued, and the abandoned thread ends when (if ever) its call returns.

Two uses:

* the local runner's driver and read pools (``execute.runners.ThreadRunner``) and the
  cluster runner's fetch threads, which never abandon a call (a window graph
  released while it runs goes on as before: the pool's size still bounds them);
* Zarr's own blocking I/O and decoding: Zarr runs them with
  ``asyncio.to_thread`` on its event loop's default executor (a
  ``LocalStore`` get, a codec, a zarrs read), and :func:`zarr_loop` installs
  one process-wide :class:`DaemonExecutor` of the same size as that loop's
  default executor (``DEFAULT_IO_WORKERS``), with ``abandon=True``: a read
  cancelled on the loop (a stream closed or timed out) cancels the executor
  future it awaited, which abandons its thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import queue
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from ..errors import WindowError

__all__ = ["DEFAULT_IO_WORKERS", "DaemonExecutor", "drain", "io_executor", "zarr_loop"]

#: Threads of Zarr's loop executor when ``zarr.config`` sets no ``threading.max_workers``:
#: asyncio's (and Zarr's) default.
DEFAULT_IO_WORKERS = min(32, (os.cpu_count() or 1) + 4)

#: How long ``shutdown`` waits for its pool's lock before it shuts down without it: a
#: daemon thread holding it may never run again (it is frozen at interpreter exit).
SHUTDOWN_LOCK_SECONDS = 1.0

_Item = tuple["_Work", Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class _Work(concurrent.futures.Future[Any]):
    """A future whose ``cancel()`` while it runs abandons its thread."""

    def __init__(self, executor: DaemonExecutor) -> None:
        super().__init__()
        self._executor = executor

    def cancel(self) -> bool:
        if super().cancel():
            return True  # not started: it never will
        self._executor._abandon(self)
        return False


class DaemonExecutor(concurrent.futures.ThreadPoolExecutor):
    """A thread pool of daemon threads, started on demand up to ``max_workers``.

    A ``ThreadPoolExecutor`` by type (asyncio accepts no other as a loop's
    default executor) and by behaviour for its callers (``submit``, ``map``,
    ``shutdown``, ``_max_workers`` as dask reads it), with its own threads
    and queue (none of the stdlib pool's internals are used), except that
    its threads never delay the interpreter's exit and, with ``abandon``,
    that cancelling the future of a running call abandons its thread: the
    pool no longer counts it, starts another one if work is waiting, and the
    abandoned thread ends once its call returns.

    Parameters
    ----------
    max_workers : int
        Threads running calls at once (abandoned ones not counted).
    name : str
        Prefix of the threads' names.
    abandon : bool, default False
        Whether cancelling a running call abandons its thread (else the
        cancel is a no-op, as for the stdlib pool).
    """

    def __init__(self, max_workers: int, name: str, abandon: bool = False) -> None:
        super().__init__(max(1, int(max_workers)), thread_name_prefix=name)  # sets _max_workers
        self._name = name
        self._abandons = abandon
        self._items: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        # re-entrant: a finalizer run by the garbage collector while this thread holds it
        # (a stream dropped in a cycle closes its runner) may come back to this pool
        self._lock = threading.RLock()
        self._counted = 0  # threads alive and not abandoned
        self._idle = 0  # counted threads free to take the next item
        self._waiting = 0  # items queued that no idle thread was reserved for
        self._running: dict[_Work, bool] = {}  # running call -> abandoned
        self._started = 0
        self._shutdown = False
        _EXECUTORS.add(self)

    def busy(self) -> int:
        """Calls running now that are not abandoned."""
        with self._lock:
            return sum(not abandoned for abandoned in self._running.values())

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> _Work:
        """Schedule ``fn(*args, **kwargs)``; its future.

        Raises
        ------
        WindowError
            The pool was shut down.
        """
        future = _Work(self)
        with self._lock:
            if self._shutdown:
                raise WindowError(f"the {self._name} threads were shut down: nothing more runs")
            self._items.put((future, fn, args, kwargs))
            if self._idle:
                self._idle -= 1  # that thread takes it
            else:
                self._waiting += 1
                self._grow()
        return future

    def _grow(self) -> None:
        """Start threads for the waiting items, up to the pool's size (lock held)."""
        while self._waiting and self._counted < self._max_workers:
            self._waiting -= 1
            self._counted += 1
            self._started += 1
            thread = threading.Thread(
                target=self._work, name=f"{self._name}_{self._started}", daemon=True
            )
            thread.start()

    def _abandon(self, future: _Work) -> None:
        """``future`` was cancelled while it runs: let its thread go, start another."""
        if not self._abandons:
            return
        with self._lock:
            if self._running.get(future) is False:
                self._running[future] = True
                self._counted -= 1
                self._grow()

    def _work(self) -> None:
        while True:
            item = self._items.get()
            if item is None:  # shut down
                return
            future, fn, args, kwargs = item
            if future.set_running_or_notify_cancel():
                with self._lock:
                    self._running[future] = False
                try:
                    result = fn(*args, **kwargs)
                except BaseException as exc:  # handed to the caller, as the stdlib pool does
                    future.set_exception(exc)
                else:
                    future.set_result(result)
                    del result  # the caller's now: an idle thread must not keep it alive
                del fn, args, kwargs
                with self._lock:
                    if self._running.pop(future):
                        return  # abandoned: another thread took this one's place
            del future, item
            with self._lock:
                if self._waiting:
                    self._waiting -= 1  # take a queued item nobody was reserved for
                else:
                    self._idle += 1

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop taking work; ``cancel_futures`` cancels the calls not started.

        Idle threads end at once; running calls finish on their threads.
        ``wait`` waits for nothing: the threads are daemons, and a call that
        never returns must not hold its caller either.
        """
        unstarted: list[_Work] = []
        # A daemon thread can be frozen for good while it holds the lock: at interpreter
        # exit it never gets the GIL back, and a finalizer that closes a stream lands here.
        # Then shut down without the lock (the queue is thread-safe on its own).
        locked = self._lock.acquire(timeout=0 if sys.is_finalizing() else SHUTDOWN_LOCK_SECONDS)
        try:
            if self._shutdown:
                return
            self._shutdown = True
            if cancel_futures:
                while True:
                    try:
                        item = self._items.get_nowait()
                    except queue.Empty:
                        break
                    if item is not None:
                        unstarted.append(item[0])
                self._waiting = 0
            for _ in range(self._counted):
                self._items.put(None)
        finally:
            if locked:
                self._lock.release()
        for future in unstarted:  # outside the lock: cancelling runs the futures' callbacks
            future.cancel()


_EXECUTORS: weakref.WeakSet[DaemonExecutor] = weakref.WeakSet()


def drain(timeout: float) -> None:
    """Wait until no :class:`DaemonExecutor` runs a call it counts, at most ``timeout`` s.

    Called at exit, after the streams' reads were cancelled and before Zarr
    closes its loop: the calls still running (a decode, a transform) end
    while the interpreter is whole.  A daemon thread that comes back from
    native code after the interpreter is finalized is ended by it, which
    aborts the process when Rust or C++ frames (zarrs) are on its stack.
    Abandoned calls are not waited for: they may never return.
    """
    deadline = time.monotonic() + timeout
    while any(executor.busy() for executor in list(_EXECUTORS)):
        if time.monotonic() >= deadline:
            return
        time.sleep(0.005)


_io_lock = threading.Lock()
_io: DaemonExecutor | None = None  # this process's executor for Zarr's loop
_installed: Any = None  # the loop it was installed on


def _after_fork() -> None:
    """A forked child has none of its parent's threads: it starts its own, on its own loop."""
    global _io_lock, _io, _installed
    _io_lock = threading.Lock()
    _io = None
    _installed = None


os.register_at_fork(after_in_child=_after_fork)


def io_executor() -> DaemonExecutor:
    """This process's executor for Zarr's blocking I/O and decoding (made once per process).

    Sized as Zarr's own: ``zarr.config`` ``threading.max_workers``, else
    :data:`DEFAULT_IO_WORKERS`.
    """
    global _io
    with _io_lock:
        if _io is None or _io._shutdown:  # closed: Zarr's loop was closed (at exit)
            import zarr

            workers = zarr.config.get("threading.max_workers", None) or DEFAULT_IO_WORKERS
            _io = DaemonExecutor(workers, "zarr_io_daemon", abandon=True)
        return _io


def zarr_loop() -> asyncio.AbstractEventLoop:
    """Zarr's event loop, with :func:`io_executor` as its default executor.

    Called before every read (cheap once installed).  Zarr would put its own
    executor on the loop the first time ``sync`` runs with
    ``threading.max_workers`` configured; that happens here first, so ours
    replaces it for good (Zarr's then never starts a thread).
    """
    global _installed
    from .zarr_adapter import install_loop_executor, zarr_loop_now

    loop = zarr_loop_now()
    if _installed is loop:
        return loop
    install_loop_executor(loop, io_executor())
    _installed = loop
    return loop
