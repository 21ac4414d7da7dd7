"""Timing one epoch of a stream: what ``daskzarr-batches bench`` and the benchmark suite measure."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # base imports this module for StreamStats.bottleneck
    from .base import StreamStats

__all__ = ["STAGES", "Bottleneck", "bottleneck_of", "time_epoch"]

#: the stages ``bottleneck_of`` names, in the order a batch passes them
STAGES = ("store requests", "decoding", "reading", "assembling batches", "consumer step")

#: share of the epoch with a store request in flight above which reading is the store's
STORE_BOUND = 0.5


@dataclass(frozen=True)
class Bottleneck:
    """The stage that limited a stream's epoch so far, with the numbers behind it.

    Attributes
    ----------
    stage : str
        One of ``STAGES``: ``"store requests"`` (the loader waited on
        reads, and a store request was in flight most of the time),
        ``"decoding"`` (it waited on reads, the store was mostly idle:
        decompression and decoding), ``"reading"`` (it waited on reads the
        store requests of which were not clocked: a dask cluster's workers,
        the zarrs pipeline, in-memory arrays), ``"assembling batches"``
        (cutting batches out of decoded windows, in the consumer's thread,
        took longer than the waits), ``"consumer step"`` (the loader was
        ready: the time went to the consumer's own step); ``"nothing yet"``
        before the first item.
    setting : str
        What to change, named.
    epoch_seconds : float
        Wall seconds from the first ``next()`` to the last item handed out.
    consumer_seconds, wait_seconds, assemble_seconds : float
        The epoch split in the consumer's thread: outside ``next()`` (the
        step, a ``Loader``'s ``transform`` included), blocked on reads, and
        the rest of ``next()`` (cutting batches).
    store_busy_seconds, store_request_seconds, store_queued_seconds : float
        Wall seconds with a store request in flight; seconds summed over the
        requests; seconds requests waited for a slot of ``io_concurrency``.
    store_requests : int
        Store requests clocked.
    io_concurrency : int or None
        The stream's limit of store requests in flight.
    """

    stage: str
    setting: str
    epoch_seconds: float
    consumer_seconds: float
    wait_seconds: float
    assemble_seconds: float
    store_busy_seconds: float
    store_request_seconds: float
    store_queued_seconds: float
    store_requests: int
    io_concurrency: int | None

    def __str__(self) -> str:
        epoch = self.epoch_seconds or 1.0
        share = [
            f"{name} {seconds:.3f} s ({seconds / epoch:.0%})"
            for name, seconds in (
                ("consumer step", self.consumer_seconds),
                ("waiting on reads", self.wait_seconds),
                ("assembling", self.assemble_seconds),
            )
        ]
        store = (
            f"; store: {self.store_requests} requests, in flight {self.store_busy_seconds:.3f} s"
            f" ({self.store_busy_seconds / epoch:.0%} of the epoch), queued for a slot "
            f"{self.store_queued_seconds:.3f} s"
            if self.store_requests
            else "; store requests not clocked"
        )
        return (
            f"bottleneck: {self.stage} (epoch {self.epoch_seconds:.3f} s: {', '.join(share)}"
            f"{store}); change: {self.setting}"
        )


def bottleneck_of(stats: StreamStats) -> Bottleneck:
    """Name the stage that limited the epoch ``stats`` describes (see ``Bottleneck``).

    The consumer's thread is split three ways: its own step (outside
    ``next()``), waiting for windows being read, and cutting batches; the
    largest names the stage, the waits split further by how much of the
    epoch had a store request in flight (above ``STORE_BOUND``: the
    store's, else decoding).
    """
    consumer, inside = stats.consumer_seconds, stats.next_seconds
    wait = min(stats.wait_seconds, inside)
    assemble = max(inside - wait, 0.0)
    epoch = consumer + inside
    busy, concurrency = stats.store_busy_seconds, stats.io_concurrency
    if stats.items_yielded == 0:
        stage, setting = "nothing yet", "nothing: no item was handed out yet"
    elif consumer >= wait and consumer >= assemble:
        stage = "consumer step"
        setting = (
            f"nothing in the loader (it kept {wait:.3f} s of {epoch:.3f} s waiting): a "
            "faster step, or more devices; a larger prefetch= will not help"
        )
    elif assemble > wait:
        stage = "assembling batches"
        setting = (
            "batch_size (fewer, larger batches) or a cheaper transform=; not DataLoader "
            "workers, whose hand-over of each batch measured slower than cutting it "
            "(docs/training.md)"
        )
    elif stats.store_requests == 0:
        stage = "reading"
        setting = (
            "prefetch= (more windows read ahead) or a client= with more workers; store "
            "requests and decoding are not told apart here (a cluster's workers, the zarrs "
            "pipeline and in-memory arrays are not clocked)"
        )
    elif busy >= STORE_BOUND * epoch:
        stage = "store requests"
        queued = stats.store_queued_seconds
        setting = (
            f"io_concurrency= (now {concurrency}; requests waited {queued:.3f} s for a slot) "
            "for more requests in flight, a cache= (ChunkCache), or larger stored "
            "chunks / shards (fewer requests)"
        )
    else:
        stage = "decoding"
        setting = (
            "open_array(..., codec_pipeline='zarrs') (Rust decoding on all cores), a "
            "client= with more workers, or a cheaper compressor when writing"
        )
    return Bottleneck(
        stage=stage,
        setting=setting,
        epoch_seconds=epoch,
        consumer_seconds=consumer,
        wait_seconds=wait,
        assemble_seconds=assemble,
        store_busy_seconds=busy,
        store_request_seconds=stats.store_request_seconds,
        store_queued_seconds=stats.store_queued_seconds,
        store_requests=stats.store_requests,
        io_concurrency=concurrency,
    )


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
