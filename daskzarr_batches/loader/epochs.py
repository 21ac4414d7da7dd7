"""The training loader: epochs, named arrays, rank shares and resumable state.

A :class:`Loader` is a re-iterable over epochs.  Each iteration builds the
epoch's :class:`StreamSpec` (same seed, the epoch's number) and a
:class:`BatchStream` over this rank's share of the epoch's positions
(``plan.batching.share``): the order is drawn once for all ranks from
``(seed, epoch)`` and then cut into equal, consecutive shares, so each rank
reads mostly its own chunks and every rank takes the same number of steps
(samples of chunks skipped as undecodable are filled from the start of the
rank's share).  Its state is the epoch, the batches this rank has yielded and
its *position* in its share (samples skipped included), plain JSON, from
which a new process continues exactly where the old one stopped; every field
is checked before a state is applied.
"""

from __future__ import annotations

import copy
import dataclasses
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from ..errors import (
    ArgumentTypeError,
    ArgumentValueError,
    DaskZarrBatchesError,
    LoaderBusyError,
    renamed_keywords,
)
from ..plan.batching import (
    Ranges,
    complement,
    count_batches,
    positions_between,
    samples_used,
    share,
    worker_part,
)
from ..plan.sampling import ClassSampler
from ..store.cache import ChunkCache
from ..store.policy import MissingMode, OnError
from ..store.requests import ReaderFactory
from ..streams.base import StreamStats
from ..streams.batch import BatchStream
from ..streams.spec import (
    DEFAULT_MEMORY_BUDGET,
    DEFAULT_PATCH_WINDOW_BYTES,
    DEFAULT_WINDOW_BYTES,
    UNSET,
    ReadOptions,
    StreamSpec,
    flag,
    non_negative_int,
    positive_int,
    read_options,
    shuffle_mode,
)
from ..streams.timing import Bottleneck
from .iteration import _Epoch, _sources
from .state import _check_progress, _intersect, _size, _state_at, _validated_states

__all__ = ["Loader"]

STATE_VERSION = 3


class Loader:
    """Minibatches for a training loop: one epoch per iteration, resumable, sharded.

    Parameters
    ----------
    data : array, tuple of arrays, dict of named arrays or xarray.Dataset
        ``zarr.Array``, ``dask.array.Array``, ``numpy.ndarray``,
        ``xarray.DataArray`` (its data, samples along its first dimension) or
        a path or URL (``str`` or ``os.PathLike``, opened with ``open_array``),
        all with the same length along axis 0 (else
        [`LengthMismatchError`][daskzarr_batches.LengthMismatchError] naming each).  Batches come
        back in the
        same structure: an array, a tuple, or a dict with the same names.  A
        ``ChunkSubset`` of ``chunk_split`` stands for its data (a subset of a
        tuple or dict of arrays for that structure) and reads only its chunks.  An
        ``xarray.Dataset`` is the dict of its data variables by name.  A
        [`Collection`][daskzarr_batches.Collection] ([`concat`][daskzarr_batches.concat],
        [`open_collection`][daskzarr_batches.open_collection]) is one
        array of many members; ``concat`` of dicts gives a dict of them.
        ``data`` as ``patch_stream``, ``map_to_zarr`` and ``chunk_split`` name
        it (its former name ``arrays=`` still works, with a
        ``DeprecationWarning``).
    batch_size : int
        Samples per batch.
    shuffle : bool, default False
        Shuffle each epoch: exactly (``shuffle_buffer_size=None``) or through
        a buffer of ``shuffle_buffer_size`` samples (or, given as a string
        such as ``"256MiB"``, the samples that many bytes hold), as
        [`shuffled_batch_stream`][daskzarr_batches.shuffled_batch_stream].
    shuffle_buffer_size : int or str, optional
        As for [`shuffled_batch_stream`][daskzarr_batches.shuffled_batch_stream].
    shuffle_quality : float, optional
        As for [`shuffled_batch_stream`][daskzarr_batches.shuffled_batch_stream].
    memory_budget : int, default DEFAULT_MEMORY_BUDGET
        As for [`shuffled_batch_stream`][daskzarr_batches.shuffled_batch_stream].
    window_bytes : int, optional
        As for [`batch_stream`][daskzarr_batches.batch_stream]; ``None``: 32 MiB,
        or 16 MiB for patches, as [`patch_stream`][daskzarr_batches.patch_stream].
    prefetch : int, optional
        Windows read ahead, as for
        [`shuffled_batch_stream`][daskzarr_batches.shuffled_batch_stream]
        (``None``: ``DEFAULT_PREFETCH``, 0 for the exact shuffle).
    seed : int, default 0
        The shuffle's seed; the order of epoch ``e`` comes from ``(seed, e)``
        exactly as the streams' ``seed=``, ``epoch=`` do.
    drop_remainder : bool, default False
        Drop this rank's short last batch.
    rank : int, default 0
        This process's share of each epoch: the epoch's order is drawn once
        for all ranks and cut into ``world_size`` equal, consecutive shares.
    world_size : int, default 1
        See ``rank``.
    even_batches : bool, default True
        ``True``: every share has ``ceil(n / world_size)`` samples, the last
        ones padded by repeating the epoch's first samples; ``False``: every
        share has ``n // world_size`` samples, the tail of the epoch is
        dropped.  Either way every rank yields the same number of batches.
    transform : callable, optional
        Applied to each batch (in its structure) in this process, after it is
        cut: normalisation, dtype or device conversion.  It does not change
        which samples a batch holds.
    input_dims : Mapping[Any, int], optional
        Samples are N-D patches (and forecast pairs), as for
        [`patch_stream`][daskzarr_batches.patch_stream]: ``data`` is then its ``data`` (an
        ``xarray.Dataset`` gives a dict of patch batches), and epochs, ranks,
        resume and ``transform`` work on patches as on rows.
    input_overlap : Mapping[Any, int], optional
        See ``input_dims``.
    target_offset : Mapping[Any, int], optional
        See ``input_dims``.
    target_dims : Mapping[Any, int], optional
        See ``input_dims``.
    target_data : Any, optional
        See ``input_dims``.
    return_origins : bool, default False
        See ``input_dims``.
    read : ReadOptions, optional
        The read options as one value, to share one set across streams; or
        the flat read keywords ``client``, ``timeout``, ``missing``,
        ``on_error``, ``retries``, ``io_concurrency``, ``cache`` and ``reader``, each a
        field of [`ReadOptions`][daskzarr_batches.ReadOptions] (documented
        there once, with its default).  A flat one given beside ``read``
        must agree with it.
    return_sources : bool, default False
        For collections: each batch also carries ``sources``, an int64
        ``(batch, 2)`` array of each sample's member and position within it;
        a dict batch gets the key ``"sources"``, a tuple or an array batch
        becomes ``(..., sources)``.
    sampler : ClassSampler, optional
        Class-balanced or weighted sampling from a label array (with
        ``shuffle=True`` and no ``shuffle_buffer_size``): each epoch is the
        sampler's ``num_samples`` draws, seeded by ``(seed, epoch)``, read as
        the exact shuffle's windows; ranks share them and ``state_dict``
        resumes them exactly as any other order.
    labels : str, optional
        The key (dict arrays) or role (``"labels"`` for a pair) of the array
        of discrete labels: each epoch's ``stats.quality`` then reports how
        far its batches' label distributions are from the epoch's
        (``label_mixing``, 1.0 as an exact shuffle's; ``label_distance``),
        and an epoch below ``LABEL_MIXING_WARNING`` (0.85) ends with a
        ``ShuffleQualityWarning``.

    Notes
    -----
    Iterating the loader runs one epoch; iterating it again runs the next one
    (``set_epoch(e)`` chooses the epoch of the next iteration instead).
    ``len()`` is the number of batches this rank yields in a whole epoch.
    ``state_dict()`` / ``load_state_dict()`` save and restore the epoch and
    the position reached in it: a loader restored from the state taken after
    batch ``k`` yields exactly batches ``k + 1, ...`` of the uninterrupted
    run, also in a new process and after skipped chunks.  Restored with
    another ``world_size``, the new ranks share the samples the old ones had
    not yet used.

    With ``on_error="skip"`` and ``world_size > 1`` a rank fills the samples
    of skipped chunks from the start of its own share, so every rank takes
    ``len()`` steps (``stats.samples_filled``); with one rank the epoch ends
    earlier instead.  A second iteration while one is running raises
    [`LoaderBusyError`][daskzarr_batches.LoaderBusyError]; after an iteration raised, its next
    ``next()``
    raises [`StreamFailedError`][daskzarr_batches.StreamFailedError].
    """

    @renamed_keywords(arrays="data")
    def __init__(
        self,
        data: Any,
        batch_size: int,
        *,
        shuffle: bool = False,
        shuffle_buffer_size: int | str | None = None,
        shuffle_quality: float | None = None,
        memory_budget: int = DEFAULT_MEMORY_BUDGET,
        window_bytes: int | None = None,
        seed: int = 0,
        drop_remainder: bool = False,
        rank: int = 0,
        world_size: int = 1,
        even_batches: bool = True,
        transform: Callable[[Any], Any] | None = None,
        prefetch: int | None = None,
        client: Any = UNSET.client,
        timeout: float | None = UNSET.timeout,
        missing: MissingMode = UNSET.missing,
        on_error: OnError = UNSET.on_error,
        retries: int = UNSET.retries,
        io_concurrency: int | None = UNSET.io_concurrency,
        cache: ChunkCache | None = UNSET.cache,
        reader: ReaderFactory | None = UNSET.reader,
        read: ReadOptions | None = None,
        input_dims: Mapping[Any, int] | None = None,
        input_overlap: Mapping[Any, int] | None = None,
        target_offset: Mapping[Any, int] | None = None,
        target_dims: Mapping[Any, int] | None = None,
        target_data: Any = None,
        return_origins: bool = False,
        return_sources: bool = False,
        sampler: ClassSampler | None = None,
        labels: str | None = None,
    ) -> None:
        self._names, self._wrap, values, roles, layout = _sources(
            data, input_dims, input_overlap=input_overlap, target_offset=target_offset,
            target_dims=target_dims, target_data=target_data, return_origins=return_origins,
        )  # fmt: skip
        if window_bytes is None:  # the stream's own default
            window_bytes = (
                DEFAULT_WINDOW_BYTES if input_dims is None else DEFAULT_PATCH_WINDOW_BYTES
            )
        mode = shuffle_mode(shuffle, shuffle_buffer_size, shuffle_quality)
        self.world_size = positive_int("world_size", world_size)
        self.rank = non_negative_int("rank", rank)
        if self.rank >= self.world_size:
            raise ArgumentValueError(f"rank must be < world_size={world_size}, got {rank}")
        self.even_batches = flag("even_batches", even_batches)
        self.drop_remainder = flag("drop_remainder", drop_remainder)
        if transform is not None and not callable(transform):
            raise ArgumentTypeError(f"transform must be callable or None, got {transform!r}")
        self.transform = transform
        self.spec = StreamSpec(
            values,
            batch_size,
            shuffle=mode,
            seed=non_negative_int("seed", seed) if mode != "none" else None,
            shuffle_buffer_size=shuffle_buffer_size,
            shuffle_quality=shuffle_quality,
            memory_budget=memory_budget,
            window_bytes=window_bytes,
            prefetch=prefetch,
            roles=roles or (),
            **read_options(
                read,
                client=client,
                timeout=timeout,
                missing=missing,
                on_error=on_error,
                retries=retries,
                io_concurrency=io_concurrency,
                cache=cache,
                reader=reader,
            ).keywords(),
            layout=layout,
            return_sources=return_sources,
            sampler=sampler,
            labels=labels,
        )
        if self.spec.return_sources and self._names is not None and "sources" in self._names:
            raise ArgumentValueError(
                "return_sources=True adds the key 'sources' to each batch, but the arrays "
                "already have one of that name; rename it"
            )
        self._epoch = 0
        self._batches = 0  # batches of the current epoch this rank has yielded
        self._position = 0  # where this rank is in its share (skipped samples included)
        #: what the current (or last) epoch's stream read and yielded
        self.stats = StreamStats()
        self._resumed: Ranges | None = None  # the positions left after an elastic restore
        self._part: tuple[int, int] | None = None  # (worker, workers) of a worker's loader
        self._base = 0  # where the rank was in its share when this worker's part was cut
        self._busy = threading.Lock()  # held by the running iteration
        #: a device feed's progress after the batch it last handed out, while it iterates
        #: this loader (its batches put ahead are not counted in state_dict())
        self._handed: tuple[Any, ...] | None = None

    # ------------------------------------------------------------------ epochs

    @property
    def epoch(self) -> int:
        """The epoch the next (or current) iteration runs."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Run epoch ``epoch`` in the next iteration (from its start)."""
        self._epoch = non_negative_int("epoch", epoch)
        self._restart()

    def _restart(self) -> None:
        """Forget the progress in the current epoch: the next iteration runs it whole."""
        self._batches = 0
        self._position = 0
        self._resumed = None
        self._base = 0

    def __len__(self) -> int:
        """Batches this rank (this worker, for :meth:`worker`) yields in a whole epoch."""
        return count_batches(self._share_size(), self.spec.batch_size, self.drop_remainder)

    def __iter__(self) -> _Epoch:
        return _Epoch(self._run())

    def _run(self) -> Iterator[Any]:
        """The current epoch's batches (the generator behind an iteration)."""
        if not self._busy.acquire(blocking=False):
            raise LoaderBusyError(
                f"this Loader is already being iterated (epoch {self._epoch}, batch "
                f"{self._batches}/{len(self)}): finish or close that iterator first, or give "
                "each thread a Loader of its own"
            )
        self._handed = None  # a feed's record of an iteration before is stale now
        stream: BatchStream | None = None
        try:
            stream = self.stream()
            self.stats = stream.stats
            with stream:
                for batch in stream:
                    # a transform that raises leaves its batch uncounted: the progress is
                    # that of the batches handed out, which a re-iteration goes on from
                    shaped = self._shape(batch)
                    self._batches += 1
                    self._position = stream.position
                    yield shaped
            stream = None
            self._epoch += 1
            self._restart()
        finally:
            self._busy.release()

    def bottleneck(self) -> Bottleneck:
        """The stage that limited the current (or last) epoch: ``self.stats.bottleneck()``.

        Store requests, decoding, assembling batches or the consumer's own
        step, with the numbers behind it and the setting to change
        ([`Bottleneck`][daskzarr_batches.streams.timing.Bottleneck]).
        """
        return self.stats.bottleneck()

    def stream(self) -> BatchStream:
        """The [`BatchStream`][daskzarr_batches.BatchStream] of what is left of this rank's
        current epoch.

        It walks this rank's share from the position the loader has reached;
        with ``world_size > 1`` it fills the samples of chunks skipped as
        undecodable (``on_error="skip"``) from the start of the share, so that
        every rank takes ``len()`` steps.
        """
        spec = self.spec.with_epoch(self._epoch)
        positions = self._positions()
        used = samples_used(_size(positions), spec.batch_size, self.drop_remainder)
        return BatchStream(
            spec,
            positions=positions,
            drop_remainder=self.drop_remainder,
            start=self._position,
            quota=max(used - self._batches * spec.batch_size, 0),
            fill=self.world_size > 1,
        )

    def worker(self, worker: int, workers: int) -> Loader:
        """A loader of worker ``worker``'s part of what is left of this rank's epoch.

        The part is contiguous and of whole batches (``workers`` parts that
        together are this rank's share, each sample once).  Iterating the new
        loader runs its part of the current epoch, then the parts of later
        epochs, cut from each epoch's whole share; its ``state_dict()``
        records the part, and ``load_state_dict()`` on ``loader.worker(worker,
        workers)`` resumes it exactly.  Used by the PyTorch adapter, one per
        ``DataLoader`` worker process.

        Parameters
        ----------
        worker : int
            This worker's number, ``0 <= worker < workers``.
        workers : int
            How many workers share the rank's epoch.
        """
        workers = positive_int("workers", workers)
        worker = non_negative_int("worker", worker)
        if worker >= workers:
            raise ArgumentValueError(f"worker must be < workers={workers}, got {worker}")
        if self._part is not None:
            raise ArgumentValueError(f"{self!r} is already a worker's loader")
        clone = copy.copy(self)
        clone._busy = threading.Lock()
        clone._handed = None
        clone.stats = StreamStats()
        clone._part = (worker, workers)
        clone._base = self._position if self._batches else 0
        clone._batches = clone._position = 0
        return clone

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """The loader's progress as plain JSON-able data.

        ``position`` is where this rank is in its share of the epoch (samples
        yielded and samples skipped as undecodable), ``batches`` the batches
        it has yielded; the rest identifies the order (seed, batch size,
        shuffle, ...) so that a state is never applied to another one.  While a
        device feed (``JaxLoader``, ``CupyLoader``) iterates this loader, it is
        the state after the last batch the feed handed out, as the feed's own.
        """
        handed = self._handed
        return _state_at(self, self._progress() if handed is None else handed)

    def _progress(self) -> tuple[Any, ...]:
        """What of the state moves as batches are yielded (cheap: a device feed takes
        it per batch, the state of the last batch handed out made from it on demand)."""
        return self._epoch, self._batches, self._position, self._resumed, self._base

    def _state_at(self, progress: tuple[Any, ...]) -> dict[str, Any]:
        """``state_dict()`` as it was at ``progress`` (from :meth:`_progress`)."""
        return _state_at(self, progress)

    def load_state_dict(self, state: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> None:
        """Continue from ``state`` (from [`state_dict`][daskzarr_batches.Loader.state_dict],
        possibly of another process).

        With the same ``world_size`` this rank continues its own share from
        where it was (give this rank's state, or the list of every rank's).
        With another ``world_size`` (elastic), the samples no old rank had
        used up are shared anew among the new ranks: give the list of every
        old rank's state (``torch.distributed.all_gather_object``); one state
        is enough when the old loaders could not skip chunks
        (``on_error="raise"``), since every old rank was then at the same
        position.

        Raises
        ------
        ArgumentTypeError, ArgumentValueError
            A field of the state has the wrong type or a value this loader
            cannot continue from (naming the field), or the state belongs to
            a loader over other data or with another order (batch size,
            shuffle, seed, ...), naming what differs.
        """
        states = _validated_states(state, self)
        self._handed = None  # the state given wins over a device feed's record
        first = states[0]
        epoch, old_world = first["epoch"], first["world_size"]
        if old_world == self.world_size:
            mine = [one for one in states if one["rank"] == self.rank]
            if mine:
                one, position = mine[0], mine[0]["position"]
            elif first["on_error"] == "raise":  # no rank could skip: all at one position
                one = first
                position = min(first["batches"] * self.spec.batch_size, self._share_size())
            else:
                raise ArgumentValueError(
                    f"state['rank']={first['rank']!r}: the state is of another rank than this "
                    f"loader's rank {self.rank}; with on_error='skip' each rank may have "
                    "skipped chunks and be at another position: load this rank's own state "
                    "(or the list of every rank's)"
                )
            kept = self._resumed, self._base
            self._resumed, self._base = one["resumed"], one["base"]
            try:
                _check_progress(
                    self, one["batches"], position, self._positions(), self.world_size > 1,
                    one["on_error"],
                )  # fmt: skip
            except DaskZarrBatchesError:
                self._resumed, self._base = kept
                raise
            self._epoch, self._batches, self._position = epoch, one["batches"], position
            return
        if self._part is not None or first["worker"] is not None:
            raise ArgumentValueError(
                f"state['world_size']={old_world} differs from this loader's "
                f"{self.world_size}; a worker's state resumes only with the same world size"
            )
        if len(states) != old_world and first["on_error"] != "raise":
            raise ArgumentValueError(
                f"state['world_size']={old_world}: resuming {old_world} rank(s) as "
                f"{self.world_size} needs the states of all {old_world} old ranks (got "
                f"{len(states)}): with on_error='skip' each may have skipped chunks and be at "
                "another position"
            )
        # Elastic: what no old rank used up, shared among the new ranks.
        before = first["resumed"] or [(0, self._n())]
        if old_world > max(_size(before), len(states)):  # the work below is per old rank
            raise ArgumentValueError(
                f"state['world_size']={old_world} is more than the {_size(before)} samples "
                f"the old ranks shared (and than the {len(states)} state(s) given): no rank "
                "of it could hold a sample of its own, so the state is not of a real run "
                "(a corrupt checkpoint?); load the states of every old rank, or start afresh"
            )
        by_rank = {one["rank"]: one for one in states}
        consumed: Ranges = []
        shares = [share(before, rank, old_world, self.even_batches) for rank in range(old_world)]
        for rank, old_share in enumerate(shares):
            one = by_rank.get(rank, first)  # one state of on_error="raise": all at one place
            batches = one["batches"]
            position = (
                one["position"]
                if rank in by_rank
                else min(batches * self.spec.batch_size, _size(old_share))
            )
            _check_progress(self, batches, position, old_share, old_world > 1, one["on_error"])
            consumed += positions_between(old_share, 0, min(position, _size(old_share)))
        covered = complement(complement([r for s in shares for r in s], self._n()), self._n())
        left = _intersect(_intersect(complement(consumed, self._n()), covered), before)
        self._epoch, self._resumed = epoch, left
        self._batches = self._position = self._base = 0

    # ------------------------------------------------------------------ helpers

    def _identity(self) -> dict[str, Any]:
        """The fields that fix the epoch's order: a state applies only to the same."""
        spec = self.spec
        # "auto" sizes each epoch's buffer for that epoch: the request is the identity
        auto = spec.shuffle == "buffer" and spec.shuffle_quality is not None
        size = f"auto (shuffle_quality={spec.shuffle_quality})" if auto else None
        return {
            "seed": spec.seed,
            "n_samples": spec.n_samples,
            "batch_size": spec.batch_size,
            # a sampler's draws are its own order: its identity is part of the shuffle's
            "shuffle": spec.shuffle
            if spec.sampler is None
            else f"{spec.shuffle} by {spec.sampler.identity}",
            "shuffle_buffer_size": size or spec.shuffle_buffer_size,
            "window_rows": size or spec.window_rows,
            "even_batches": self.even_batches,
            "drop_remainder": self.drop_remainder,
        }

    def _n(self) -> int:
        return self.spec.n_samples

    def _positions(self) -> Ranges:
        whole = self._resumed if self._resumed is not None else [(0, self._n())]
        mine = share(whole, self.rank, self.world_size, self.even_batches)
        if self._part is None:
            return mine
        left = positions_between(mine, min(self._base, _size(mine)), _size(mine))
        return worker_part(left, self.spec.batch_size, *self._part)

    def _share_size(self) -> int:
        return _size(self._positions())

    def _shape(self, batch: Any) -> Any:
        if self.spec.return_sources:
            *arrays, sources = batch
            if self._names is not None:
                batch = {**dict(zip(self._names, arrays, strict=True)), "sources": sources}
            elif self._wrap or len(arrays) > 1:
                batch = (*arrays, sources)
            else:
                batch = (arrays[0], sources)
            return batch if self.transform is None else self.transform(batch)
        if self._wrap:
            batch = (batch,)
        if self._names is not None:
            batch = dict(zip(self._names, batch, strict=True))
        return batch if self.transform is None else self.transform(batch)

    def __repr__(self) -> str:
        names = ", ".join(self._names) if self._names else f"{len(self.spec.sources)} array(s)"
        part = "" if self._part is None else f", worker {self._part[0]}/{self._part[1]}"
        return (
            f"<Loader {names}: batch_size={self.spec.batch_size}, "
            f"shuffle={self.spec.shuffle!r}, epoch {self._epoch}, batch {self._batches}/"
            f"{len(self)}, rank {self.rank}/{self.world_size}{part}>"
        )

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["spec"] = dataclasses.replace(self.spec, client=None)
        state["_busy"] = None
        state["_stream"] = None
        handed = state.pop("_handed", None)
        if handed is not None:  # a copy goes on after the last batch a device feed handed out
            keys = ("_epoch", "_batches", "_position", "_resumed", "_base")
            state.update(zip(keys, handed, strict=True))
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._busy = threading.Lock()
        self._handed = None
