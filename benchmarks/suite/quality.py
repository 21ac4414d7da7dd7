"""Shuffle quality, computed from the plans (nothing read), and the first buffered batch.

The suite's table (:func:`quality_table`), and ``python -m benchmarks --only quality``
(:func:`run`): the planned neighbour entropy of a buffered shuffle against its buffer
(with ``shuffle_buffer_size="auto"``'s choice marked; ``docs/quality_vs_buffer.png``), and
the time to the first batch of a buffered stream (its first buffer read as one window)
beside zarr's own ``x[a:b]`` over as many chunks, locally and on a 20 ms store.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import zarr

import daskzarr_batches as dzb
import daskzarr_batches.plan as dzplan

from ..internals import buffer_estimate


def shuffle_order(plan: dzplan.EpochPlan) -> np.ndarray:
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


def stream_plan(x: zarr.Array, buffer_rows: int | None) -> dzplan.EpochPlan:
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
    return rows


#: the buffers of the quality curve, in chunks, and the dataset's shape
CURVE_CHUNKS = (1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 48)
ROWS, COLS, CHUNK_ROWS = 400_000, 64, 8192
#: the first buffered batch: buffer in chunks, store latency, rounds
FIRST_CHUNKS, LATENCY, ROUNDS = 8, 0.02, 9


def curve(x: zarr.Array, chunk_rows: int) -> dict[str, Any]:
    """Planned and estimated neighbour entropy per buffer, and the "auto" choices (seed 0)."""
    rows = []
    for chunks in CURVE_CHUNKS:
        if chunks * chunk_rows > x.shape[0]:
            break
        plan = dzb.plan_epoch(x, 256, shuffle=True, seed=0, shuffle_buffer_size=chunks * chunk_rows)
        stream = dzb.shuffled_batch_stream(x, 256, seed=0, shuffle_buffer_size=chunks * chunk_rows)
        stream.close()
        # the estimate "auto" starts its search from, for this buffer
        estimate = buffer_estimate(stream.plan.units, chunks * chunk_rows)
        assert plan.quality is not None
        rows.append(
            {
                "chunks": chunks,
                "entropy": plan.quality.entropy,
                "estimate": estimate,
                "displacement": plan.quality.displacement,
                "mib": chunks * chunk_rows * x.dtype.itemsize * x.shape[1] / 2**20,
            }
        )
    auto = {}
    for target in (0.9, 0.95, 0.99):
        started = time.perf_counter()
        try:
            plan = dzb.plan_epoch(
                x, 256, shuffle=True, seed=0, shuffle_buffer_size="auto", shuffle_quality=target
            )
        except dzb.ArgumentValueError as error:  # the budget cannot meet the target
            auto[str(target)] = {"error": str(error)}
            continue
        seconds = time.perf_counter() - started
        size = plan.windows[0].samples  # the first window is the first buffer, whole units
        auto[str(target)] = {
            "chunks": round(size / chunk_rows),
            # the epoch's own expected batch mixing, which "auto" held to the target
            "figure": plan.buffer_figure,
            "entropy": plan.quality.entropy if plan.quality else None,
            "seconds": seconds,
        }
    return {"rows": rows, "auto": auto}


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    chunks = [r["chunks"] for r in result["rows"]]
    ax.plot(chunks, [r["entropy"] for r in result["rows"]], "o-", label="this epoch (plan)")
    ax.plot(
        chunks, [r["estimate"] for r in result["rows"]], "x--", label="estimate (where auto starts)"
    )
    for target, choice in result["auto"].items():
        if "error" in choice:
            continue
        ax.axhline(float(target), color="grey", lw=0.5)
        ax.plot([choice["chunks"]], [choice["entropy"]], "r*", ms=12)
        ax.annotate(
            f"auto, q={target}: {choice['chunks']} chunks",
            (choice["chunks"], choice["entropy"]),
            textcoords="offset points",
            xytext=(8, -12),
            fontsize=8,
        )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("shuffle buffer (chunks of 8192 rows, 400,000 rows)")
    ax.set_ylabel("neighbour entropy / exact shuffle's")
    ax.set_title("Shuffle quality vs buffer size")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def first_seconds(make: Callable[[], Any]) -> float:
    started = time.perf_counter()
    with make() as stream:
        next(stream)
        return time.perf_counter() - started


def first_batch(x: zarr.Array, rounds: int) -> dict[str, float]:
    """Medians over interleaved rounds: one chunk, ``x[a:b]`` over the buffer's chunks,
    sequential and buffered first batches; the seed (so the first buffer) varies by round."""
    rows = x.chunks[0]
    n_chunks = x.shape[0] // rows
    buffer = FIRST_CHUNKS * rows
    times: dict[str, list[float]] = {
        "chunk": [], "buffer read": [], "sequential": [], "buffered": []
    }  # fmt: skip
    for k in range(rounds):
        lo = (k * 7 % (n_chunks - FIRST_CHUNKS)) * rows
        started = time.perf_counter()
        x[lo : lo + rows]
        times["chunk"].append(time.perf_counter() - started)
        started = time.perf_counter()
        x[lo : lo + buffer]
        times["buffer read"].append(time.perf_counter() - started)
        times["sequential"].append(first_seconds(lambda: dzb.batch_stream(x, 256)))
        times["buffered"].append(
            first_seconds(
                lambda k=k: dzb.shuffled_batch_stream(x, 256, seed=k, shuffle_buffer_size=buffer)
            )
        )
    result = {name: statistics.median(values) for name, values in times.items()}
    # per-round ratios, paired: the load of a shared machine drifts between rounds
    for name, base in (("buffered/buffer read", "buffer read"), ("buffered/chunk", "chunk"),
                       ("sequential/chunk", "chunk")):  # fmt: skip
        stream = name.split("/")[0]
        result[name] = statistics.median(
            a / b for a, b in zip(times[stream], times[base], strict=True)
        )
    return result


def run(options: argparse.Namespace) -> None:
    """The curve, its plot, the first-batch cases; ``quality.md`` / ``.json`` in ``--out``."""
    import zarr.storage

    from ..latency_store import LatencyStore
    from .dataset import make_dataset

    data_dir, out = Path(options.data), Path(options.out)
    data_dir.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    rounds = options.rounds or ROUNDS
    load = os.getloadavg()
    ds = make_dataset(data_dir, ROWS, COLS, CHUNK_ROWS)
    x = zarr.open_array(ds.path, path="features", mode="r")
    result = curve(x, CHUNK_ROWS)
    figure = Path(__file__).resolve().parents[2] / "docs" / "quality_vs_buffer.png"
    plot(result, figure)
    local = first_batch(x, rounds)
    store = LatencyStore(zarr.storage.LocalStore(ds.path, read_only=True), LATENCY, metadata=True)
    slow = first_batch(zarr.open_array(store, path="features", mode="r"), rounds)
    load_after = os.getloadavg()
    checks = [
        ("buffered first batch <= 1.2x x[a:b] over its 8 chunks (local)",
         local["buffered/buffer read"], 1.2),
        ("buffered first batch <= 2x one request (20 ms store)", slow["buffered/chunk"], 2.0),
        ("sequential first batch <= 3x one chunk read (local)", local["sequential/chunk"], 3.0),
    ]  # fmt: skip
    command = "python -m benchmarks --only quality" + (
        f" --rounds {rounds}" if rounds != ROUNDS else ""
    )
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Shuffle quality and the first buffered batch (issue 18)",
        "",
        f"`{command}` on {now}: {ROWS:,} x {COLS} float32 in {CHUNK_ROWS}-row chunks "
        f"(zstd, local directory store); {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, zarr {zarr.__version__}, numpy {np.__version__}; load "
        f"average (1 min) {load[0]:.1f} at the start, {load_after[0]:.1f} at the end.",
        "",
        "## Neighbour entropy vs buffer (plan, seed 0; nothing read)",
        "",
        "| buffer (chunks) | MiB | entropy / exact (epoch) | estimate (auto) | displacement |",
        "|---:|---:|---:|---:|---:|",
        *(
            f"| {r['chunks']} | {r['mib']:.0f} | {r['entropy']:.3f} | {r['estimate']:.3f} "
            f"| {r['displacement']:.3f} |"
            for r in result["rows"]
        ),
        "",
        "| shuffle_quality | auto buffer (chunks) | figure held to (batch mixing) | "
        "neighbour entropy (epoch) | plan_epoch time |",
        "|---:|---:|---:|---:|---:|",
        *(
            f"| {q} | {c['chunks']} | {c['figure']:.3f} | {c['entropy']:.3f} "
            f"| {c['seconds'] * 1e3:.0f} ms |"
            if "error" not in c
            else f"| {q} | error: {c['error']} | | | |"
            for q, c in result["auto"].items()
        ),
        "",
        f"## Time to the first batch (medians of {rounds} interleaved rounds, batch 256, "
        f"buffer {FIRST_CHUNKS} chunks)",
        "",
        "| store | one chunk `x[a:b]` | `x[a:b]` over 8 chunks | sequential | buffered |",
        "|---|---:|---:|---:|---:|",
        *(
            f"| {name} | {t['chunk'] * 1e3:.1f} ms | {t['buffer read'] * 1e3:.1f} ms "
            f"| {t['sequential'] * 1e3:.1f} ms | {t['buffered'] * 1e3:.1f} ms |"
            for name, t in (("local", local), (f"{LATENCY * 1e3:.0f} ms per request", slow))
        ),
        "",
        "Targets: medians of the per-round ratios (each round times both side by side).",
        "",
        "| target | measured | result |",
        "|---|---|---|",
        *(
            f"| {what} | {value:.2f}x | {'met' if value <= limit else 'missed'} |"
            for what, value, limit in checks
        ),
    ]
    text = "\n".join(lines) + "\n"
    (out / "quality.md").write_text(text)
    payload = {
        "command": command,
        "date": now,
        "load": [load, load_after],
        "curve": result,
        "first_batch": {"local": local, "latency": slow},
        "targets": [{"what": w, "value": v, "limit": lim, "met": v <= lim} for w, v, lim in checks],
    }
    (out / "quality.json").write_text(json.dumps(payload, indent=1) + "\n")
    print("\n" + text)
