"""What ``bench`` measured and its text: ``EpochResult`` (one epoch's numbers, or their
total) and ``format_summary`` (the header lines, the table of epochs, the spread, the
CPU note and the counters).  ``tools.bench`` runs the epochs and re-exports both."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..streams.timing import Bottleneck

__all__ = ["EpochResult", "format_summary"]


@dataclass
class EpochResult:
    """What one epoch (or, summed, all of them) delivered and cost.

    ``epoch`` is None for the total.
    """

    epoch: int | None
    batches: int
    samples: int
    seconds: float
    bytes_read: int
    bytes_yielded: int
    wait_seconds: float
    retries: int = 0
    chunks_missing: int = 0
    skipped: list[Any] = field(default_factory=list)
    time_to_first_batch: float | None = None
    #: the stream's cache counters (``None``: no cache)
    cache_hits: int | None = None
    cache_misses: int | None = None
    bytes_from_cache: int | None = None
    #: CPU seconds of the epoch (this process, all threads; and a client's workers)
    cpu_seconds: float = 0.0
    #: the stage that limited the epoch (``stats.bottleneck()``; the total: the last epoch's)
    bottleneck: Bottleneck | None = None

    @property
    def cpu_s_per_gb(self) -> float:
        """CPU seconds per GB (10^9 bytes) of samples handed out (NaN with nothing yielded)."""
        return self.cpu_seconds / (self.bytes_yielded / 1e9) if self.bytes_yielded else math.nan

    @property
    def samples_per_second(self) -> float:
        """Samples handed out per second."""
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_per_second(self) -> float:
        """MB (10^6 bytes) of samples handed out per second."""
        return self.bytes_yielded / 1e6 / self.seconds if self.seconds > 0 else 0.0

    @property
    def read_amplification(self) -> float:
        """``bytes_read / bytes_yielded``: 0.0 with nothing read, inf with nothing yielded."""
        if self.bytes_read == 0:
            return 0.0
        return self.bytes_read / self.bytes_yielded if self.bytes_yielded else math.inf

    @property
    def wait_share(self) -> float:
        """Share of the time spent blocked in ``next()``."""
        return self.wait_seconds / self.seconds if self.seconds > 0 else 0.0

    @classmethod
    def total(cls, epochs: Sequence[EpochResult]) -> EpochResult:
        """The sums over ``epochs``."""
        return cls(
            epoch=None,
            batches=sum(e.batches for e in epochs),
            samples=sum(e.samples for e in epochs),
            seconds=sum(e.seconds for e in epochs),
            bytes_read=sum(e.bytes_read for e in epochs),
            bytes_yielded=sum(e.bytes_yielded for e in epochs),
            wait_seconds=sum(e.wait_seconds for e in epochs),
            retries=sum(e.retries for e in epochs),
            chunks_missing=sum(e.chunks_missing for e in epochs),
            skipped=[item for e in epochs for item in e.skipped],
            time_to_first_batch=_mean(
                [e.time_to_first_batch for e in epochs if e.time_to_first_batch is not None]
            ),
            cache_hits=_sum([e.cache_hits for e in epochs]),
            cache_misses=_sum([e.cache_misses for e in epochs]),
            bytes_from_cache=_sum([e.bytes_from_cache for e in epochs]),
            cpu_seconds=sum(e.cpu_seconds for e in epochs),
            bottleneck=epochs[-1].bottleneck if epochs else None,
        )

    def to_json(self) -> dict[str, Any]:
        """JSON-ready values (non-finite numbers become null)."""
        record: dict[str, Any] = {} if self.epoch is None else {"epoch": self.epoch}
        record.update(
            batches=self.batches,
            samples=self.samples,
            seconds=self.seconds,
            samples_per_second=self.samples_per_second,
            mb_per_second=self.mb_per_second,
            bytes_read=self.bytes_read,
            bytes_yielded=self.bytes_yielded,
            read_amplification=_finite(self.read_amplification),
            wait_seconds=self.wait_seconds,
            wait_share=self.wait_share,
            retries=self.retries,
            chunks_missing=self.chunks_missing,
            skipped=_jsonable(self.skipped),
            time_to_first_batch=self.time_to_first_batch,
            cpu_seconds=self.cpu_seconds,
            cpu_s_per_gb=_finite(self.cpu_s_per_gb),
        )
        if self.bottleneck is not None:
            record["bottleneck"] = dataclasses.asdict(self.bottleneck)
        if self.cache_hits is not None:
            record.update(
                cache_hits=self.cache_hits,
                cache_misses=self.cache_misses,
                bytes_from_cache=self.bytes_from_cache,
            )
        return record


def _sum(values: Sequence[int | None]) -> int | None:
    return None if any(v is None for v in values) or not values else sum(v or 0 for v in values)


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def format_summary(
    summary: dict[str, Any], epochs: Sequence[EpochResult], *, header: bool = True
) -> str:
    """The summary as text: data, stream, then one line per epoch and the total.

    ``header=False`` leaves out the lines up to the table (``run_bench``
    printed them before the epochs ran).
    """
    lines = _header(summary).split("\n") if header else []
    lines.append("")
    return _table(summary, epochs, summary["stream"].get("cache"), lines)


def _header(summary: dict[str, Any]) -> str:
    """The lines before the table: data, arrays, stream, scheduler, cache."""
    data = summary["data"]

    def array_line(role: str, described: dict[str, Any]) -> str:
        shape, chunks = _shape(described["shape"]), _shape(described["chunks"] or [])
        name = f" {described['path']!r}" if described["path"] else ""
        members = described.get("members")
        of = f" of {members} stores (first member's chunks)" if members else ""
        return f"{role}{name} {shape} {described['dtype']}, chunks {chunks}{of}"

    arrays = [array_line("features", data["features"])]
    if data["labels"] is not None:
        arrays.append(array_line("labels", data["labels"]))
    where = f"generated {data['generated']}" if data["store"] is None else data["store"]
    if isinstance(where, list):
        where = f"{len(where)} stores ({where[0]}, ...)"
    stream = summary["stream"]
    lines = [
        f"data:         {where}",
        f"arrays:       {'; '.join(arrays)}",
        f"stream:       {stream['call']}, {stream['batches_per_epoch']} batches per epoch",
        f"computing on: {summary['computing_on']}",
    ]
    cache = stream.get("cache")
    if cache is not None:
        disk = "" if cache["disk"] is None else f" (at most {cache['disk']:,} bytes)"
        where = "" if cache["directory"] is None else f", directory {cache['directory']}{disk}"
        lines.append(f"cache:        ChunkCache, memory {cache['memory']:,} bytes{where}")
    return "\n".join(lines)


def _table(
    summary: dict[str, Any], epochs: Sequence[EpochResult], cache: Any, lines: list[str]
) -> str:
    """``lines`` followed by the table of epochs, the spread, the CPU note and counters."""
    header = ["epoch", "batches", "samples", "seconds", "samples/s", "MB/s", "cpu-s/GB"]
    header += ["read amp", "wait"]
    header.append("first batch")
    if cache is not None:
        header += ["cache hits", "MB from cache"]
    total = EpochResult.total(epochs)
    rows = [
        [
            "total" if result.epoch is None else str(result.epoch),
            f"{result.batches:,}",
            f"{result.samples:,}",
            f"{result.seconds:.2f}",
            f"{result.samples_per_second:,.0f}",
            f"{result.mb_per_second:.1f}",
            "-" if not math.isfinite(result.cpu_s_per_gb) else f"{result.cpu_s_per_gb:.2f}",
            f"{result.read_amplification:.2f}",
            f"{result.wait_share:.0%}",
            "-"
            if result.time_to_first_batch is None
            else f"{result.time_to_first_batch * 1e3:.1f} ms",
            *_cache_cells(result, cache is not None),
        ]
        for result in [*epochs, total]
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        lines.append("  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)))
    skipped = total.skipped
    shown = "" if not skipped else " " + ", ".join(str(item) for item in skipped[:5])
    more = f", ... ({len(skipped) - 5} more)" if len(skipped) > 5 else ""
    lines.append("")
    if total.bottleneck is not None:
        last = "" if len(epochs) == 1 else " (the last epoch's)"
        lines.append(f"{total.bottleneck}{last}")
    spread = summary.get("spread")
    if spread is not None:
        lines.append(
            f"epoch seconds: min {spread['min']:.3f} / median {spread['median']:.3f} / "
            f"max {spread['max']:.3f} (slowest {spread['slowest_over_fastest']:.2f}x the fastest)"
        )
    cpu_of = summary["cpu_of"]
    lines.append(f"cpu-s/GB:     CPU seconds of {cpu_of} (all threads) per GB handed out")
    lines.append(
        f"counters: retries={total.retries} chunks_missing={total.chunks_missing} "
        f"skipped={len(skipped)}{shown}{more}"
    )
    return "\n".join(lines)


def _cache_cells(result: EpochResult, cached: bool) -> list[str]:
    """An epoch's cache columns: chunks from the cache of all it looked up, and MB from it."""
    if not cached:
        return []
    hits, misses = result.cache_hits or 0, result.cache_misses or 0
    return [f"{hits:,}/{hits + misses:,}", f"{(result.bytes_from_cache or 0) / 1e6:.1f}"]


def _shape(values: Sequence[int]) -> str:
    return "(" + ", ".join(str(v) for v in values) + ("," if len(values) == 1 else "") + ")"


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _jsonable(value: Any) -> Any:
    """``value`` with tuples as lists, numpy scalars as numbers, anything else as str."""
    if isinstance(value, list | tuple):
        return [_jsonable(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _jsonable(item) for key, item in value.items()}
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)
