"""Stream settings: every argument validated in one place, held in one value.

:class:`ReadOptions` is how a stream reads, as a frozen, validated value:
``client``, ``timeout``, the read policy (``missing``, ``on_error``,
``retries``) and ``io_concurrency``, the keywords every public stream,
map/reduce and loader signature takes.  :class:`StreamSpec` is one epoch of a
batch stream (the arrays and their roles, batch size, shuffle mode, seed and
epoch, the sizes that shape windows, prefetch, and its read options);
:class:`ChunkSpec` one chunk stream.  The public constructors build one; the
plan (:meth:`StreamSpec.plan`), ``plan_epoch``, ``stream.summary()`` and the
streams all read that one object, so they cannot disagree about what an
argument means or whether it is valid.

The scalar checks below it return the normalised value or raise an error
that names the parameter and shows the offending value.  Numpy integers are
accepted wherever an ``int`` is; ``bool`` is rejected even though it is an
``int`` subclass, because ``batch_size=True`` is always a mistake.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import os
import reprlib
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, get_args

import numpy as np

from ..errors import (
    ArgumentTypeError,
    ArgumentValueError,
    LengthMismatchError,
    ShuffleQualityWarning,
    warn_caller,
)
from ..execute.runners import resolve_client
from ..plan.budget import ExactBudget, exact_budget
from ..plan.epoch import EpochPlan
from ..plan.mix import MixOrder
from ..plan.quality import DEFAULT_SHUFFLE_QUALITY, smallest_buffer
from ..plan.sampling import ClassSampler
from ..plan.windows import ShuffleMode, chunk_offsets, sample_units
from ..store.cache import ChunkCache
from ..store.collections import MixSource, SourcesSource, sources_source
from ..store.layout import shard_layout
from ..store.open import open_array
from ..store.patches import PatchSource
from ..store.policy import DEFAULT_RETRIES, MissingMode, OnError, ReadPolicy
from ..store.sources import Source, as_source
from ..store.subsets import ChunkSubset, SubsetSource

__all__ = [
    "DEFAULT_IO_CONCURRENCY",
    "DEFAULT_MEMORY_BUDGET",
    "DEFAULT_PATCH_WINDOW_BYTES",
    "DEFAULT_PREFETCH",
    "DEFAULT_WINDOW_BYTES",
    "ChunkSpec",
    "ReadOptions",
    "StreamSpec",
    "as_array",
    "buffer_samples",
    "byte_size",
    "flag",
    "io_concurrency",
    "merged_io_concurrency",
    "non_negative_int",
    "positive_int",
    "read_options",
    "row_source",
    "shuffle_mode",
    "timeout_seconds",
]

#: Windows computed ahead of the one being consumed.
DEFAULT_PREFETCH = 2
#: Target decoded bytes of one sequential window (rounded to whole chunks).
DEFAULT_WINDOW_BYTES = 32 * 2**20
#: The same for patch streams: their windows' outputs and boxes stay below glibc's 32 MiB
#: mmap threshold, so freed ones are reused instead of faulted in again (docs/benchmarks.md).
DEFAULT_PATCH_WINDOW_BYTES = 16 * 2**20
#: Bytes of samples an exact shuffle may hold in its windows.
DEFAULT_MEMORY_BUDGET = 2**30
#: Reads a chunk stream keeps in flight on a store that is not known to be local
#: (``io_concurrency=None``); how it was chosen: docs/benchmarks.md, "Latency hiding".
DEFAULT_IO_CONCURRENCY = 16
#: Decoded bytes the reads in flight of a chunk stream hold at most by default: the
#: default ``io_concurrency`` is lowered (to no less than the CPU count) for larger
#: chunks or shards.
DEFAULT_IO_BYTES = 256 * 2**20


# --------------------------------------------------------------------------
# Scalar checks


def _is_integer(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _integer(name: str, value: object, minimum: int, wanted: str, bound: str) -> int:
    if not _is_integer(value):
        raise ArgumentTypeError(
            f"{name} must be a {wanted}, got {value!r} of type {type(value).__name__}"
        )
    result = int(value)  # type: ignore[call-overload]
    if result < minimum:
        raise ArgumentValueError(f"{name} must be {bound}, got {result}")
    return result


def positive_int(name: str, value: object) -> int:
    """Return ``value`` as an ``int`` >= 1, or raise naming ``name``."""
    return _integer(name, value, 1, "positive integer", "a positive integer")


def non_negative_int(name: str, value: object) -> int:
    """Return ``value`` as an ``int`` >= 0, or raise naming ``name``."""
    return _integer(name, value, 0, "non-negative integer", ">= 0")


def timeout_seconds(value: object) -> float | None:
    """Validate ``timeout``: seconds > 0; ``None`` means wait forever.

    ``float("inf")`` and values of ``threading.TIMEOUT_MAX`` or more (which
    the waits below cannot take) also mean "no timeout", and become ``None``.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ArgumentTypeError(f"timeout must be a number of seconds or None, got {value!r}")
    seconds = float(value)
    if not seconds > 0:  # also NaN
        raise ArgumentValueError(f"timeout must be > 0 seconds, got {value!r}")
    if math.isinf(seconds) or seconds >= threading.TIMEOUT_MAX:
        return None
    return seconds


def io_concurrency(value: object) -> int | None:
    """Validate ``io_concurrency``: an ``int`` >= 1, or ``None`` (the default)."""
    return None if value is None else positive_int("io_concurrency", value)


def byte_size(name: str, value: object) -> int:
    """A size in bytes: an ``int`` >= 1, or a string such as ``"256MiB"`` or ``"1GB"``.

    Strings are read by :func:`dask.utils.parse_bytes` (``kB``/``MB``/``GB``
    are powers of 1000, ``KiB``/``MiB``/``GiB`` of 1024; a bare number is
    bytes).  The one parser of sizes for every argument that takes them.
    """
    if isinstance(value, str):
        from dask.utils import parse_bytes

        try:
            nbytes = int(parse_bytes(value))
        except (ValueError, TypeError) as error:
            raise ArgumentValueError(
                f"{name}={value!r} is not a size in bytes (e.g. '256MiB', '1GB'): {error}"
            ) from None
        if nbytes < 1:
            raise ArgumentValueError(f"{name}={value!r} must be at least 1 byte")
        return nbytes
    if not _is_integer(value):
        raise ArgumentTypeError(
            f"{name} must be a number of bytes or a size string such as '256MiB', "
            f"got {value!r} of type {type(value).__name__}"
        )
    return positive_int(name, value)


#: ``shuffle_buffer_size`` that asks for the smallest buffer meeting ``shuffle_quality``.
AUTO = "auto"


def buffer_samples(value: object, row_bytes: int) -> int:
    """``shuffle_buffer_size`` in samples: an ``int`` is samples, a string bytes.

    A size string (``"256MiB"``, read by :func:`byte_size`) holds
    ``bytes // row_bytes`` samples (``row_bytes``: a sample's decoded bytes,
    summed over the stream's arrays), at least 1.  A plain ``int`` is a count
    of samples, as before sizes in bytes were accepted; a string without a unit
    (``"8"``) is refused rather than guessed.
    """
    if isinstance(value, str):
        if value.strip().replace(".", "", 1).isdigit():  # "8": samples or bytes?
            raise ArgumentTypeError(
                f"shuffle_buffer_size={value!r} has no unit: give samples as an int "
                f"({value.strip()}) or bytes with a unit ('{value.strip()}B', '256MiB')"
            )
        return max(1, byte_size("shuffle_buffer_size", value) // max(row_bytes, 1))
    if not _is_integer(value):
        raise ArgumentTypeError(
            "shuffle_buffer_size must be a number of samples (int) or a size in bytes "
            f"such as '256MiB' (str), got {value!r} of type {type(value).__name__}"
        )
    return positive_int("shuffle_buffer_size", value)


def flag(name: str, value: object) -> bool:
    """Require a real ``bool`` so that ``ordered="no"`` is not silently true."""
    if not isinstance(value, bool):
        raise ArgumentTypeError(f"{name} must be True or False, got {value!r}")
    return value


def shuffle_mode(
    shuffle: object, shuffle_buffer_size: object, shuffle_quality: object = None
) -> ShuffleMode:
    """The mode of the public ``shuffle`` flag: exact unless a buffer size is given.

    The one place the flag becomes a mode (``plan_epoch``, ``Loader``, the
    shuffled constructors, ``patch_stream`` and ``bench``).  A buffer size
    without a shuffle is an error, and so is a ``shuffle_quality`` without
    ``shuffle_buffer_size="auto"`` (it would be ignored).
    """
    if shuffle_quality is not None and shuffle_buffer_size != AUTO:
        raise ArgumentValueError(
            f"shuffle_quality={shuffle_quality!r} sizes shuffle_buffer_size='auto' only "
            f"(got shuffle_buffer_size={shuffle_buffer_size!r})"
        )
    if not flag("shuffle", shuffle):
        if shuffle_buffer_size is not None:
            raise ArgumentValueError(
                f"shuffle_buffer_size={shuffle_buffer_size!r} needs shuffle=True"
            )
        return "none"
    return "exact" if shuffle_buffer_size is None else "buffer"


def as_array(value: object) -> object:
    """``value``, or the array a path or URL names (:func:`open_array` semantics).

    Every public entry point that takes an array passes it through here: a
    ``str`` or ``os.PathLike`` is opened with :func:`open_array` (a
    ``path=``-less store whose root is an array); anything else is returned
    as is, for :func:`as_source` to describe or refuse.
    """
    if isinstance(value, str | os.PathLike):
        return open_array(value)
    return value


def merged_io_concurrency(concurrency: object, io: object) -> int | None:
    """``io_concurrency``, or its former name ``concurrency``; both must agree."""
    old = None if concurrency is None else positive_int("concurrency", concurrency)
    new = io_concurrency(io)
    if old is not None and new is not None and old != new:
        raise ArgumentValueError(
            f"concurrency={old} and io_concurrency={new} disagree; concurrency is the "
            "former name of io_concurrency: pass io_concurrency only"
        )
    return new if new is not None else old


# --------------------------------------------------------------------------
# Read options


@dataclass(frozen=True)
class ReadOptions:
    """How a stream reads: where, how long it waits, what it does about faults.

    The read keywords of every entry point (the stream constructors,
    ``map_chunks``, ``reduce_chunks``, ``feature_moments``, ``map_to_zarr``,
    ``write_shuffled`` and ``Loader``), documented here once and validated
    once (each check names the parameter and the value).  Each entry point
    takes them flat (``retries=5``) or as one value (``read=ReadOptions(retries=5)``)
    to share one set across streams; a flat keyword given beside ``read=``
    must agree with it (``read_options``).  Constructing one, also through
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
    """

    client: Any = field(default=None, compare=False)
    timeout: float | None = None
    missing: MissingMode = "fill"
    on_error: OnError = "raise"
    retries: int = DEFAULT_RETRIES
    io_concurrency: int | None = None
    cache: ChunkCache | None = field(default=None, compare=False)

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

    @property
    def policy(self) -> ReadPolicy:
        """The read policy, without a request limit (a stream adds its own: ``limited``)."""
        return ReadPolicy(self.missing, self.on_error, self.retries, cache=self.cache)

    def keywords(self) -> dict[str, Any]:
        """The fields as the flat keywords of the entry points (``client=...``, ...)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def read_options(read: object = None, /, **flat: Any) -> ReadOptions:
    """An entry point's read options: ``read=`` or its flat read keywords, validated once.

    Parameters
    ----------
    read : ReadOptions, optional
        The ``read=`` argument; ``None``: the flat keywords alone.
    **flat : Any
        The entry point's flat read keywords (``client``, ``timeout``, ...:
        the fields of :class:`ReadOptions`), at their defaults when not given.

    Returns
    -------
    ReadOptions
        ``ReadOptions(**flat)`` without ``read``; else ``read``.

    Raises
    ------
    ArgumentTypeError
        ``read`` is not a ``ReadOptions``.
    ArgumentValueError
        A flat keyword is set (not its default) beside ``read`` to another
        value than ``read`` holds; the message names it.  One set to the
        value ``read`` holds is allowed.
    """
    if read is None:
        return ReadOptions(**flat)
    if not isinstance(read, ReadOptions):
        raise ArgumentTypeError(
            f"read must be a ReadOptions or None, got {reprlib.repr(read)} of type "
            f"{type(read).__name__}"
        )
    defaults = {f.name: f.default for f in dataclasses.fields(ReadOptions)}
    unknown = sorted(set(flat) - set(defaults))
    if unknown:
        raise ArgumentTypeError(f"not read options: {unknown}")
    given = {k: v for k, v in flat.items() if v is not defaults[k] and v != defaults[k]}
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


# --------------------------------------------------------------------------
# The epoch spec


@dataclass(frozen=True)
class StreamSpec:
    """One epoch of a batch stream, validated: what to read, in what order, how.

    Made by every batch stream constructor and by [`plan_epoch`][daskzarr_batches.plan_epoch], and
    kept as ``stream.spec``.  Constructing one (also through
    ``dataclasses.replace``) validates and normalises every field, whatever
    the shuffle mode uses, so a value that reaches the plan is always valid.

    Parameters
    ----------
    sources : tuple
        The arrays (``zarr.Array``, ``dask.array.Array``, ``numpy.ndarray``),
        one or more, all with the same length along axis 0.  Stored as sources.
    batch_size : int
        Samples per batch (>= 1).
    shuffle : {"none", "buffer", "exact"}, default "none"
        Sequential order, a shuffle buffer of ``shuffle_buffer_size``
        samples, or an exact permutation within ``memory_budget``.
    seed : int, optional
        Entropy of the shuffle (non-negative).  ``None`` draws fresh entropy
        for a shuffled spec; the drawn value is kept, so the epoch repeats
        from the spec.  Must be ``None`` for ``shuffle="none"``.
    epoch : int, default 0
        Mixed into the seed: each epoch of a seed has its own order.
    shuffle_buffer_size : int or str, optional
        Samples in the shuffle buffer; given exactly when ``shuffle="buffer"``.
        A string is a size in bytes (``"256MiB"``, ``"1GB"``: `byte_size`),
        converted to the samples it holds (at least 1; `buffer_samples`);
        the spec keeps the number of samples.  ``"auto"``: the smallest
        buffer of whole units whose batch mixing reaches ``shuffle_quality``
        of an exact shuffle's (`smallest_buffer`), within
        ``memory_budget`` (else the largest within it, and a
        ``ShuffleQualityWarning``); the spec keeps the samples chosen.
    shuffle_quality : float, optional
        The target of ``shuffle_buffer_size="auto"`` (in ``(0, 1]``; default
        ``DEFAULT_SHUFFLE_QUALITY``), kept with the size it chose.
    memory_budget : int, default ``DEFAULT_MEMORY_BUDGET``
        Bytes of samples the windows of an exact shuffle may hold at once;
        for ``shuffle_buffer_size="auto"``, what the ``prefetch + 1``
        buffers alive at once may hold.
    window_bytes : int, default ``DEFAULT_WINDOW_BYTES``
        Target decoded bytes of one sequential window.
    prefetch : int, optional
        Windows computed ahead of the one being consumed.  ``None``: 0 for
        the exact shuffle (each prefetched window would split
        ``memory_budget`` and multiply the reads), ``DEFAULT_PREFETCH``
        otherwise.
    drop_remainder : bool, default False
        Whether the short last batch is dropped (its samples are not read).
    client : distributed.Client, optional
        Where windows are computed; ``None`` resolves to the client dask's
        configuration points at, if any, else the local threads.
    timeout : float, optional
        Seconds to wait for one window; ``None``, ``inf`` or values of
        ``threading.TIMEOUT_MAX`` or more wait forever (stored as ``None``).
    roles : tuple of str, optional
        How errors name the arrays; default ``("array",)`` for one array and
        ``("features", "labels")`` for two.
    missing : {"fill", "warn", "error"}, default "fill"
        Chunks absent from the store: the fill value (what the Zarr spec
        says an absent chunk holds; counted in ``stats.chunks_missing``), the
        fill value with one warning per stream, or
        [`MissingChunkError`][daskzarr_batches.MissingChunkError].
    on_error : {"raise", "skip"}, default "raise"
        Chunks that do not decode: [`CorruptChunkError`][daskzarr_batches.CorruptChunkError], or
        their
        samples leave the epoch (from every array), with a warning.
    retries : int, default 3
        Retries of one read after a transient fault (backoff with jitter).
    io_concurrency : int, optional
        Store requests the stream's reads keep in flight at most;
        ``None``: no limit beyond the stream's own (the windows in flight,
        ``prefetch + 1`` windows' worth of samples, read at once, each
        requesting its chunks concurrently).  Decoding is bounded
        separately, by Zarr's executor.  On a cluster the limit holds
        within each read task on its worker.
    ramp : bool, default True
        Fast start: the first sequential window is read as windows of 1, 1,
        2, 4, ... units (``EpochPlan.ramp``).  ``False`` gives the flat
        windows of earlier versions.  Buffered shuffles are never ramped:
        their first window is the first buffer, read concurrently.
    cache : ChunkCache, optional
        Decoded chunks served from (and kept in) this cache.
    layout : streams.patch.Layout, optional
        How a batch's arrays are packed for the caller (patch streams: pairs,
        dicts, origins); ``None``: an array, or a tuple for several.
    sampler : ClassSampler, optional
        Class-balanced or weighted sampling: the epoch is its draws (needs
        ``shuffle="exact"``); ``n_samples`` is their number.
    labels : str, optional
        The role (a dict key) of the array of discrete labels: the stream's
        ``stats.quality`` then reports ``label_mixing`` and warns
        (``ShuffleQualityWarning``) at the end of an epoch whose label
        mixing is below ``LABEL_MIXING_WARNING``.

    Raises
    ------
    ArgumentTypeError, ArgumentValueError, LengthMismatchError
        A field has the wrong type or value (the message names it).
    """

    sources: tuple[Source, ...]
    batch_size: int
    shuffle: ShuffleMode = "none"
    seed: int | None = None
    epoch: int = 0
    shuffle_buffer_size: int | str | None = None
    memory_budget: int = DEFAULT_MEMORY_BUDGET
    window_bytes: int = DEFAULT_WINDOW_BYTES
    prefetch: int | None = None
    drop_remainder: bool = False
    client: Any = field(default=None, compare=False)
    timeout: float | None = None
    roles: tuple[str, ...] = ()
    missing: MissingMode = "fill"
    on_error: OnError = "raise"
    retries: int = DEFAULT_RETRIES
    io_concurrency: int | None = None
    ramp: bool = True
    layout: Any = field(default=None, compare=False)
    cache: ChunkCache | None = field(default=None, compare=False)
    return_sources: bool = False
    shuffle_quality: float | None = None
    sampler: ClassSampler | None = field(default=None, compare=False)
    labels: str | None = None

    def __post_init__(self) -> None:
        def put(name: str, value: object) -> None:
            object.__setattr__(self, name, value)

        arrays = tuple(self.sources) if isinstance(self.sources, tuple | list) else ()
        if not arrays:
            raise ArgumentTypeError(f"sources must be a tuple of arrays, got {self.sources!r}")
        roles = tuple(self.roles)
        if isinstance(arrays[-1], SourcesSource):  # made by this spec: made again below
            arrays = arrays[:-1]
            roles = roles[: len(arrays)]
        arrays = _unpaired(arrays)
        roles = roles or _default_roles(len(arrays))
        if len(roles) != len(arrays):
            raise ArgumentValueError(f"roles {roles!r} do not match {len(arrays)} arrays")
        sources = tuple(row_source(a, r) for a, r in zip(arrays, roles, strict=True))
        _check_subsets(sources, roles)
        _check_lengths(sources, roles)
        _check_mixtures(sources, roles)
        put("return_sources", flag("return_sources", self.return_sources))
        if self.return_sources:
            sources = (*sources, _provenance(sources[0], roles[0]))
            roles = (*roles, "sources")
        put("sources", sources)
        put("roles", tuple(roles))
        put("batch_size", positive_int("batch_size", self.batch_size))
        if self.shuffle not in get_args(ShuffleMode):
            raise ArgumentValueError(
                f"shuffle must be one of {get_args(ShuffleMode)}, got {self.shuffle!r}"
            )
        put("epoch", non_negative_int("epoch", self.epoch))
        put("memory_budget", positive_int("memory_budget", self.memory_budget))
        put("window_bytes", positive_int("window_bytes", self.window_bytes))
        put("drop_remainder", flag("drop_remainder", self.drop_remainder))
        put("ramp", flag("ramp", self.ramp))
        read = ReadOptions(
            self.client, self.timeout, self.missing, self.on_error, self.retries,
            self.io_concurrency, self.cache,
        )  # fmt: skip
        for name in ("client", "timeout", "retries", "io_concurrency"):  # as normalised
            put(name, getattr(read, name))
        buffer = self.shuffle_buffer_size
        seed = None if self.seed is None else non_negative_int("seed", self.seed)
        if self.shuffle == "none" and (buffer is not None or seed is not None):
            raise ArgumentValueError(
                f"seed={seed!r} / shuffle_buffer_size={buffer!r} were given for a sequential "
                "order (plan_epoch's shuffle=False); they apply to shuffled streams only"
            )
        if self.shuffle == "exact" and buffer is not None:
            raise ArgumentValueError(
                f"shuffle='exact' takes no shuffle_buffer_size (got {buffer!r}); "
                "use shuffle='buffer'"
            )
        if self.shuffle != "none" and seed is None:
            seed = int(np.random.SeedSequence().entropy)  # type: ignore[arg-type]
        put("seed", seed)
        if self.prefetch is None:
            put("prefetch", 0 if self.shuffle == "exact" else DEFAULT_PREFETCH)
        else:
            put("prefetch", non_negative_int("prefetch", self.prefetch))
        if self.sampler is not None:
            _check_sampler(self.sampler, self.shuffle, sources, self.mix)
        if self.labels is not None:
            _check_labels(self.labels, sources, tuple(roles))
        if self.shuffle_quality is not None:
            put("shuffle_quality", _quality_target(self.shuffle_quality))
        if self.shuffle == "buffer" and buffer == AUTO:
            put("shuffle_quality", self.shuffle_quality or DEFAULT_SHUFFLE_QUALITY)
            put("shuffle_buffer_size", self._auto_buffer())
        elif self.shuffle == "buffer":
            put("shuffle_buffer_size", buffer_samples(buffer, self.row_bytes))
        if any(isinstance(source, PatchSource) for source in sources):
            # a patch grid's units (the plan's "chunks") fit the window when they can
            rows = self.window_rows
            put("sources", tuple(_sized(source, rows) for source in sources))

    def _offsets(self) -> tuple[np.ndarray, ...]:
        return tuple(chunk_offsets(source.chunks[0]) for source in self.sources)

    def _auto_buffer(self) -> int:
        """``shuffle_buffer_size="auto"``: the smallest buffer meeting ``shuffle_quality``.

        Held to this epoch's own batch mixing given its windows
        (``EpochPlan.expected_mixing`` for the spec's ``(seed, epoch)``), so
        every epoch meets the target, not their mean; another epoch (the
        ``Loader``'s next, :meth:`with_epoch`) sizes its own buffer.  When no
        buffer within ``memory_budget`` meets it, the largest that fits, with
        a :class:`ShuffleQualityWarning` naming what it reaches.
        """
        assert self.prefetch is not None and self.shuffle_quality is not None
        offsets = self._offsets()
        chunk_units = sample_units(offsets, self.n_samples)
        unit_rows = int(np.diff(chunk_units).max(initial=1))
        most_rows = self.memory_budget // ((self.prefetch + 1) * self.row_bytes)
        plans: dict[int, EpochPlan] = {}  # one plan per candidate

        def plan(rows: int) -> EpochPlan:
            if rows not in plans:
                plans[rows] = self._plan_for(offsets, rows)
            return plans[rows]

        def figure(rows: int) -> float:
            return self._planned(plan(rows))

        target = self.shuffle_quality
        rows, reached = smallest_buffer(
            lambda rows: plan(rows).units,
            unit_rows,
            most_rows,
            target,
            self.n_samples,
            planned=figure,
            estimate_rows=figure,
            largest=True,
        )
        if reached < target:
            warn_caller(
                ShuffleQualityWarning(
                    f"shuffle_buffer_size='auto': no buffer within memory_budget="
                    f"{self.memory_budget} bytes ({self.prefetch + 1} buffers of "
                    f"{self.row_bytes} bytes a sample) reaches shuffle_quality={target} "
                    f"(batch mixing, a fraction of an exact shuffle's); the largest, {rows} "
                    f"samples ({rows // unit_rows} chunks of {unit_rows}), reaches "
                    f"{reached:.3f}. Ways out: the exact shuffle (shuffle_buffer_size=None; "
                    "with cache=ChunkCache(...) later epochs read from the cache), "
                    "write_shuffled(...) once and a buffered shuffle of its output, smaller "
                    "chunks (a buffer of the same bytes holds more of them), or a larger "
                    "memory_budget / lower shuffle_quality"
                )
            )
        object.__setattr__(self, "_figure", (rows, reached))
        return rows

    def buffer_figure(self) -> float | None:
        """The batch mixing ``"auto"`` held the buffer to.

        This epoch's figure given its windows (``EpochPlan.expected_mixing``;
        ``summary().quality.mixing`` is the realised one, within the noise of
        the row shuffles), at least ``shuffle_quality`` unless a
        [`ShuffleQualityWarning`][daskzarr_batches.ShuffleQualityWarning] said otherwise.
        ``None`` unless the
        buffer was chosen by ``shuffle_buffer_size="auto"`` (``shuffle_quality``
        is set).  Kept from the choice, so asking costs nothing.
        """
        if self.shuffle != "buffer" or self.shuffle_quality is None:
            return None
        rows = self.window_rows
        kept = self.__dict__.get("_figure")
        if kept is not None and kept[0] == rows:
            return float(kept[1])
        figure = self._planned(self._plan_for(self._offsets(), rows))
        object.__setattr__(self, "_figure", (rows, figure))
        return figure

    def _planned(self, plan: EpochPlan) -> float:
        """The figure "auto" holds a candidate buffer to: its epoch's expected mixing.

        Per unit and distinct chunk share, never per row, so a candidate costs
        milliseconds at any length (``plan.quality``).
        """
        figure = plan.expected_mixing()
        return 1.0 if figure is None else figure

    def _plan_for(self, offsets: tuple[np.ndarray, ...], rows: int) -> EpochPlan:
        """This epoch's plan with a buffer of ``rows`` (``plan()`` when it is the spec's)."""
        return EpochPlan(
            n_samples=self.n_samples,
            offsets=offsets,
            batch_size=self.batch_size,
            drop_remainder=self.drop_remainder,
            shuffle="buffer",
            window_rows=rows,
            seed=self.seed or 0,
            epoch=self.epoch,
            row_bytes=tuple(source.row_bytes for source in self.sources),
            shards=tuple(shard_layout(source) for source in self.sources),
            ramp=self.ramp,
            mix=self.mix,
            members=_members(self.sources[0]),
        )

    @property
    def read(self) -> ReadOptions:
        """The spec's read options (``client`` ... ``io_concurrency``) as one value."""
        return ReadOptions(
            self.client, self.timeout, self.missing, self.on_error, self.retries,
            self.io_concurrency, self.cache,
        )  # fmt: skip

    @property
    def paired(self) -> bool:
        """Whether batches are tuples of arrays (features and labels)."""
        return len(self.sources) > 1

    @property
    def n_samples(self) -> int:
        """Samples per epoch: the length of axis 0, shared by every array (a mixture's draws)."""
        if self.mix is not None:
            return self.mix.n_samples
        if self.sampler is not None:
            return self.sampler.draws
        return self.sources[0].n_samples

    @functools.cached_property
    def mix(self) -> MixOrder | None:
        """A mixture's draws (``plan.mix``), when the arrays are mixtures
        ([`mix`][daskzarr_batches.mix])."""
        mixed = [s for s in self.sources if isinstance(s, MixSource)]
        if not mixed:
            return None
        first = mixed[0]
        return MixOrder(
            lengths=tuple(member.n_samples for member in first.members),
            offsets=tuple(
                tuple(chunk_offsets(source.members[k].chunks[0]) for source in mixed)
                for k in range(len(first.members))
            ),
            shards=tuple(
                tuple(shard_layout(source.members[k]) for source in mixed)
                for k in range(len(first.members))
            ),
            weights=first.weights,
            stop=first.stop,
            samples_per_epoch=first.samples_per_epoch,
            seed=first.seed,
        )

    @property
    def row_bytes(self) -> int:
        """Decoded bytes of one sample, summed over the arrays (at least 1)."""
        return max(sum(source.row_bytes for source in self.sources), 1)

    @property
    def window_rows(self) -> int:
        """Samples per window, as the shuffle mode sizes it.

        Sequential: ``window_bytes // row_bytes``.  Buffered: the shuffle
        buffer.  Exact: what ``memory_budget`` holds once split between the
        ``prefetch + 1`` windows alive at once, their index arrays and their
        decoded chunks in flight (`exact_budget`).
        """
        if self.shuffle == "buffer":
            assert isinstance(self.shuffle_buffer_size, int)  # resolved to samples
            return self.shuffle_buffer_size
        if self.shuffle == "exact":
            return self._exact_budget().window_rows
        return max(1, self.window_bytes // self.row_bytes)

    @property
    def decode_bytes(self) -> int | None:
        """Decoded bytes one window read may have in flight (at least a chunk).

        Set for the exact shuffle only (its share of ``memory_budget``);
        ``None``: the read layer's own bound (``DECODE_GROUP_BYTES``).
        """
        return self._exact_budget().decode_bytes if self.shuffle == "exact" else None

    def _exact_budget(self) -> ExactBudget:
        assert self.prefetch is not None  # resolved in __post_init__
        return exact_budget(self.memory_budget, self._held_row_bytes(), self.prefetch)

    def _held_row_bytes(self) -> int:
        """Bytes a window holds per sample (``row_bytes``, but for joins on a cluster).

        On a cluster a collection's window is its members' reads, each on any
        worker, joined by one task into an output of its own: the joining
        worker holds the collection's rows twice, so they count twice.  Read
        here the members fill one output (``read.graphs``): once.  The order
        does not change (an exact shuffle's windows only cut one permutation).
        """
        if self.client is None:
            return self.row_bytes
        held = sum(source.row_bytes * (2 if _joined(source) else 1) for source in self.sources)
        return max(held, 1)

    def plan(self) -> EpochPlan:
        """The epoch's plan: windows of chunk reads, pure index math."""
        return EpochPlan(
            n_samples=self.n_samples,
            offsets=tuple(chunk_offsets(source.chunks[0]) for source in self.sources),
            batch_size=self.batch_size,
            drop_remainder=self.drop_remainder,
            shuffle=self.shuffle,
            window_rows=self.window_rows,
            seed=self.seed or 0,
            epoch=self.epoch,
            row_bytes=tuple(source.row_bytes for source in self.sources),
            shards=tuple(shard_layout(source) for source in self.sources),
            ramp=self.ramp,
            mix=self.mix,
            members=_members(self.sources[0]),
            sampler=self.sampler,
        )

    def with_epoch(self, epoch: int) -> StreamSpec:
        """The same spec for another epoch (same seed: a new order).

        With ``shuffle_buffer_size="auto"`` the epoch sizes its own buffer
        (the smallest meeting ``shuffle_quality`` in that epoch's plan).
        """
        if epoch == self.epoch:
            return self
        if self.shuffle == "buffer" and self.shuffle_quality is not None:
            return dataclasses.replace(self, epoch=epoch, shuffle_buffer_size=AUTO)
        return dataclasses.replace(self, epoch=epoch)


def _check_sampler(
    sampler: object, shuffle: str, sources: tuple[Source, ...], mix: MixOrder | None
) -> None:
    """A :class:`ClassSampler` draws the epoch: shuffled, not buffered, one label per sample."""
    if not isinstance(sampler, ClassSampler):
        raise ArgumentTypeError(f"sampler must be a ClassSampler, got {sampler!r}")
    if shuffle != "exact":
        raise ArgumentValueError(
            f"sampler={sampler!r} draws its own order: it needs shuffle=True without "
            f"shuffle_buffer_size (got shuffle={shuffle!r})"
        )
    if mix is not None:
        raise ArgumentValueError("sampler and mixtures (mix) cannot be combined")
    if sampler.n_ids != sources[0].n_samples:
        raise LengthMismatchError(
            f"sampler has {sampler.n_ids} labels for arrays of {sources[0].n_samples} samples"
        )


def _check_labels(labels: object, sources: tuple[Source, ...], roles: tuple[str, ...]) -> None:
    """``labels`` names one array of discrete labels: one value per sample."""
    if not isinstance(labels, str):
        raise ArgumentTypeError(f"labels must name an array (a str), got {labels!r}")
    if labels not in roles:
        raise ArgumentValueError(f"labels={labels!r} names none of the arrays {list(roles)!r}")
    source = sources[roles.index(labels)]
    if len(source.shape) != 1 or np.dtype(source.dtype).kind not in "biuUSO":
        raise ArgumentValueError(
            f"labels={labels!r} must be a 1-D array of discrete labels (integers, bools, "
            f"strings), got shape {source.shape} and dtype {source.dtype}"
        )


def _provenance(first: Source, role: str) -> SourcesSource:
    """The ``return_sources`` output of a stream whose first array is ``first``."""
    collection = first.read_collection()
    if collection is None:
        raise ArgumentValueError(
            f"return_sources=True needs a collection (concat or open_collection), but "
            f"{role} is {first.name}; a single array's samples come from that array"
        )
    return sources_source(first, collection)


def _joined(source: Source) -> bool:
    """Whether a window of ``source`` is read per member and joined (a collection)."""
    return source.read_collection() is not None


def _members(source: Source) -> tuple[int, ...]:
    """A collection's member offsets (for the source entropy); empty for one array."""
    return source.member_offsets()


def _quality_target(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ArgumentTypeError(
            f"shuffle_quality must be a number in (0, 1], got {value!r} of type "
            f"{type(value).__name__}"
        )
    if not 0 < float(value) <= 1:
        raise ArgumentValueError(
            f"shuffle_quality must be in (0, 1] (a fraction of an exact shuffle's "
            f"batch mixing), got {value!r}"
        )
    return float(value)


def _sized(source: Source, rows: int) -> Source:
    return source.sized(rows)


def row_source(array: object, role: str) -> Source:
    """``array`` (a path opened) as the source of a row stream: samples along axis 0.

    A chunk subset split along another axis is refused: its rows would not
    be whole samples (such splits are for patch and chunk streams).
    """
    source = as_source(as_array(array), role)
    if isinstance(source, SubsetSource) and source.axis != 0:
        raise ArgumentValueError(
            f"{role} ({source.name}) is split along axis {source.axis}; row streams "
            "(batch streams, plan_epoch, Loader, count_batches) take samples along axis 0, "
            "so they need a split with dim=0; a split along another axis is for chunk "
            "streams and map/reduce"
        )
    return source


def _unpaired(arrays: tuple[Any, ...]) -> tuple[Any, ...]:
    """The arrays of a stream: a chunk subset of a tuple of arrays stands for its arrays."""
    if len(arrays) == 1 and isinstance(arrays[0], ChunkSubset) and arrays[0].paired:
        subset = arrays[0]
        if isinstance(subset.data, Mapping):
            raise ArgumentTypeError(
                f"chunk subset {subset.index} is of a dict of arrays {list(subset.data)!r}; "
                "row streams take a tuple: pass its arrays' subsets, e.g. "
                f"paired_batch_stream(subset[{next(iter(subset.data))!r}], subset[...], ...), "
                "or a Loader the dict {name: subset[name]}"
            )
        return tuple(subset)
    return arrays


def _check_subsets(sources: tuple[Source, ...], roles: tuple[str, ...]) -> None:
    """Arrays read together are all chunk subsets of the same ranges, or none is."""
    subsets = [isinstance(source, SubsetSource) for source in sources]
    if not any(subsets):
        return
    if not all(subsets):
        plain = [role for role, subset in zip(roles, subsets, strict=True) if not subset]
        raise ArgumentValueError(
            f"{', '.join(plain)} is a whole array but the other arrays are chunk subsets; "
            "split the arrays together (chunk_split of a tuple) and pass the subsets"
        )
    first = sources[0]
    for role, source in zip(roles[1:], sources[1:], strict=True):
        assert isinstance(source, SubsetSource) and isinstance(first, SubsetSource)
        if source.ranges != first.ranges:
            raise ArgumentValueError(
                f"{role} is a chunk subset of other positions than {roles[0]} "
                f"({_ranges_text(source.ranges)} against {_ranges_text(first.ranges)}); "
                "paired subsets must come from one split of the arrays together "
                "(chunk_split of a tuple), subset[0] and subset[1]"
            )


def _check_mixtures(sources: tuple[Source, ...], roles: tuple[str, ...]) -> None:
    """Arrays read together are all mixtures of one rule (pairs drawn together), or none is."""
    mixed = [isinstance(source, MixSource) for source in sources]
    if not any(mixed):
        return
    if not all(mixed):
        plain = [role for role, m in zip(roles, mixed, strict=True) if not m]
        raise ArgumentValueError(
            f"{', '.join(plain)} is not a mixture but the other arrays are; mix paired "
            "arrays together (mix of dicts or tuples) and pass its mixtures"
        )
    rules = {source.rule for source in sources if isinstance(source, MixSource)}
    if len(rules) > 1:
        raise ArgumentValueError(
            f"the mixtures of {', '.join(roles)} draw differently (lengths, weights, stop, "
            "samples_per_epoch or seed differ); mix paired arrays in one call "
            "(mix([{'x': x1, 'y': y1}, {'x': x2, 'y': y2}], weights))"
        )


def _ranges_text(ranges: tuple[tuple[int, int], ...]) -> str:
    shown = ", ".join(f"{a}:{b}" for a, b in ranges[:3])
    return f"[{shown}{', ...' if len(ranges) > 3 else ''}]"


def _default_roles(count: int) -> tuple[str, ...]:
    if count == 1:
        return ("array",)
    if count == 2:
        return ("features", "labels")
    return tuple(f"array {i}" for i in range(count))


def _check_lengths(sources: tuple[Source, ...], roles: tuple[str, ...]) -> None:
    lengths = [source.n_samples for source in sources]
    if len(set(lengths)) > 1:
        described = " but ".join(
            f"{role} has {n} samples (shape {source.shape})"
            for role, n, source in zip(roles, lengths, sources, strict=True)
        )
        raise LengthMismatchError(f"paired arrays must have the same length: {described}")


# --------------------------------------------------------------------------
# The chunk stream spec


@dataclass(frozen=True)
class ChunkSpec:
    """One chunk stream, validated: its array, order, index and read options.

    Made by :func:`chunk_stream`, :func:`map_chunks` (and the reductions on
    it); the transform is the caller's (checked where it is given).

    Parameters
    ----------
    source : array
        A ``zarr.Array``, ``dask.array.Array`` or ``numpy.ndarray`` (stored as
        its source).
    ordered : bool, default True
        C order of block index, or as reads complete.
    with_index : bool, default False
        Items are ``(block_index, item)`` tuples.
    read : ReadOptions
        How the stream reads.
    """

    source: Source
    ordered: bool = True
    with_index: bool = False
    read: ReadOptions = field(default_factory=ReadOptions)

    def __post_init__(self) -> None:
        put = functools.partial(object.__setattr__, self)
        put("source", as_source(as_array(self.source)))
        put("ordered", flag("ordered", self.ordered))
        put("with_index", flag("with_index", self.with_index))
        if not isinstance(self.read, ReadOptions):
            raise ArgumentTypeError(f"read must be ReadOptions, got {self.read!r}")
