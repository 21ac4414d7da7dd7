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

The scalar checks are in ``streams.checks``, :class:`ReadOptions` in
``streams.read_options`` and the checks of a stream's arrays in
``streams.arrays``; every name is re-exported here.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any, get_args

import numpy as np

from ..errors import ArgumentTypeError, ArgumentValueError, ShuffleQualityWarning, warn_caller
from ..plan.budget import ExactBudget, exact_budget
from ..plan.defaults import (
    DEFAULT_IO_CONCURRENCY,
    DEFAULT_MEMORY_BUDGET,
    DEFAULT_PATCH_WINDOW_BYTES,
    DEFAULT_PREFETCH,
    DEFAULT_WINDOW_BYTES,
)
from ..plan.epoch import EpochPlan
from ..plan.mix import MixOrder
from ..plan.quality import DEFAULT_SHUFFLE_QUALITY, smallest_buffer
from ..plan.sampling import ClassSampler
from ..plan.windows import ShuffleMode, chunk_offsets, sample_units
from ..store.cache import ChunkCache
from ..store.collections import SourcesSource
from ..store.layout import shard_layout
from ..store.policy import DEFAULT_RETRIES, MissingMode, OnError
from ..store.sources import Source, as_source
from .arrays import (
    _check_labels,
    _check_lengths,
    _check_mixtures,
    _check_sampler,
    _check_subsets,
    _default_roles,
    _joined,
    _members,
    _provenance,
    _ranges_text,  # noqa: F401  (re-exported: was defined here)
    _sized,
    _unpaired,
    row_source,
)
from .checks import (
    AUTO,
    _integer,  # noqa: F401  (re-exported: was defined here)
    _is_integer,  # noqa: F401  (re-exported: was defined here)
    _quality_target,
    as_array,
    buffer_samples,
    byte_size,
    default_prefetch,
    flag,
    io_concurrency,
    merged_io_concurrency,
    non_negative_int,
    positive_int,
    sample_count,
    shuffle_mode,
    timeout_seconds,
)
from .read_options import UNSET, ReadOptions, read_options

__all__ = [
    "DEFAULT_IO_CONCURRENCY",
    "DEFAULT_MEMORY_BUDGET",
    "DEFAULT_PATCH_WINDOW_BYTES",
    "DEFAULT_PREFETCH",
    "DEFAULT_WINDOW_BYTES",
    "UNSET",
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
    "sample_count",
    "shuffle_mode",
    "timeout_seconds",
]


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
        buffer of whole units whose batch mixing (the epoch's mean over its
        batches, its windows balanced) reaches ``shuffle_quality`` of an exact
        shuffle's (`smallest_buffer`), within ``memory_budget`` (else the
        largest within it, and a ``ShuffleQualityWarning``); kept as samples.
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
        Windows computed ahead of the one being consumed.  ``None``: 0 for the
        exact shuffle (each prefetched window would split ``memory_budget``), else
        ``DEFAULT_PREFETCH``, on a cluster two per worker thread (``default_prefetch``).
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
        Store requests the stream's reads keep in flight at most; ``None``:
        no limit beyond the stream's own (``prefetch + 1`` windows in flight,
        each requesting its chunks concurrently).  Decoding is bounded
        separately, by Zarr's executor.  On a cluster the limit holds
        within each read task on its worker.
    ramp : bool, default True
        Fast start (``EpochPlan.ramp``): the first sequential window is read
        as windows of 1, 1, 2, 4, ... units, the exact shuffle's first window
        in pieces of 1, 4, 16, ... batches (fewer than the chunks).  ``False``
        gives the flat windows of earlier versions.  Buffered shuffles are
        never ramped: their first window is the first buffer, read concurrently.
    cache, reader : optional
        Decoded chunks served from this cache; the reader factory (``ReadOptions``).
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
    reader: Any = field(default=None, compare=False)
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
        put("batch_size", sample_count("batch_size", self.batch_size))
        if self.shuffle not in get_args(ShuffleMode):
            raise ArgumentValueError(
                f"shuffle must be one of {get_args(ShuffleMode)}, got {self.shuffle!r}"
            )
        put("epoch", non_negative_int("epoch", self.epoch))
        put("memory_budget", positive_int("memory_budget", self.memory_budget))
        put("window_bytes", positive_int("window_bytes", self.window_bytes))
        put("drop_remainder", flag("drop_remainder", self.drop_remainder))
        put("ramp", flag("ramp", self.ramp))
        read = self.read
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
        if self.prefetch is None:  # on a cluster, sized to its threads
            put("prefetch", 0 if self.shuffle == "exact" else default_prefetch(self, buffer))
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
        if any(source.patch_grid is not None for source in sources):
            # a patch grid's units (the plan's "chunks") fit the window when they can
            rows = self.window_rows
            put("sources", tuple(_sized(source, rows) for source in sources))
            if self.shuffle == "buffer" and buffer == AUTO:
                self._check_auto()  # the units sized: the plan is not the one searched

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

        rows, reached = smallest_buffer(
            lambda rows: plan(rows).units,
            unit_rows,
            most_rows,
            self.shuffle_quality,
            self.n_samples,
            planned=figure,
            estimate_rows=figure,
            largest=True,
        )
        object.__setattr__(self, "_figure", (rows, reached))
        if reached < self.shuffle_quality:
            self._warn_short(rows, reached, unit_rows)
        return rows

    def _warn_short(self, rows: int, reached: float, unit_rows: int) -> None:
        """The ``ShuffleQualityWarning`` of an "auto" buffer below its target (once per spec)."""
        object.__setattr__(self, "_warned", True)
        warn_caller(
            ShuffleQualityWarning(
                f"shuffle_buffer_size='auto': no buffer within memory_budget="
                f"{self.memory_budget} bytes ({(self.prefetch or 0) + 1} buffers of "
                f"{self.row_bytes} bytes a sample) reaches shuffle_quality={self.shuffle_quality} "
                f"(batch mixing, a fraction of an exact shuffle's); the largest, {rows} "
                f"samples ({rows // unit_rows} chunks of {unit_rows}), reaches "
                f"{reached:.3f}. Ways out: the exact shuffle (shuffle_buffer_size=None; "
                "with cache=ChunkCache(...) later epochs read from the cache), "
                "write_shuffled(...) once and a buffered shuffle of its output, smaller "
                "chunks (a buffer of the same bytes holds more of them), or a larger "
                "memory_budget / lower shuffle_quality"
            )
        )

    def _check_auto(self) -> None:
        """The chosen buffer's figure again, on the plan read (a patch grid's units sized)."""
        assert self.shuffle_quality is not None
        object.__setattr__(self, "_figure", None)
        figure = self.buffer_figure()
        if (
            figure is not None
            and figure < self.shuffle_quality
            and not self.__dict__.get("_warned")
        ):
            units = sample_units(self._offsets(), self.n_samples)
            self._warn_short(self.window_rows, figure, int(np.diff(units).max(initial=1)))

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
            self.io_concurrency, self.cache, self.reader,
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
        mixed = [s for s in self.sources if s.mix_rule is not None]
        if not mixed:
            return None
        rule = mixed[0].mix_rule
        assert rule is not None
        members = [source.member_sources for source in mixed]
        return MixOrder(
            lengths=rule.lengths,
            offsets=tuple(
                tuple(chunk_offsets(of[k].chunks[0]) for of in members)
                for k in range(len(members[0]))
            ),
            shards=tuple(
                tuple(shard_layout(of[k]) for of in members) for k in range(len(members[0]))
            ),
            weights=rule.weights,
            stop=rule.stop,
            samples_per_epoch=rule.samples_per_epoch,
            seed=rule.seed,
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
