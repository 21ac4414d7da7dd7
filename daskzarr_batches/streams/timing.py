"""Timing one epoch of a stream: what ``daskzarr-batches bench`` and the benchmark suite measure."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

from .base import StreamStats

__all__ = ["time_epoch"]


def time_epoch(
    make_stream: Callable[[], Any],
    *,
    on_item: Callable[[Any, Any, float], None] | None = None,
) -> tuple[float, StreamStats]:
    """Run one epoch of the stream ``make_stream()`` returns, and time it.

    The clock starts before the stream is made (its start-up counts, as a
    training loop pays it) and stops when the stream is exhausted, before it
    is closed.  ``daskzarr-batches bench`` and ``python -m benchmarks`` both
    measure epochs with it.

    Parameters
    ----------
    make_stream : callable
        Returns a new stream (a [`BatchStream`][daskzarr_batches.BatchStream] or
        [`ChunkStream`][daskzarr_batches.ChunkStream]),
        closed at the end; or a [`Loader`][daskzarr_batches.Loader], of which one epoch is run.
    on_item : callable, optional
        Called after each item as ``on_item(item, stream, elapsed_seconds)``
        (a progress bar); its time counts in the epoch's.

    Returns
    -------
    seconds : float
        Wall seconds of the epoch.
    stats : StreamStats
        What the stream read and yielded.

    Examples
    --------
    >>> import numpy as np
    >>> x = np.zeros((1000, 4), dtype="f4")
    >>> from daskzarr_batches import batch_stream
    >>> seconds, stats = time_epoch(lambda: batch_stream(x, 100))
    >>> stats.samples_yielded, stats.items_yielded
    (1000, 10)
    """
    started = time.perf_counter()
    stream = make_stream()
    with stream if hasattr(stream, "__exit__") else contextlib.nullcontext():
        if on_item is None:
            for _ in stream:
                pass
        else:
            for item in stream:
                on_item(item, stream, time.perf_counter() - started)
        seconds = time.perf_counter() - started
    return seconds, stream.stats
