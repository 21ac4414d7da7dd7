"""A batch stream's windows in flight and its per-batch delivery.

The windows a stream reads (:class:`_WindowSource`, past the end for a
rank's shortfall), those submitted and not consumed (:class:`_Reads`,
counted by weight so the ramp's small windows go out together), its
progress counters (:class:`_Progress`) and the per-batch hot path
(:class:`_Delivery`).  The stream itself is ``streams/batch.py``'s.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ..plan.batching import Ranges, positions_between, row_count, rows_nbytes
from ..plan.epoch import EpochPlan
from ..plan.windows import Window
from .base import StreamStats, T


def _windows_of(plan: EpochPlan, positions: Ranges, index: int = 0) -> Iterator[Window]:
    """The windows delivering ``positions`` (epoch positions, in order), numbered on."""
    for first, end in positions:
        for window in plan.windows_between(first, end, index):
            yield window
            index = window.index + 1


class _WindowSource:
    """The windows a batch stream reads, each with its offset from the stream's start.

    First the windows of offsets ``start:total`` of ``positions``; then, with
    ``fill``, windows past the end (wrapping around to the positions' start),
    each asked for as many samples as are still short (:meth:`next`).  Holds
    the plan and positions, never the stream: a stream dropped with windows
    left is still finalised by reference counting.
    """

    def __init__(self, plan: EpochPlan, positions: Ranges, start: int, fill: bool) -> None:
        self.plan = plan
        self.positions = positions
        self.fill = fill
        self.start = start
        total = sum(stop - first for first, stop in positions)
        self.planned = 0  # offsets (from start) covered by the windows handed out
        self.index = 0
        self._windows: Iterator[Window] = iter(())
        if start < total:
            self._windows = _windows_of(plan, positions_between(positions, start, total))

    def next(self, short: int) -> tuple[Window, int] | None:
        """The next window and its offset; past the end, one of ``short`` samples at most."""
        window = next(self._windows, None)
        if window is None and self.fill and short > 0:
            at = self.start + self.planned  # wraps: positions_between counts modulo the total
            self._windows = _windows_of(
                self.plan, positions_between(self.positions, at, at + short), self.index
            )
            window = next(self._windows, None)
        if window is None:
            return None
        offset = self.planned
        self.planned += window.size
        self.index = window.index + 1
        return window, offset


def _ids(samples: Any) -> np.ndarray:
    """A window's sample ids as int64; a ``range`` (sequential) without a Python loop.

    ``np.asarray(range(n))`` converts element by element: 23-30 ms of CPU per
    sequential epoch of 400,000 samples, a sixth of the epoch (issue 20).
    """
    if isinstance(samples, range):
        return np.arange(samples.start, samples.stop, samples.step, dtype=np.int64)
    return np.asarray(samples, dtype=np.int64)


def _first_rows(
    outputs: tuple[np.ndarray, ...], order: np.ndarray | None, size: int
) -> tuple[tuple[np.ndarray, ...], np.ndarray | None]:
    """The first ``size`` samples (in plan order) of a window's outputs."""
    if order is None:
        return tuple(rows[:size] for rows in outputs), None
    return outputs, order[:size]


class _Progress:
    """Samples of a batch stream so far: fed to the batcher, skipped, read and kept filling."""

    __slots__ = ("fed", "filled_kept", "filled_read", "skipped")

    def __init__(self) -> None:
        self.fed = 0  # samples handed to the batcher
        self.skipped = 0  # samples left out as undecodable, in windows read so far
        self.filled_read = self.filled_kept = 0  # samples read, and kept, past the end


class _Reads:
    """The windows a batch stream has submitted and not consumed yet, in plan order.

    Windows in flight are counted by their share of a full window's samples
    (``full``), so the fast-start ramp's small windows (together one window)
    are read together: on a store with high latency each would otherwise
    cost a round trip.  ``submit(window, offset)`` sends one; ``short()`` is
    how many samples past the end are still due.
    """

    def __init__(
        self,
        windows: _WindowSource,
        full: int,
        short: Callable[[], int],
        submit: Callable[[Window, int], Any],
    ) -> None:
        self.windows = windows
        self.full = max(full, 1)
        self.short = short
        self.submit = submit
        self.queue: deque[tuple[Window, int, Any]] = deque()
        self.pending: list[tuple[Window, int]] = []
        self.held = 0.0

    def weight(self, window: Window) -> float:
        return min(1.0, window.size / self.full)

    def top_up(self, limit: int, most: int | None = None) -> None:
        """Submit windows while they fit ``limit`` full windows (and ``most`` in flight)."""
        while most is None or len(self.queue) < most:
            if not self.pending:
                upcoming = self.windows.next(self.short())
                if upcoming is None:
                    return
                self.pending.append(upcoming)
            window, offset = self.pending[0]
            if self.queue and self.held + self.weight(window) > limit + 1e-9:
                return
            self.pending.pop()
            self.held += self.weight(window)
            self.queue.append((window, offset, self.submit(window, offset)))

    def consumed(self, window: Window) -> None:
        """The oldest window's result is taken: it no longer counts as in flight."""
        self.queue.popleft()
        self.held -= self.weight(window)


def _after_first(items: Iterator[T], then: Callable[[], None]) -> Iterator[T]:
    """``items``, calling ``then()`` after the first one is consumed (or at once if none)."""
    called = False
    for item in items:
        yield item
        if not called:
            then()
            called = True
    if not called:
        then()


#: Windows beyond ``prefetch + 1`` a stream may have in flight: the fast-start ramp's
#: small windows, which together count as one (``ramp_split``: about log2 of a window's
#: chunks).
RAMP_WINDOWS = 8


class _Delivery:
    """Counts a batch in ``stats`` and hands it out (the per-batch hot path)."""

    __slots__ = ("counted", "created", "labels", "layout", "paired", "stats")

    def __init__(self, stats: StreamStats, paired: bool, created: float, layout: Any) -> None:
        self.stats = stats
        self.paired = paired
        self.created = created
        self.layout = layout
        self.counted: int | None = None  # the outputs counted in bytes_yielded (None: all)
        self.labels: int | None = None  # the output holding discrete labels (``labels=``)

    def __call__(self, batch: tuple[np.ndarray, ...]) -> Any:
        stats = self.stats
        first = batch[0]
        if stats.time_to_first_batch is None:
            stats.time_to_first_batch = time.perf_counter() - self.created
        stats.items_yielded += 1
        dense = type(first) is np.ndarray  # the hot path: no helper calls
        stats.samples_yielded += first.shape[0] if dense else row_count(first)
        if self.labels is not None and stats.labels is not None:
            stats.labels.add(batch[self.labels])
        if self.layout is not None:
            stats.bytes_yielded += sum(rows_nbytes(part) for part in batch)
            return self.layout.pack(batch)
        if self.paired:
            stats.bytes_yielded += sum(rows_nbytes(part) for part in batch[: self.counted])
            return batch
        stats.bytes_yielded += first.nbytes if dense else rows_nbytes(first)
        return first
