"""How a stream reads, as one frozen, validated value: :class:`ReadOptions`.

``client``, ``timeout``, the read policy (``missing``, ``on_error``,
``retries``), ``io_concurrency``, ``cache`` and ``reader``: the keywords every public
stream, map/reduce and loader signature takes; :func:`read_options` joins an
entry point's ``read=`` with its flat keywords.  Re-exported by
``streams.spec``, where they were first.
"""

from __future__ import annotations

import dataclasses
import functools
import reprlib
import types
from dataclasses import dataclass, field
from typing import Any

from ..errors import ArgumentTypeError, ArgumentValueError
from ..execute.runners import resolve_client
from ..store.cache import ChunkCache
from ..store.policy import DEFAULT_RETRIES, MissingMode, OnError, ReadPolicy
from ..store.reader_hook import ReaderHook
from ..store.requests import ReaderFactory
from .checks import NotGiven, io_concurrency, non_negative_int, not_given, timeout_seconds

__all__ = ["UNSET", "ReadOptions", "read_options"]


@dataclass(frozen=True)
class ReadOptions:
    """How a stream reads: where, how long it waits, what it does about faults.

    The read keywords of every entry point (the stream constructors,
    ``map_chunks``, ``reduce_chunks``, ``feature_moments``, ``map_to_zarr``,
    ``write_shuffled`` and ``Loader``), documented here once and validated
    once (each check names the parameter and the value).  Each entry point
    takes them flat (``retries=5``) or as one value (``read=ReadOptions(retries=5)``)
    to share one set across streams; a flat keyword given beside ``read=``
    must agree with it, even given at its default value (``missing="fill"``
    beside ``read=ReadOptions(missing="error")`` raises; ``read_options``).
    Constructing one, also through
    ``dataclasses.replace``, validates every field.  A new read setting is a
    new field here (and a flat keyword on the entry points).

    Examples
    --------
    >>> import numpy as np
    >>> import daskzarr_batches as dzb
    >>> read = dzb.ReadOptions(missing="error", retries=5)
    >>> stream = dzb.batch_stream(np.arange(10), 4, read=read)
    >>> stream.spec.retries
    5

    Parameters
    ----------
    client : distributed.Client, optional
        Where reads run; ``None`` resolves to the client dask's configuration
        points at, if any, else the local threads.
    timeout : float, optional
        Seconds to wait for one window or chunk; ``None``, ``inf`` or values
        of ``threading.TIMEOUT_MAX`` or more wait forever (stored as ``None``).
    missing : {"fill", "warn", "error"}, default "fill"
        Chunks absent from the store (`ReadPolicy`).
    on_error : {"raise", "skip"}, default "raise"
        Chunks that do not decode.
    retries : int, default 3
        Retries of one read after a transient fault.
    io_concurrency : int, optional
        Store requests in flight at most: locally for the whole stream; on a
        cluster within each read task (a chunk stream also keeps that many
        reads in flight).  ``None``: the stream's default.
    cache : ChunkCache, optional
        Decoded chunks served from this cache when it holds them, and kept in
        it when read from the store.
    reader : callable, optional
        ``reader(array, default)``, returning the
        [`ChunkReader`][daskzarr_batches.readers.ChunkReader] that decodes ``array``'s
        chunks (``default``: the reader this library chose; yours may wrap
        it, or read a format of its own).  Called once per array per stream
        in each process that reads (a cluster worker is its own process);
        every decode of every stream kind is a ``read(requests)`` of it, and
        a chunk served from ``cache`` asks it nothing.  ``None``: the
        library's reader.
    """

    client: Any = field(default=None, compare=False)
    timeout: float | None = None
    missing: MissingMode = "fill"
    on_error: OnError = "raise"
    retries: int = DEFAULT_RETRIES
    io_concurrency: int | None = None
    cache: ChunkCache | None = field(default=None, compare=False)
    reader: ReaderFactory | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        put = functools.partial(object.__setattr__, self)
        put("timeout", timeout_seconds(self.timeout))
        put("retries", non_negative_int("retries", self.retries))
        put("io_concurrency", io_concurrency(self.io_concurrency))
        ReadPolicy(self.missing, self.on_error, self.retries)  # validates the other two
        put("client", resolve_client(self.client))
        if self.cache is not None and not isinstance(self.cache, ChunkCache):
            raise ArgumentTypeError(
                f"cache must be a ChunkCache or None, got {self.cache!r} of type "
                f"{type(self.cache).__name__}"
            )
        if self.reader is not None and not callable(self.reader):
            raise ArgumentTypeError(
                "reader must be a callable factory(array, default) -> ChunkReader or None, "
                f"got {self.reader!r} of type {type(self.reader).__name__}"
            )

    @property
    def policy(self) -> ReadPolicy:
        """The read policy, without a request limit (a stream adds its own: ``limited``)."""
        hook = None if self.reader is None else ReaderHook(self.reader)
        return ReadPolicy(self.missing, self.on_error, self.retries, cache=self.cache, readers=hook)

    def keywords(self) -> dict[str, Any]:
        """The fields as the flat keywords of the entry points (``client=...``, ...)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


#: The defaults of the flat read keywords in every entry point's signature
#: (``missing: MissingMode = UNSET.missing``): markers equal to ``ReadOptions``'
#: defaults and shown as them, which ``read_options`` tells from a keyword given.
UNSET: Any = types.SimpleNamespace(
    **{f.name: not_given(f"read.{f.name}", f.default) for f in dataclasses.fields(ReadOptions)}
)


def read_options(read: object = None, /, **flat: Any) -> ReadOptions:
    """An entry point's read options: ``read=`` or its flat read keywords, validated once.

    Parameters
    ----------
    read : ReadOptions, optional
        The ``read=`` argument; ``None``: the flat keywords alone.
    **flat : Any
        The entry point's flat read keywords (``client``, ``timeout``, ...:
        the fields of :class:`ReadOptions`), each its :data:`UNSET` marker
        where the caller did not give it.

    Returns
    -------
    ReadOptions
        ``ReadOptions(**flat)`` (the keywords given) without ``read``; else
        ``read``.

    Raises
    ------
    ArgumentTypeError
        ``read`` is not a ``ReadOptions``.
    ArgumentValueError
        A flat keyword is given beside ``read`` with another value than
        ``read`` holds, its default value included (``missing="fill"``
        beside ``read=ReadOptions(missing="error")``); the message names it.
        One given with the value ``read`` holds is allowed.
    """
    given = {k: v for k, v in flat.items() if not isinstance(v, NotGiven)}
    if read is None:
        return ReadOptions(**given)
    if not isinstance(read, ReadOptions):
        raise ArgumentTypeError(
            f"read must be a ReadOptions or None, got {reprlib.repr(read)} of type "
            f"{type(read).__name__}"
        )
    unknown = sorted(set(flat) - {f.name for f in dataclasses.fields(ReadOptions)})
    if unknown:
        raise ArgumentTypeError(f"not read options: {unknown}")
    if given:
        mine = ReadOptions(**given)  # validated and normalised as read's fields were
        for name in given:
            theirs, ours = getattr(read, name), getattr(mine, name)
            if ours is not theirs and ours != theirs:
                raise ArgumentValueError(
                    f"{name}={reprlib.repr(flat[name])} disagrees with read.{name}="
                    f"{reprlib.repr(theirs)}: give each read option once, flat or in read="
                )
    return read
