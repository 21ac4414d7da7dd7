"""The chunk cache's tiers: memory, a local directory and a cluster's futures.

Each tier keeps decoded chunks one way, under the keys
:class:`~daskzarr_batches.store.cache.ChunkCache` makes (``cache_keys``
names what they are made of): :class:`MemoryTier` an LRU of arrays within a
byte budget, :class:`DiskTier` a directory of checked files
(``cache_file``'s format) within a byte budget, shared by processes, with
its write errors, :class:`ClusterTier` the futures of chunks on a
``distributed`` cluster within the memory budget.  What is looked up where,
and in which order, is ``ChunkCache``'s.  The tiers of one cache share its
lock (each guards its own state with it).
"""

from __future__ import annotations

import collections
import contextlib
import errno
import os
import threading
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from . import cache_keys
from .cache_file import _CRC, _HEADER, MAGIC, _bytes, _header, _OldFormat, _read_file

if TYPE_CHECKING:
    from .cache import CacheCounts

__all__ = ["ClusterTier", "DiskTier", "MemoryTier"]

#: Write errors of the cache's directory as a whole (others are of one entry: that file alone).
_DIRECTORY_ERRNOS = frozenset(
    getattr(errno, name)
    for name in ("ENOSPC", "EDQUOT", "EROFS", "EACCES", "EPERM", "ENOENT", "ENOTDIR", "EIO")
    if hasattr(errno, name)
)


class MemoryTier:
    """Decoded chunks in memory, least recently used first out.

    Parameters
    ----------
    budget : int
        Bytes of chunks kept; a chunk larger than that is not kept.
    lock : threading.Lock
        The lock guarding the entries (the cache's, shared by its tiers).
    """

    def __init__(self, budget: int, lock: threading.Lock) -> None:
        self.budget = budget
        self._lock = lock
        self.entries: collections.OrderedDict[str, np.ndarray] = collections.OrderedDict()
        self.held = 0

    def __len__(self) -> int:
        return len(self.entries)

    def get(self, key: str) -> np.ndarray | None:
        """The chunk ``key`` (now the most recently used), else ``None``."""
        with self._lock:
            found = self.entries.get(key)
            if found is not None:
                self.entries.move_to_end(key)
        return found

    def has(self, key: str) -> bool:
        """Whether the chunk ``key`` is kept."""
        with self._lock:
            return key in self.entries

    def remember(self, key: str, data: np.ndarray) -> None:
        """Keep ``data`` as ``key``, dropping the least recently used beyond the budget."""
        if data.nbytes > self.budget:
            return  # larger than the budget: not kept (reads bypass the memory)
        with self._lock:
            if key in self.entries:
                self.entries.move_to_end(key)
                return
            self.entries[key] = data
            self.held += data.nbytes
            while self.held > self.budget:
                _, old = self.entries.popitem(last=False)
                self.held -= old.nbytes

    def clear(self) -> None:
        """Forget every chunk."""
        with self._lock:
            self.entries.clear()
            self.held = 0


class DiskTier:
    """Decoded chunks as checked files in a directory, least recently used first out.

    Files are written to a temporary name of the writing process and
    renamed into place; several processes may share the directory.  A
    failed write is noted (:meth:`take_write_error`): one of the directory
    stops the writes, one of a single file fails that chunk alone.

    Parameters
    ----------
    directory : pathlib.Path
        Where the files are (made already: ``cache_file._made``).
    budget : int or None
        Bytes the files may take; ``None``: until the disk is full.
    lock : threading.Lock
        The lock guarding the write errors (the cache's, shared by its tiers).
    """

    def __init__(self, directory: Path, budget: int | None, lock: threading.Lock) -> None:
        self.directory = directory
        self.budget = budget
        self._lock = lock
        self.writable = True
        # why writes failed, by kind ("directory": all of them, "entry": one file), and
        # the kinds already warned about (once each per cache and process)
        self.write_errors: dict[str, str] = {}
        self.warned: set[str] = set()
        self.used = self.scan()

    def path(self, key: str) -> Path:
        """The file of chunk ``key``."""
        return self.directory / f"{key}.chunk"

    def has(self, key: str) -> bool:
        """Whether chunk ``key`` has a file (not read, not checked)."""
        return self.path(key).exists()

    def scan(self) -> int:
        """Bytes the directory's chunk files take now."""
        total = 0
        if not self.directory.is_dir():
            return 0
        with os.scandir(self.directory) as entries:
            for entry in entries:
                if entry.name.endswith(".chunk"):
                    with contextlib.suppress(FileNotFoundError):  # removed by another process
                        total += entry.stat().st_size
        return total

    def load(self, key: str, counts: CacheCounts | None) -> np.ndarray | None:
        """The chunk of ``key``'s file, checked; ``None`` if absent or damaged (then removed)."""
        path = self.path(key)
        try:
            with open(path, "rb") as file:
                data = _read_file(file, key)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except _OldFormat:  # written by an earlier version: dropped, not damaged
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)
            return None
        except Exception:  # damaged (any way at all): dropped and read again from the store
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)
            if counts is not None:
                counts.damaged += 1
            return None
        try:
            os.utime(path)  # recently used: the last to be evicted
        except FileNotFoundError:
            pass  # removed by another process since: the chunk read is still right
        except OSError as error:  # a read-only directory: served, not written
            self._write_failed(error, None)
        return data

    def store(self, key: str, data: np.ndarray) -> None:
        """Write chunk ``data`` (C-contiguous) as ``key``'s file, evicting beyond the budget."""
        if not self.writable:
            return
        header = _header(key, data)
        start = MAGIC + _HEADER.pack(len(header)) + header
        size = len(start) + data.nbytes + _CRC.size
        if self.budget is not None and size > self.budget:
            return  # larger than the budget: not kept on disk
        path = self.path(key)
        # the pid read now, not at import: forked processes never share a temporary name
        temporary = path.with_name(
            f".{key}.{os.getpid()}-{cache_keys._PROCESS}.{threading.get_ident()}.tmp"
        )
        try:
            with open(temporary, "wb") as file:
                file.write(start)
                file.write(_bytes(data))
                file.write(_CRC.pack(zlib.crc32(_bytes(data), zlib.crc32(start))))
            os.replace(temporary, path)  # atomic: a reader sees the old file or the new one
        except OSError as error:
            with contextlib.suppress(OSError):
                temporary.unlink(missing_ok=True)
            self._write_failed(error, path)
            return
        self.used += size
        if self.budget is not None and self.used > self.budget:
            self._evict_files()

    def take_write_error(self) -> str | None:
        """Why the directory could not be written, the first time of each kind (else ``None``)."""
        with self._lock:
            for kind, problem in self.write_errors.items():
                if kind not in self.warned:
                    self.warned.add(kind)
                    return problem
            return None

    def clear(self) -> None:
        """Remove every chunk file."""
        for path in self.directory.glob("*.chunk"):
            path.unlink(missing_ok=True)
        self.used = 0

    def _write_failed(self, error: OSError, path: Path | None) -> None:
        """Note a failed write (the stream that meets it warns: :meth:`take_write_error`).

        An error of the directory (full, read-only, gone) stops the writes; one
        of a single entry (``path``: a directory where its file belongs) fails
        that chunk alone, and the others are still written.
        """
        kind = "entry" if path is not None and error.errno not in _DIRECTORY_ERRNOS else "directory"
        if kind == "entry":
            problem = (
                f"cannot write the chunk cache's file {str(path)!r} "
                f"({type(error).__name__}: {error}); that chunk is read from the store, "
                "the others are still cached"
            )
        else:
            self.writable = False
            problem = (
                f"cannot write to the chunk cache's directory {str(self.directory)!r} "
                f"({type(error).__name__}: {error}); reads go on without writing to it"
            )
        with self._lock:
            self.write_errors.setdefault(kind, problem)

    def _evict_files(self) -> None:
        """Remove the least recently used files until the directory fits its budget."""
        assert self.budget is not None
        files = []
        with os.scandir(self.directory) as entries:
            for entry in entries:
                if entry.name.endswith(".chunk"):
                    try:
                        stat = entry.stat()
                    except FileNotFoundError:
                        continue
                    files.append((stat.st_mtime, stat.st_size, entry.path))
        files.sort()
        total = sum(size for _, size, _ in files)
        target = int(self.budget * 0.9)
        for _, size, where in files:
            if total <= target:
                break
            Path(where).unlink(missing_ok=True)  # another process may have removed it
            total -= size
        self.used = total


class ClusterTier:
    """The futures of decoded chunks on a ``distributed`` cluster, least recently used first out.

    Parameters
    ----------
    budget : int
        Bytes of chunks (as their futures' makers say) kept; a chunk larger
        than that is not kept.
    lock : threading.Lock
        The lock guarding the futures (the cache's, shared by its tiers).
    """

    def __init__(self, budget: int, lock: threading.Lock) -> None:
        self.budget = budget
        self._lock = lock
        # key -> (client id, future, bytes), LRU order
        self.futures: collections.OrderedDict[str, tuple[str, Any, int]] = collections.OrderedDict()
        self.held = 0

    def __len__(self) -> int:
        return len(self.futures)

    def has(self, key: str) -> bool:
        """Whether a future of chunk ``key`` is held."""
        with self._lock:
            return key in self.futures

    def chunk(
        self, key: str, owner: str, nbytes: int, make: Callable[[bool], Any]
    ) -> tuple[Any, bool]:
        """The future of chunk ``key`` (of client ``owner``) and whether ``make`` made it now.

        A future of another client, or one that failed or was cancelled, is
        made again (``make(True)``); one made now is kept within the budget,
        the least recently used released first.
        """
        with self._lock:
            found = self.futures.get(key)
            if found is not None and found[0] == owner and found[1].status not in (
                "error", "cancelled", "lost",
            ):  # fmt: skip
                self.futures.move_to_end(key)
                return found[1], False
        future = make(found is not None)
        released = []
        with self._lock:
            old = self.futures.pop(key, None)
            if old is not None:
                self.held -= old[2]
                released.append(old[1])
            if nbytes <= self.budget:
                self.futures[key] = (owner, future, nbytes)
                self.held += nbytes
                while self.held > self.budget:
                    _, (_, gone, size) = self.futures.popitem(last=False)
                    self.held -= size
                    released.append(gone)
        for gone in released:
            if gone is not future:
                gone.release()  # the scheduler keeps it while a window in flight needs it
        return future, True

    def release(self) -> None:
        """Release every future held (workers drop their chunks)."""
        with self._lock:
            held = [future for _, future, _ in self.futures.values()]
            self.futures.clear()
            self.held = 0
        for future in held:
            future.release()
