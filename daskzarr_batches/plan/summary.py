"""A plan in numbers: per window and for the epoch (``plan_epoch``, ``stream.summary()``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .quality import ShuffleQuality

__all__ = ["PlanSummary", "WindowSummary", "read_amplification"]


def read_amplification(bytes_read: int, bytes_yielded: int) -> float:
    """How often the yielded data was decoded: ``bytes_read / bytes_yielded``.

    The one rule for plans (:class:`PlanSummary`) and streams (``StreamStats``).

    Parameters
    ----------
    bytes_read : int
        Decoded bytes of the chunks read.
    bytes_yielded : int
        Bytes handed (or to be handed) to the caller.

    Returns
    -------
    float
        ``bytes_read / bytes_yielded``; ``0.0`` when nothing was yielded nor
        read, ``inf`` when bytes were read but nothing yielded.

    Examples
    --------
    >>> read_amplification(800, 400), read_amplification(0, 0), read_amplification(8, 0)
    (2.0, 0.0, inf)
    """
    if bytes_yielded == 0:
        return 0.0 if bytes_read == 0 else math.inf
    return bytes_read / bytes_yielded


@dataclass(frozen=True)
class WindowSummary:
    """One window of a [`PlanSummary`][daskzarr_batches.plan.PlanSummary].

    Attributes
    ----------
    index : int
        Position of the window in the epoch.
    samples : int
        Samples the window yields.
    batches : int
        Batches completed in this window (a batch straddling two windows
        counts in the second).
    chunks : tuple of tuple of int
        For each array, the axis-0 chunks the window reads (each decoded once).
    bytes_decoded : int
        Decoded bytes of those chunks (whole chunks are decoded).  Stored
        (compressed) sizes are not known without listing the store, so they
        are not reported.
    bytes_held : int
        Bytes of the window's samples, held until its batches are consumed.
    tasks : int or None
        Dask tasks of the window's graph.
    shards : int
        Shards (stored objects of sharded arrays) the window reads; 0 for
        unsharded arrays.
    requests : int
        Store requests the window makes, estimated from the plan and the
        shard geometry: a chunk of an unsharded array or a shard read whole
        is one request, a shard read in part is its index plus one request per
        run of adjacent needed chunks.  0 for arrays not read from a store.
    chunks_cached : int or None
        Of ``chunks``, those a chunk cache held when the plan was made (every
        stored chunk of it in the cache's memory or directory): read from the
        cache, not the store.  ``None``: no cache was given.
    """

    index: int
    samples: int
    batches: int
    chunks: tuple[tuple[int, ...], ...]
    bytes_decoded: int
    bytes_held: int
    tasks: int | None = None
    shards: int = 0
    requests: int = 0
    chunks_cached: int | None = None


@dataclass(frozen=True)
class PlanSummary:
    """An epoch's plan in numbers: per window and totals.

    Made by [`EpochPlan.summary`][daskzarr_batches.plan.EpochPlan.summary],
    ``BatchStream.summary()`` and
    [`plan_epoch`][daskzarr_batches.plan_epoch]; nothing is read to make it.

    Attributes
    ----------
    windows : tuple of WindowSummary
    shuffle : str
    batch_size, n_samples, n_batches : int
    bytes_yielded : int
        Bytes of all batches of the epoch.
    dataset_bytes : int
        Decoded bytes of the arrays.
    bytes_distinct : int or None
        Patch streams: decoded bytes of the distinct stored chunks the epoch
        reads (each once), the base of their read amplification (patches may
        overlap, so the bytes yielded are no measure of the data read);
        ``None`` for row streams.
    cached : bool
        Whether a chunk cache was given: then each window's ``chunks_cached``
        says how many of its chunk reads the cache held when the plan was
        made (chunks the epoch itself puts in the cache are not counted).
    quality : ShuffleQuality or None
        How well mixed the epoch's order is, beside an exact shuffle (from the
        planned sample ids: `quality`).
    buffer_figure : float or None
        ``shuffle_buffer_size="auto"``: the batch mixing the chosen buffer
        was held to, this epoch's own given its windows (``quality.mixing``
        is the realised one, within the noise of the row shuffles), at least
        ``shuffle_quality`` unless a ``ShuffleQualityWarning`` said
        otherwise; ``None`` otherwise.  It is the mean over the epoch's
        batches; the buffered windows are balanced, so no stretch of batches
        falls far below it (``quality.worst_mixing`` reports the least mixed
        stretch).
    """

    windows: tuple[WindowSummary, ...]
    shuffle: str
    batch_size: int
    n_samples: int
    n_batches: int
    bytes_yielded: int
    dataset_bytes: int
    bytes_distinct: int | None = None
    cached: bool = False
    quality: ShuffleQuality | None = None
    buffer_figure: float | None = None

    @property
    def n_windows(self) -> int:
        """Windows (dask graphs) of the epoch."""
        return len(self.windows)

    @property
    def chunks_read(self) -> int:
        """Chunk reads of the epoch, summed over arrays."""
        return sum(sum(len(c) for c in w.chunks) for w in self.windows)

    @property
    def chunks_cached(self) -> int | None:
        """Chunk reads the cache held when the plan was made (``None``: no cache given)."""
        if not self.cached:
            return None
        return sum(w.chunks_cached or 0 for w in self.windows)

    @property
    def shards_read(self) -> int:
        """Shard reads of the epoch, summed over arrays (0 when none is sharded)."""
        return sum(w.shards for w in self.windows)

    @property
    def requests(self) -> int:
        """Store requests of the epoch, estimated (see `WindowSummary.requests`)."""
        return sum(w.requests for w in self.windows)

    @property
    def bytes_decoded(self) -> int:
        """Decoded bytes of every chunk read."""
        return sum(w.bytes_decoded for w in self.windows)

    @property
    def read_amplification(self) -> float:
        """``bytes_decoded / bytes_yielded``: how often the data is read.

        Patch streams: ``bytes_decoded / bytes_distinct``, how often each
        stored chunk the epoch needs is decoded (1.00: once).
        ``0.0`` for an epoch that reads and yields nothing, ``inf`` for one
        that reads chunks but yields nothing (see `read_amplification`).
        """
        if self.bytes_distinct is not None:
            return read_amplification(self.bytes_decoded, self.bytes_distinct)
        return read_amplification(self.bytes_decoded, self.bytes_yielded)

    @property
    def peak_window_bytes(self) -> int:
        """Largest ``bytes_held`` of a window.

        A stream holds about ``(prefetch + 1)`` such windows at once.
        """
        return max((w.bytes_held for w in self.windows), default=0)

    @property
    def n_tasks(self) -> int | None:
        """Dask tasks of the epoch (``None`` if not counted)."""
        counts = [w.tasks for w in self.windows]
        if any(c is None for c in counts):
            return None
        return sum(c for c in counts if c is not None)

    def rows(self) -> list[dict[str, int]]:
        """One dict per window, e.g. for ``pandas.DataFrame(summary.rows())``.

        With a cache given, each also has ``chunks_cached``.
        """
        return [
            {
                "window": w.index,
                "samples": w.samples,
                "batches": w.batches,
                "chunks_read": sum(len(c) for c in w.chunks),
                **({"chunks_cached": w.chunks_cached or 0} if self.cached else {}),
                "shards": w.shards,
                "requests": w.requests,
                "bytes_decoded": w.bytes_decoded,
                "bytes_held": w.bytes_held,
                "tasks": -1 if w.tasks is None else w.tasks,
            }
            for w in self.windows
        ]

    def totals(self) -> dict[str, float | int | None]:
        """The epoch's totals as a dict."""
        return {
            "windows": self.n_windows,
            "samples": self.n_samples,
            "batches": self.n_batches,
            "chunks_read": self.chunks_read,
            **({"chunks_cached": self.chunks_cached} if self.cached else {}),
            "shards_read": self.shards_read,
            "requests": self.requests,
            "bytes_decoded": self.bytes_decoded,
            "bytes_yielded": self.bytes_yielded,
            "read_amplification": round(self.read_amplification, 3),
            "peak_window_bytes": self.peak_window_bytes,
            "tasks": self.n_tasks,
        }

    def __str__(self) -> str:
        mib = 2**20
        lines = [
            f"epoch plan: shuffle={self.shuffle!r}, batch_size={self.batch_size}, "
            f"{self.n_samples} samples, {self.n_batches} batches, {self.n_windows} windows",
            f"  read {self.bytes_decoded / mib:.1f} MiB decoded for "
            f"{self.bytes_yielded / mib:.1f} MiB yielded "
            f"(read amplification {self.read_amplification:.2f}), "
            f"peak window {self.peak_window_bytes / mib:.1f} MiB, "
            f"{self.chunks_read} chunk reads, {self.shards_read} shard reads, "
            f"{self.requests} store requests, dask tasks {self.n_tasks}",
        ]
        if self.quality is not None and self.shuffle != "none":
            auto = "" if self.buffer_figure is None else " (sized by shuffle_buffer_size='auto')"
            lines.append(f"  shuffle quality: {self.quality}{auto}")
        if self.cached:
            lines.append(
                f"  the cache holds {self.chunks_cached} of the {self.chunks_read} chunk reads "
                "(read from it, not the store)"
            )
        shown = self.windows if len(self.windows) <= 12 else self.windows[:10]
        cached = "  cached" if self.cached else ""
        lines.append(
            f"  window  samples  batches  chunks{cached}  shards  requests  decoded MiB  "
            "held MiB  tasks"
        )
        for w in shown:
            held = f"  {w.chunks_cached or 0:6d}" if self.cached else ""
            lines.append(
                f"  {w.index:6d}  {w.samples:7d}  {w.batches:7d}  "
                f"{sum(len(c) for c in w.chunks):6d}{held}  {w.shards:6d}  {w.requests:8d}  "
                f"{w.bytes_decoded / mib:11.1f}  {w.bytes_held / mib:8.1f}  {w.tasks}"
            )
        if len(shown) < len(self.windows):
            lines.append(f"  ... {len(self.windows) - len(shown)} more windows")
        return "\n".join(lines)
