"""The training loader: epochs, named arrays, rank shares and resumable state.

A :class:`Loader` is a re-iterable over epochs.  Each iteration builds the
epoch's :class:`StreamSpec` (same seed, the epoch's number) and a
:class:`BatchStream` over this rank's share of the epoch's positions
(``_batching.share``): the order is drawn once for all ranks from
``(seed, epoch)`` and then cut into equal, consecutive shares, so each rank
reads mostly its own chunks and every rank takes the same number of steps.
Its state is the epoch and the batches this rank has consumed in it, plain
JSON, from which a new process continues exactly where the old one stopped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ._batching import Ranges, complement, count_batches, positions_between, share, skip
from ._errors import ArgumentTypeError, ArgumentValueError
from ._policy import DEFAULT_RETRIES, MissingMode, OnError
from ._sources import is_xarray
from ._spec import (
    DEFAULT_MEMORY_BUDGET,
    DEFAULT_WINDOW_BYTES,
    StreamSpec,
    flag,
    non_negative_int,
    positive_int,
)
from ._streams import BatchStream, StreamStats

__all__ = ["Loader"]

STATE_VERSION = 1


class Loader:
    """Minibatches for a training loop: one epoch per iteration, resumable, sharded.

    Parameters
    ----------
    arrays : array, tuple of arrays, dict of named arrays or xarray.Dataset
        ``zarr.Array``, ``dask.array.Array``, ``numpy.ndarray`` or
        ``xarray.DataArray`` (its data, samples along its first dimension),
        all with the same length along axis 0 (else
        :class:`LengthMismatchError` naming each).  Batches come back in the
        same structure: an array, a tuple, or a dict with the same names.  An
        ``xarray.Dataset`` is the dict of its data variables by name.
    batch_size : int
        Samples per batch.
    shuffle : bool, default False
        Shuffle each epoch: exactly (``shuffle_buffer_size=None``) or through
        a buffer of ``shuffle_buffer_size`` samples, as
        :func:`shuffled_batch_stream`.
    shuffle_buffer_size, memory_budget, window_bytes, prefetch, client, \
timeout, missing, on_error, retries, io_concurrency
        As for the stream constructors.
    seed : int, default 0
        The shuffle's seed; the order of epoch ``e`` comes from ``(seed, e)``
        exactly as the streams' ``seed=``, ``epoch=`` do.
    drop_remainder : bool, default False
        Drop this rank's short last batch.
    rank, world_size : int, default 0, 1
        This process's share of each epoch: the epoch's order is drawn once
        for all ranks and cut into ``world_size`` equal, consecutive shares.
    even_batches : bool, default True
        ``True``: every share has ``ceil(n / world_size)`` samples, the last
        ones padded by repeating the epoch's first samples; ``False``: every
        share has ``n // world_size`` samples, the tail of the epoch is
        dropped.  Either way every rank yields the same number of batches.
    transform : callable, optional
        Applied to each batch (in its structure) in this process, after it is
        cut: normalisation, dtype or device conversion.  It does not change
        which samples a batch holds.

    Notes
    -----
    Iterating the loader runs one epoch; iterating it again runs the next one
    (``set_epoch(e)`` chooses the epoch of the next iteration instead).
    ``len()`` is the number of batches this rank yields in a whole epoch.
    ``state_dict()`` / ``load_state_dict()`` save and restore the epoch and
    the batches consumed in it: a loader restored from the state taken after
    batch ``k`` yields exactly batches ``k + 1, ...`` of the uninterrupted
    run, also in a new process.  Restored with another ``world_size``, the
    new ranks share the samples the old ones had not yet consumed.
    """

    def __init__(
        self,
        arrays: Any,
        batch_size: int,
        *,
        shuffle: bool = False,
        shuffle_buffer_size: int | None = None,
        memory_budget: int = DEFAULT_MEMORY_BUDGET,
        window_bytes: int = DEFAULT_WINDOW_BYTES,
        seed: int = 0,
        drop_remainder: bool = False,
        rank: int = 0,
        world_size: int = 1,
        even_batches: bool = True,
        transform: Callable[[Any], Any] | None = None,
        prefetch: int | None = None,
        client: Any = None,
        timeout: float | None = None,
        missing: MissingMode = "warn",
        on_error: OnError = "raise",
        retries: int = DEFAULT_RETRIES,
        io_concurrency: int | None = None,
    ) -> None:
        self._names, self._wrap, values = _structure(arrays)
        shuffled = flag("shuffle", shuffle)
        if not shuffled and shuffle_buffer_size is not None:
            raise ArgumentValueError(
                f"shuffle_buffer_size={shuffle_buffer_size!r} needs shuffle=True"
            )
        mode = "none" if not shuffled else "exact" if shuffle_buffer_size is None else "buffer"
        self.world_size = positive_int("world_size", world_size)
        self.rank = non_negative_int("rank", rank)
        if self.rank >= self.world_size:
            raise ArgumentValueError(f"rank must be < world_size={world_size}, got {rank}")
        self.even_batches = flag("even_batches", even_batches)
        self.drop_remainder = flag("drop_remainder", drop_remainder)
        if transform is not None and not callable(transform):
            raise ArgumentTypeError(f"transform must be callable or None, got {transform!r}")
        self.transform = transform
        roles = tuple(self._names) if self._names else None
        self.spec = StreamSpec(
            values,
            batch_size,
            shuffle=mode,  # type: ignore[arg-type]
            seed=non_negative_int("seed", seed) if shuffled else None,
            shuffle_buffer_size=shuffle_buffer_size,
            memory_budget=memory_budget,
            window_bytes=window_bytes,
            prefetch=prefetch,
            client=client,
            timeout=timeout,
            roles=roles or (),
            missing=missing,
            on_error=on_error,
            retries=retries,
            io_concurrency=io_concurrency,
        )
        self._seed = seed
        self._epoch = 0
        self._consumed = 0  # batches of the current epoch this rank has yielded
        #: what the current (or last) epoch's stream read and yielded
        self.stats = StreamStats()
        self._resumed: Ranges | None = None  # the positions left after an elastic restore

    # ------------------------------------------------------------------ epochs

    @property
    def epoch(self) -> int:
        """The epoch the next (or current) iteration runs."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Run epoch ``epoch`` in the next iteration (from its start)."""
        self._epoch = non_negative_int("epoch", epoch)
        self._consumed = 0
        self._resumed = None

    def __len__(self) -> int:
        """Batches this rank yields in a whole epoch."""
        return count_batches(self._share_size(), self.spec.batch_size, self.drop_remainder)

    def __iter__(self) -> Iterator[Any]:
        stream = self.stream()
        self.stats = stream.stats
        with stream:
            for batch in stream:
                self._consumed += 1
                yield self._shape(batch)
        self._epoch += 1
        self._consumed = 0
        self._resumed = None

    def stream(self) -> BatchStream:
        """The :class:`BatchStream` of what is left of this rank's current epoch."""
        spec = self.spec.with_epoch(self._epoch)
        left = skip(self._positions(), self._consumed * spec.batch_size)
        return BatchStream(spec, positions=left, drop_remainder=self.drop_remainder)

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """The loader's progress as plain JSON-able data."""
        spec = self.spec
        return {
            "version": STATE_VERSION,
            "epoch": self._epoch,
            "batches": self._consumed,
            "rank": self.rank,
            "world_size": self.world_size,
            "resumed": None if self._resumed is None else [list(r) for r in self._resumed],
            "seed": spec.seed,
            "n_samples": spec.n_samples,
            "batch_size": spec.batch_size,
            "shuffle": spec.shuffle,
            "shuffle_buffer_size": spec.shuffle_buffer_size,
            "window_rows": spec.window_rows,
            "even_batches": self.even_batches,
            "drop_remainder": self.drop_remainder,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` (from :meth:`state_dict`, possibly of another process).

        With the same ``world_size`` this rank continues its own share after
        the batches it had consumed.  With another ``world_size`` (elastic),
        the samples no old rank had consumed are shared anew among the new
        ranks; every old rank must have consumed the same number of batches
        (as ranks that step together do).

        Raises
        ------
        ArgumentValueError
            The state belongs to a loader over other data or with another
            order (batch size, shuffle, seed, ...), naming what differs.
        """
        if not isinstance(state, Mapping) or state.get("version") != STATE_VERSION:
            raise ArgumentValueError(f"not a Loader state of version {STATE_VERSION}: {state!r}")
        mine = self.state_dict()
        keys = ["seed", "n_samples", "batch_size", "shuffle", "shuffle_buffer_size"]
        keys += ["window_rows", "even_batches", "drop_remainder"]
        differ = [
            f"{k}={state.get(k)!r} (here {mine[k]!r})" for k in keys if state.get(k) != mine[k]
        ]
        if differ:
            raise ArgumentValueError(
                "the state is of a loader with another order or data: " + ", ".join(differ)
            )
        epoch = non_negative_int("epoch", state["epoch"])
        batches = non_negative_int("batches", state["batches"])
        old_world = positive_int("world_size", state["world_size"])
        resumed = state.get("resumed")
        if old_world == self.world_size and resumed is None:
            self._epoch, self._consumed, self._resumed = epoch, batches, None
            return
        # Elastic: what no old rank consumed, shared among the new ranks.
        before = [tuple(r) for r in resumed] if resumed is not None else [(0, self._n())]
        shares = [share(before, r, old_world, self.even_batches) for r in range(old_world)]
        consumed = [
            rng
            for old_share in shares
            for rng in positions_between(old_share, 0, batches * self.spec.batch_size)
        ]
        covered = complement(complement([r for s in shares for r in s], self._n()), self._n())
        left = _intersect(_intersect(complement(consumed, self._n()), covered), before)
        self._epoch, self._consumed, self._resumed = epoch, 0, left

    # ------------------------------------------------------------------ helpers

    def _n(self) -> int:
        return self.spec.n_samples

    def _positions(self) -> Ranges:
        whole = self._resumed if self._resumed is not None else [(0, self._n())]
        return share(whole, self.rank, self.world_size, self.even_batches)

    def _share_size(self) -> int:
        return sum(stop - start for start, stop in self._positions())

    def _shape(self, batch: Any) -> Any:
        if self._wrap:
            batch = (batch,)
        if self._names is not None:
            batch = dict(zip(self._names, batch, strict=True))
        return batch if self.transform is None else self.transform(batch)

    def __repr__(self) -> str:
        names = ", ".join(self._names) if self._names else f"{len(self.spec.sources)} array(s)"
        return (
            f"<Loader {names}: batch_size={self.spec.batch_size}, "
            f"shuffle={self.spec.shuffle!r}, epoch {self._epoch}, batch {self._consumed}/"
            f"{len(self)}, rank {self.rank}/{self.world_size}>"
        )

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["spec"] = dataclasses.replace(self.spec, client=None)
        return state


def _intersect(ranges: Ranges, within: list[tuple[int, int]]) -> Ranges:
    """The positions of ``ranges`` that lie in ``within``, in the order of ``within``."""
    out: Ranges = []
    for lo, hi in within:
        for start, stop in ranges:
            a, b = max(lo, start), min(hi, stop)
            if a < b:
                out.append((a, b))
    return out


def _structure(arrays: Any) -> tuple[tuple[str, ...] | None, bool, tuple[Any, ...]]:
    """(names or None, whether one batch array needs wrapping in a tuple, the arrays)."""
    if is_xarray(arrays, "Dataset"):
        if not arrays.data_vars:
            raise ArgumentValueError("arrays is an xarray.Dataset without data variables")
        arrays = {str(name): arrays[name] for name in arrays.data_vars}
    if isinstance(arrays, Mapping):
        if not arrays:
            raise ArgumentValueError("arrays is an empty dict")
        names = tuple(arrays)
        if not all(isinstance(name, str) for name in names):
            raise ArgumentTypeError(f"the names of arrays must be strings, got {names!r}")
        return names, len(names) == 1, tuple(arrays.values())
    if isinstance(arrays, tuple | list):
        if not arrays:
            raise ArgumentValueError("arrays is empty")
        return None, len(arrays) == 1, tuple(arrays)
    return None, False, (arrays,)
