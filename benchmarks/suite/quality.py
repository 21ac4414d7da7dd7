"""Shuffle quality, computed from the plans (nothing read)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import zarr

import daskzarr_batches as dzb


def shuffle_order(plan: dzb.EpochPlan) -> np.ndarray:
    return np.concatenate([np.asarray(w.samples) for w in plan.windows()])


def displacement(order: np.ndarray) -> float:
    """Mean |new position - old position| / n, over 1/3 (exact ~ 1.0, none = 0)."""
    n = len(order)
    return float(np.abs(order - np.arange(n)).mean() / n * 3)


def neighbour_entropy(order: np.ndarray, bins: int = 256, n: int | None = None) -> float:
    """Entropy (bits) of the histogram of differences between neighbouring ids.

    ``n``: the number of samples ids are drawn from (default ``len(order)``;
    give it for a part of an epoch's order).
    """
    n = len(order) if n is None else n
    diffs = np.diff(order)
    hist, _ = np.histogram(diffs, bins=bins, range=(-n, n))
    p = hist[hist > 0] / hist.sum()
    return float(-(p * np.log2(p)).sum())


def stream_plan(x: zarr.Array, buffer_rows: int | None) -> dzb.EpochPlan:
    """The plan a shuffled stream follows (the stream is closed unread)."""
    stream = dzb.shuffled_batch_stream(x, 256, seed=0, shuffle_buffer_size=buffer_rows)
    stream.close()
    return stream.plan


def quality_row(
    mode: str,
    order: np.ndarray,
    *,
    buffer_chunks: int | None = None,
    amplification: float | None = None,
) -> dict[str, Any]:
    return {
        "mode": mode,
        "buffer_chunks": buffer_chunks,
        "displacement": displacement(order),
        "entropy": neighbour_entropy(order),
        "amplification": amplification,
    }


def quality_table(x: zarr.Array, chunk_rows: int) -> list[dict[str, Any]]:
    """Buffers of 1-32 chunks (as many as the dataset holds), then the exact shuffle."""
    rows = []
    for chunks in (1, 2, 4, 8, 16, 32):
        if chunks * chunk_rows > x.shape[0]:
            break
        buffer_rows = chunks * chunk_rows
        plan = dzb.plan_epoch(x, 256, shuffle=True, seed=0, shuffle_buffer_size=buffer_rows)
        order = shuffle_order(stream_plan(x, buffer_rows))
        rows.append(
            quality_row(
                f"buffered, {chunks} chunks",
                order,
                buffer_chunks=chunks,
                amplification=plan.read_amplification,
            )
        )
    rows.append(quality_row("exact", shuffle_order(stream_plan(x, None))))
    rows += ramp_rows(x, chunk_rows)
    return rows


def ramp_rows(x: zarr.Array, chunk_rows: int, chunks: int = 8) -> list[dict[str, Any]]:
    """What the fast-start ramp costs the shuffle: a buffer of ``chunks`` chunks with and
    without it, over the whole epoch and over its first buffer of samples (the
    part the ramp reads as windows of 1, 1, 2, 4, ... chunks).  Displacement and
    entropy of the first buffer are taken against the whole array (``n``).
    """
    buffer_rows = chunks * chunk_rows
    if buffer_rows > x.shape[0]:
        return []
    n = x.shape[0]
    ramped = stream_plan(x, buffer_rows)
    flat = dataclasses.replace(ramped, ramp=False)
    rows = []
    for label, plan in (("with ramp", ramped), ("without ramp", flat)):
        order = shuffle_order(plan)
        rows.append(quality_row(f"buffered, {chunks} chunks, {label}", order,
                                buffer_chunks=chunks))  # fmt: skip
        head = order[:buffer_rows]
        row = quality_row(f"buffered, {chunks} chunks, {label}: first buffer", head,
                          buffer_chunks=chunks)  # fmt: skip
        row["displacement"] = float(np.abs(head - np.arange(len(head))).mean() / n * 3)
        row["entropy"] = neighbour_entropy(head, n=n)
        rows.append(row)
    return rows
