"""Every error this library raises on purpose.

All of them derive from :class:`DaskZarrBatchesError`, and each also inherits
the builtin a caller would naturally catch, so ``except ValueError`` works as
well as ``except dzb.DaskZarrBatchesError``::

    DaskZarrBatchesError(Exception)
    ├── ArgumentTypeError(TypeError)        a parameter has the wrong type
    ├── ArgumentValueError(ValueError)      a parameter has a bad value
    │   └── LengthMismatchError             paired arrays differ in length
    ├── ArrayNotFoundError(KeyError, FileNotFoundError)
    │                                       no Zarr array at that source/path
    ├── InvalidMetadataError(ValueError)    a Zarr metadata document there is
    │                                       not valid JSON or not valid Zarr
    │                                       metadata; names the document
    ├── ChunkReadError(OSError)             a stored chunk could not be read
    │   │                                   (after the retries); names array
    │   │                                   and chunk
    │   ├── MissingChunkError(KeyError)     missing="error" and a chunk is not
    │   │                                   in the store; names array and key
    │   ├── StoreGoneError(FileNotFoundError)
    │   │                                   the array's metadata (or the store
    │   │                                   root, or the bucket) is gone: an
    │   │                                   outage, whatever ``missing`` says;
    │   │                                   names store and array
    │   └── CorruptChunkError               a chunk's bytes do not decode;
    │                                       names array, key and samples
    ├── WindowError(RuntimeError)           the scheduler failed a window of
    │                                       work (e.g. all workers died)
    ├── WindowTimeoutError(TimeoutError)    a window took longer than
    │                                       ``timeout`` seconds
    ├── StreamFailedError(RuntimeError)     ``next()`` on a stream that has
    │                                       already raised; names that error
    └── LoaderBusyError(RuntimeError)       a second iteration of a Loader
                                            while one is running
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import sysconfig
import threading
import warnings
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

__all__ = [
    "ArgumentTypeError",
    "ArgumentValueError",
    "ArrayNotFoundError",
    "CacheWarning",
    "ChunkReadError",
    "CorruptChunkError",
    "DaskZarrBatchesError",
    "InvalidMetadataError",
    "LengthMismatchError",
    "LoaderBusyError",
    "MissingChunkError",
    "MissingChunksWarning",
    "ResumeMismatchError",
    "ShuffleQualityWarning",
    "SkippedChunksWarning",
    "StoreGoneError",
    "StreamFailedError",
    "WindowError",
    "WindowTimeoutError",
]

P = ParamSpec("P")
R = TypeVar("R")


class DaskZarrBatchesError(Exception):
    """Root of every error raised by ``daskzarr_batches``."""


class ArgumentTypeError(DaskZarrBatchesError, TypeError):
    """A parameter has the wrong type (for example ``batch_size=2.5``)."""


class ArgumentValueError(DaskZarrBatchesError, ValueError):
    """A parameter has the right type but a value that cannot work."""


class LengthMismatchError(ArgumentValueError):
    """Arrays that must be paired sample by sample differ in length."""


class ResumeMismatchError(ArgumentValueError):
    """An output exists but was written by another job: a resume would mix two results.

    Raised by [`map_to_zarr`][daskzarr_batches.map_to_zarr] and
    [`write_shuffled`][daskzarr_batches.write_shuffled] when the
    fingerprint in the output's attributes (job, ``func``, input and its
    contents, seed) or its shape, dtype or grid differ from this call's; the
    message names what changed.  ``overwrite=True`` starts over.
    """


class ArrayNotFoundError(DaskZarrBatchesError, KeyError, FileNotFoundError):
    """No Zarr array exists at the given source and path."""

    def __str__(self) -> str:  # KeyError would otherwise quote the message
        return str(self.args[0]) if self.args else ""


class InvalidMetadataError(DaskZarrBatchesError, ValueError):
    """A Zarr metadata document cannot be parsed.

    Raised by [`open_array`][daskzarr_batches.open_array] when ``zarr.json`` (format 3) or
    ``.zarray``,
    ``.zgroup``, ``.zattrs`` (format 2) on the way to the array is not JSON,
    not a JSON object, or lacks fields Zarr requires.  The message names the
    store and the document; Zarr's own error, if any, is chained as
    ``__cause__``.
    """


class ChunkReadError(DaskZarrBatchesError, OSError):
    """A stored chunk could not be read or decoded.

    The message names the array and the chunk; the original exception is
    chained as ``__cause__``.
    """

    def __str__(self) -> str:  # OSError would otherwise format errno fields
        return str(self.args[0]) if self.args else ""


class MissingChunkError(ChunkReadError, KeyError):
    """A chunk is not in the store and ``missing="error"`` was asked for.

    Also a ``KeyError``: the store has no such key.  The message names the
    array and the chunk's key.
    """

    def __str__(self) -> str:  # KeyError would otherwise quote the message
        return str(self.args[0]) if self.args else ""


class StoreGoneError(ChunkReadError, FileNotFoundError):
    """The array itself is gone from its store: an outage, not a missing chunk.

    Raised when a chunk comes back absent and the array's metadata document
    (``zarr.json`` or ``.zarray``) is not there either: the store's directory,
    the bucket or the array was deleted or moved while it was read.  Every
    chunk would otherwise read as the fill value, so this is raised whatever
    ``missing`` says (``missing`` governs only chunks absent from an array
    that exists).  Also a ``FileNotFoundError``.  The message names the store
    and the array.
    """

    def __str__(self) -> str:  # OSError would otherwise format errno fields
        return str(self.args[0]) if self.args else ""


class CorruptChunkError(ChunkReadError):
    """A stored chunk's bytes do not decode (bad compression, failed checksum).

    The message names the array, the chunk's key and its samples; the codec's
    error is chained as ``__cause__``.  With ``on_error="skip"`` the chunk's
    samples leave the epoch instead (see
    [`SkippedChunksWarning`][daskzarr_batches.SkippedChunksWarning]).
    """


class MissingChunksWarning(UserWarning):
    """Chunks were missing from the store and read as the fill value.

    Emitted once per stream (with ``missing="warn"``; the default ``"fill"``
    only counts them, as an absent chunk is the fill value in Zarr), by the
    ``next()`` that hands out the first batch (or chunk) holding a missing
    chunk, and attributed to the caller's line: for arrays whose every chunk
    should be stored.

    Attributes
    ----------
    array : str
        The array the first missing chunk belongs to.
    key : str
        The store key of the first missing chunk.
    count : int
        Missing chunks the stream had met when it warned (the stream's final
        count is ``stream.stats.chunks_missing``).
    """

    def __init__(
        self, message: str = "", *, array: str = "", key: str = "", count: int = 0
    ) -> None:
        super().__init__(message)
        self.array = array
        self.key = key
        self.count = count


class CacheWarning(UserWarning):
    """A chunk cache's directory cannot be written (full, or not writable).

    Reads go on, from the store, without writing to it (warned once per cache
    and process).
    """


class ShuffleQualityWarning(UserWarning):
    """A buffered shuffle cannot reach its batch-mixing target within ``memory_budget``.

    ``shuffle_buffer_size="auto"`` then uses the largest buffer the budget
    holds; the warning names the figure it reaches (``batch mixing``,
    ``ShuffleQuality.mixing``) and the ways out: the exact shuffle
    (``shuffle_buffer_size=None``, with a ``cache`` for repeated epochs),
    ``write_shuffled`` once and a buffered shuffle of its output, or smaller
    chunks (a buffer of the same bytes then holds more of them).
    """


class SkippedChunksWarning(UserWarning):
    """Chunks that did not decode were skipped (``on_error="skip"``).

    Names the array, the chunks and their samples, which left the epoch (from
    every array of a paired stream).
    """


class ReadCancelledError(ChunkReadError):
    """A read was cancelled because its stream was closed (internal: never reaches ``next()``)."""


class WindowError(DaskZarrBatchesError, RuntimeError):
    """The scheduler could not compute a window of work.

    Raised from ``next()``; the message names the window and the batches it
    would have produced, and the scheduler's error is chained as ``__cause__``.
    """


class WindowTimeoutError(DaskZarrBatchesError, TimeoutError):
    """A window was not ready within ``timeout`` seconds."""


class StreamFailedError(DaskZarrBatchesError, RuntimeError):
    """``next()`` was called on a stream that had already raised an error.

    A stream stops at its first error (a chunk that cannot be read, a window
    that failed or timed out, an interrupt); every later ``next()`` raises
    this error, naming the first one (chained as ``__cause__``), instead of a
    ``StopIteration`` that would read as a finished epoch with the rest of
    the data silently gone.  Make a new stream (or resume a ``Loader`` from
    its ``state_dict()``) to go on.
    """


class LoaderBusyError(DaskZarrBatchesError, RuntimeError):
    """A [`Loader`][daskzarr_batches.Loader] was iterated again while an iteration of it is running.

    Two iterations at once (two threads, or a second ``for`` loop while the
    first one's iterator is still alive) would each yield the same epoch and
    advance the epoch twice.  Finish or close the first iterator (``break``
    out of its loop and drop it, or call its ``close()``), or give each
    thread a loader of its own.
    """


#: per thread: where ``warn_caller`` puts its warnings instead (``deferred_warnings``)
_deferred = threading.local()

#: the standard library's own files (not its site-packages): frames there between two of
#: the package's (``dataclasses.replace``, ``contextlib``) are not the caller's
_STDLIB = os.path.join(os.path.abspath(sysconfig.get_paths()["stdlib"]), "")


def _between(name: str) -> bool:
    """Whether a frame of file ``name`` may lie between the package's own frames."""
    if name.startswith("<"):  # generated code (a dataclass's __init__), frozen modules
        return True
    path = os.path.abspath(name)
    return path.startswith(_STDLIB) and "-packages" + os.sep not in path


class deferred_warnings:  # lower case: used as a function, ``with deferred_warnings():``
    """Collect what :func:`warn_caller` emits in this thread, instead of emitting it.

    ``with deferred_warnings() as warned:`` (``warned``: the list they go to).  A
    device feed pulls a batch under it and emits the warnings (``warn_caller``
    again) when it hands that batch out, so each comes with its batch, at the
    consumer's line.  A class, not a generator: it runs once per batch.
    """

    __slots__ = ("_previous", "sink")

    def __enter__(self) -> list[Warning]:
        self._previous = getattr(_deferred, "sink", None)
        self.sink: list[Warning] = []
        _deferred.sink = self.sink
        return self.sink

    def __exit__(self, *exc: object) -> None:
        _deferred.sink = self._previous


def warn_caller(warning: Warning) -> None:
    """Emit ``warning`` attributed to the first frame outside this package.

    The caller's own line (its training loop), however many of the
    package's frames (a stream's generator, ``Loader``, the torch adapter)
    lie between, and the standard library's or generated code's frames
    between two of them (``dataclasses.replace``): ``stacklevel`` is counted
    at the call (Python 3.11 has no ``skip_file_prefixes``).  In a thread
    collecting warnings (:func:`deferred_warnings`) it is collected instead.
    """
    sink = getattr(_deferred, "sink", None)
    if sink is not None:
        sink.append(warning)
        return
    package = os.path.dirname(os.path.abspath(__file__)) + os.sep

    def inside(frame: Any) -> bool:
        while frame is not None and _between(frame.f_code.co_filename):
            frame = frame.f_back  # the package's, if the next frame that is not is
        return frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package)

    level = 2  # 1 is this function, 2 the frame below
    frame: Any = sys._getframe(1)
    while frame is not None and inside(frame):
        frame = frame.f_back
        level += 1
    warnings.warn(warning, stacklevel=level)


def renamed_keywords(**renames: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Keep old keyword names of ``func`` working, each a ``DeprecationWarning``.

    ``renamed_keywords(threads="io_concurrency")``: a call with ``threads=``
    warns (attributed to the caller, :func:`warn_caller`) and is passed on as
    ``io_concurrency=``; the signature shows the new names only.  Giving an
    old name and its new one together raises :class:`ArgumentTypeError`.
    """

    def wrap(func: Callable[P, R]) -> Callable[P, R]:
        name = func.__qualname__.removesuffix(".__init__")
        names = list(inspect.signature(func).parameters)

        @functools.wraps(func)
        def call(*args: P.args, **kwargs: P.kwargs) -> R:
            for old, new in renames.items():
                if old not in kwargs:
                    continue
                given = new in kwargs or (new in names and names.index(new) < len(args))
                if given:
                    raise ArgumentTypeError(
                        f"{name}: {old}= is the former name of {new}=; pass {new} only"
                    )
                warn_caller(
                    DeprecationWarning(
                        f"{name}: {old}= is deprecated, renamed {new}= (the same "
                        f"meaning); pass {new}= instead"
                    )
                )
                kwargs[new] = kwargs.pop(old)
            return func(*args, **kwargs)

        return call

    return wrap


def install_hint(extra: str) -> str:
    """How to install an extra, as the errors say it.

    From a clone (the way this package is installed today), or from a package
    index that has it.
    """
    return (
        f"pip install '.[{extra}]' from a clone of daskzarr_batches "
        f"(pip install 'daskzarr-batches[{extra}]' from an index that has the package)"
    )
