"""A loader's batches put on devices ahead of the step: what the JAX and cupy adapters share.

[`DeviceFeed`][daskzarr_batches._device_feed.DeviceFeed] wraps a ``Loader``: each
iteration is one of its epochs, every batch handed to the subclass's ``put`` (which
starts the batch's transfer and returns what to hand out) ``prefetch`` batches before
it is handed to ``hand_out`` (which makes the consumer's work wait for the transfer),
both on the consumer's thread: the transfers are asynchronous, so the batches put ahead
are copied while the step runs.  The state it reports is the loader's after the last
batch handed out, so the batches prefetched but not handed out are not counted and a
resume is exact; an iteration left early (a ``break``, an exception in the loop body or
from the loader) puts the loader back at that state, so the next iteration goes on with
the first batch not handed out, as a plain ``Loader`` does (the batches put ahead are
read again).  The package's warnings raised while a batch is pulled are emitted when
it is handed out, attributed to the consumer's line.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from .errors import ArgumentTypeError, ArgumentValueError, deferred_warnings, warn_caller

__all__ = ["DeviceFeed", "StatedBatches", "checked_prefetch", "map_arrays"]


def map_arrays(batch: Any, fn: Callable[[np.ndarray], Any]) -> Any:
    """``batch`` (an array, or arrays in tuples, lists and dicts) with ``fn`` of each array."""
    if isinstance(batch, np.ndarray):
        return fn(batch)
    if isinstance(batch, Mapping):
        return {key: map_arrays(value, fn) for key, value in batch.items()}
    if isinstance(batch, tuple | list):
        return type(batch)(map_arrays(value, fn) for value in batch)
    return batch


def checked_prefetch(prefetch: Any) -> int:
    """``prefetch`` as a non-negative int, or the error naming it."""
    if isinstance(prefetch, bool) or not isinstance(prefetch, int | np.integer):
        raise ArgumentTypeError(f"prefetch must be an int, got {prefetch!r}")
    if prefetch < 0:
        raise ArgumentValueError(f"prefetch must be >= 0, got {prefetch}")
    return int(prefetch)


class StatedBatches:
    """An epoch's batches with the loader's own ``state_dict`` beside them (for the torch
    adapter's prefetcher); ``pulled`` keeps the loader's progress after each batch pulled,
    so the batch handed out can set it as the loader's ``_handed``."""

    def __init__(self, batches: Iterator[Any], loader: Any) -> None:
        self._batches, self._loader = batches, loader
        self.pulled: deque[tuple[Any, ...]] = deque()

    def state_dict(self) -> dict[str, Any]:
        """The loader's state now (its own progress, not a device feed's record)."""
        progress = self._loader._progress()
        self.pulled.append(progress)
        return dict(self._loader._state_at(progress))

    def __iter__(self) -> Iterator[Any]:
        return self._batches


class DeviceFeed:
    """A loader's epochs with each batch put on devices ``prefetch`` batches ahead.

    Subclasses define :meth:`put` (start a batch's transfer) and may define
    :meth:`hand_out` (make the consumer's work wait for the transfer).
    ``prefetch`` counts batches (the ``Loader``'s own ``prefetch`` counts
    windows read ahead, beneath).
    """

    def __init__(self, loader: Any, prefetch: int) -> None:
        self.loader = loader
        self.prefetch = checked_prefetch(prefetch)
        #: the loader's ``_progress()`` after the last batch handed out (None: its own)
        self._state: tuple[Any, ...] | None = None

    def _hand(self, state: tuple[Any, ...] | None) -> None:
        """Record the progress after the last batch handed out (None: the loader's own is
        exact), here and in the loader, whose ``state_dict()`` then reports it too."""
        self._state = self.loader._handed = state

    def put(self, batch: Any) -> Any:
        """Start ``batch``'s transfer; what :meth:`hand_out` gets."""
        raise NotImplementedError

    def hand_out(self, item: Any) -> Any:
        """What the consumer gets for ``item`` (from :meth:`put`): here, ``item`` itself."""
        return item

    # ------------------------------------------------------------ forwarding

    def __len__(self) -> int:
        """Batches of a whole epoch (this rank's share)."""
        return len(self.loader)

    @property
    def epoch(self) -> int:
        """The epoch the next (or current) iteration runs, as far as handed out."""
        state = self._state
        return int(self.loader.epoch if state is None else state[0])

    def set_epoch(self, epoch: int) -> None:
        """Run epoch ``epoch`` in the next iteration (from its start)."""
        self.loader.set_epoch(epoch)
        self._hand(None)

    def state_dict(self) -> dict[str, Any]:
        """The loader's state after the last batch this iterator handed out."""
        if self._state is None:
            return dict(self.loader.state_dict())
        return dict(self.loader._state_at(self._state))

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` (from ``state_dict``; see
        [`Loader.load_state_dict`][daskzarr_batches.Loader.load_state_dict])."""
        self._hand(None)
        self.loader.load_state_dict(state)

    get_state = state_dict
    set_state = load_state_dict

    def bottleneck(self) -> Any:
        """What limited the current (or last) epoch: ``Loader.bottleneck``."""
        return self.loader.bottleneck()

    # ------------------------------------------------------------ iteration

    def __iter__(self) -> Iterator[Any]:
        return self._epoch()

    def _epoch(self) -> Iterator[Any]:
        """One epoch; left early (a break, an error), the loader goes back to the last
        batch handed out, so the batches put ahead are read again, not lost."""
        start = self.loader._progress()
        try:
            yield from self._batches()
        except BaseException:  # GeneratorExit (a break, a loop body's error) included
            # the loader's iteration is closed by now
            handed = start if self._state is None else self._state
            self._hand(None)  # the loader's own state is exact again
            self.loader.load_state_dict(self.loader._state_at(handed))
            raise

    def _batches(self) -> Iterator[Any]:
        """The epoch's batches, each put ``prefetch`` batches before it is handed out.

        On the consumer's thread: the puts start asynchronous transfers (JAX, a
        CUDA stream), so the batches put ahead are copied while the step runs,
        and there is no thread to hand batches across (measured: a prefetch
        thread made an epoch 1.15-1.3x the hand-written loop's, see
        ``docs/benchmarks.md``).  An error of the loader is raised once the
        batches put before it are handed out, as the loader itself would.
        """
        ahead: deque[tuple[Any, tuple[Any, ...], list[Warning]]] = deque()
        ended: Exception | None = None  # StopIteration at the epoch's end, or the error
        last: list[Warning] = []
        with contextlib.closing(iter(self.loader)) as host:
            while True:
                while ended is None and len(ahead) <= self.prefetch:
                    with deferred_warnings() as warned:  # emitted with their batch
                        try:
                            item = self.put(next(host))
                        except Exception as error:  # StopIteration included
                            ended, last = error, warned
                        else:
                            ahead.append((item, self.loader._progress(), warned))
                if not ahead:
                    break
                item, state, warned = ahead.popleft()
                for warning in warned:
                    warn_caller(warning)
                self._hand(state)
                yield self.hand_out(item)
        for warning in last:
            warn_caller(warning)
        if not isinstance(ended, StopIteration):
            raise ended  # type: ignore[misc]
        self._hand(None)  # the epoch is over: the loader's own state is exact
