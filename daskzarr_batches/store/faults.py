"""What a failed read's exception means: a fault of the store, of the data, or of the program.

:func:`is_transient` (a dropped connection, a timeout, HTTP 5xx or
throttling, found anywhere in the exception chain: what ``ReadPolicy``
retries), :func:`is_program_error` (an exception bad bytes never cause: a bug
in this package or a dependency it cannot work with, raised rather than
counted as a bad chunk) and :func:`program_error` (such an exception, named
where it happened).  Used by ``store.policy`` (which exports them too) and
the read layer.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator

from ..errors import DaskZarrBatchesError
from .backends import obstore_fault

__all__ = ["is_program_error", "is_transient", "program_error"]


#: Exceptions that bad bytes never cause: a bug in this package, or a dependency it
#: cannot work with (an ImportError or AttributeError from another zarr release).
_PROGRAM_ERRORS = (ImportError, AttributeError, NameError, AssertionError, SyntaxError)


#: Modules whose TypeError may come from the bytes they decode (a codec).
_CODEC_MODULES = ("numcodecs", "zarr.codecs", "zarrs", "zstandard", "blosc", "lz4", "imagecodecs")


def is_program_error(exc: BaseException) -> bool:
    """Whether ``exc`` is a failure of the program, never of the data it read.

    An ``ImportError``, ``AttributeError``, ``NameError``, ``AssertionError``
    or ``SyntaxError``, or a ``TypeError`` that no codec module raised (a
    codec may raise one on bad bytes), anywhere in its chain of causes, but
    not beneath one of the package's own errors (which already say what
    they are).  Such a failure is never a corrupt, missing or unreadable
    chunk and is never skipped by ``on_error="skip"``: see
    :func:`program_error`.
    """
    for error in _chain(exc):
        if isinstance(error, DaskZarrBatchesError):
            return False
        if _is_program(error):
            return True
    return False


def _is_program(error: BaseException) -> bool:
    if isinstance(error, _PROGRAM_ERRORS):
        return True
    return isinstance(error, TypeError) and not _raised_in_codec(error)


def _raised_in_codec(exc: BaseException) -> bool:
    tb = exc.__traceback__
    while tb is not None:
        module = str(tb.tb_frame.f_globals.get("__name__", ""))
        if module.startswith(_CODEC_MODULES):
            return True
        tb = tb.tb_next
    return False


def program_error(exc: BaseException, where: str) -> BaseException:
    """The program's failure in ``exc`` (a :func:`is_program_error`), noting where it happened.

    The first such failure in ``exc``'s chain (itself, or one inside an
    exception group of concurrent reads), to be raised as what it is (its own
    type, ``raise error from error.__cause__``), so that it is never taken for
    bad data; the note says which chunk or window was being read.
    """
    exc = next((e for e in _chain(exc) if _is_program(e)), exc)
    note = (
        f"raised while reading {where}: a failure of daskzarr_batches or of a dependency "
        "it cannot work with (not damaged data; please report it with your package versions)"
    )
    if note not in getattr(exc, "__notes__", ()):
        exc.add_note(note)
    return exc


def is_transient(exc: BaseException) -> bool:
    """Whether a read that raised ``exc`` may succeed if tried again.

    Walks the exception chain (causes, contexts, exception groups).  Never
    transient: not found, permission, and anything that is not an I/O fault
    (a decoding error).  Transient: connection errors, timeouts, resets, and
    HTTP 5xx / 429 / throttling answers as s3fs, aiohttp and botocore report
    them, and as obstore does (its classes and messages: ``backends.obstore_fault``).
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
    if obstore_fault(error, _TRANSIENT_CODES) is False:
        return True
    status = _status(error)
    return status is not None and status in (401, 403, 404)


def _transient(error: BaseException) -> bool:
    if isinstance(error, ConnectionError | TimeoutError):
        return True
    if obstore_fault(error, _TRANSIENT_CODES):
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
