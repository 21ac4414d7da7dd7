"""Shuffle quality against training (issue 28): sorted digits, an MLP, every shuffle mode.

``python -m benchmarks --only quality-training``: scikit-learn's digits (1,797 8 x 8
images, shipped with scikit-learn), split 80 / 20 (stratified, seed 0), the training
rows sorted by label (a store written class by class), stored as Zarr arrays in
128-row chunks; an ``MLPClassifier`` (64 hidden units, adam, learning rate 0.01)
trained by ``partial_fit`` on each batch of 32 for 8 epochs, 3 seeds, through a
``Loader`` per mode: sequential, fixed buffers of 2 to 11 chunks,
``shuffle_buffer_size="auto"`` (default target), the exact shuffle, and
``write_shuffled`` once then a 2-chunk buffer over the shuffled copy, and torch's
``DataLoader(shuffle=True)`` over the same sorted rows in memory (when torch is
installed; its figures are counted from the indices it drew).  Per mode: the
held-out accuracy (mean and spread over seeds), the delivered batch mixing
(``stats.quality.mixing``), label mixing (``Loader(labels=...)``), neighbour entropy and
the epoch time (the loader's batches alone, and with training).  Writes
``--out/quality_training.md`` and ``.json`` and ``docs/quality_training.png``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import zarr
import zarr.storage

import daskzarr_batches as dzb

CHUNK = 128
BATCH = 32
EPOCHS = 8
SEEDS = (0, 1, 2)
BUFFERS = (2, 4, 6, 8, 9, 10, 11)
LEARNING_RATE = 0.01


def digits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Training rows sorted by label, and the held-out rows."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype("f4")
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.2, random_state=0, stratify=y
    )
    order = np.argsort(y_train, kind="stable")
    return x_train[order], y_train[order].astype("i8"), x_test, y_test


def stored(values: np.ndarray) -> zarr.Array:
    chunks = (CHUNK, *values.shape[1:])
    fill = -1 if values.ndim == 1 else 0  # every label chunk written (0 is a label)
    array = zarr.create_array(
        zarr.storage.MemoryStore(), shape=values.shape, chunks=chunks, dtype=values.dtype,
        fill_value=fill,
    )  # fmt: skip
    array[:] = values
    return array


def modes(x: zarr.Array, y: zarr.Array, shuffled: dict[str, zarr.Array]) -> dict[str, Any]:
    """Each mode's data and Loader keywords."""
    data = {"x": x, "y": y}
    chosen: dict[str, Any] = {"sequential": (data, {})}
    for chunks in BUFFERS:
        chosen[f"buffer {chunks} chunks"] = (
            data,
            {"shuffle": True, "shuffle_buffer_size": chunks * CHUNK},
        )
    chosen["auto"] = (data, {"shuffle": True, "shuffle_buffer_size": "auto"})
    chosen["exact"] = (data, {"shuffle": True})
    chosen["write_shuffled + buffer 2 chunks"] = (
        shuffled,
        {"shuffle": True, "shuffle_buffer_size": 2 * CHUNK},
    )
    return chosen


def train(
    data: dict[str, zarr.Array], kw: dict[str, Any], test: tuple[np.ndarray, np.ndarray],
    epochs: int,
) -> dict[str, Any]:  # fmt: skip
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPClassifier

    accuracies, mixing, labels, entropy, seconds, loading, buffers = [], [], [], [], [], [], []
    target = None
    classes = np.arange(10)
    for seed in SEEDS:
        model = MLPClassifier(
            hidden_layer_sizes=(64,), learning_rate_init=LEARNING_RATE, random_state=seed
        )
        loader = dzb.Loader(data, BATCH, seed=seed, labels="y", **kw)
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            started = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", category=ConvergenceWarning)
                warnings.simplefilter("ignore", category=dzb.ShuffleQualityWarning)
                for batch in loader:
                    model.partial_fit(batch["x"], batch["y"], classes=classes)
            seconds.append(time.perf_counter() - started)
            quality = loader.stats.quality
            assert quality is not None and quality.mixing is not None
            mixing.append(quality.mixing)
            labels.append(quality.label_mixing)
            entropy.append(quality.entropy)
            started = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", category=dzb.ShuffleQualityWarning)
                loader.set_epoch(epoch)
                stream = loader.stream()
                for _ in stream:
                    pass
            loading.append(time.perf_counter() - started)
            buffers.append(stream.spec.shuffle_buffer_size)
            target = stream.spec.shuffle_quality
        accuracies.append(float(model.score(*test)))
    chunks = sorted({int(b) // CHUNK for b in buffers if isinstance(b, int)})
    return {
        "accuracy": float(np.mean(accuracies)),
        "accuracies": accuracies,
        "mixing": float(np.mean(mixing)),
        "label_mixing": float(np.mean(labels)),
        "entropy": float(np.mean(entropy)),
        "epoch_seconds": float(np.median(seconds)),
        "load_seconds": float(np.median(loading)),
        "buffer_chunks": chunks,
        "shuffle_quality": target,
    }


TORCH = "torch DataLoader(shuffle=True)"


def train_torch(
    x: np.ndarray, y: np.ndarray, test: tuple[np.ndarray, np.ndarray], epochs: int
) -> dict[str, Any] | None:
    """Torch's ``DataLoader(shuffle=True)`` over the sorted rows in memory, or None (no torch).

    Its batch mixing and neighbour entropy are counted from the indices its
    sampler drew, by the same counter a stream uses (``plan.quality``).
    """
    try:
        import torch
        from torch.utils.data import DataLoader
    except ImportError:
        return None
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPClassifier

    from benchmarks.internals import order_quality

    n = len(x)
    strata = np.minimum(np.arange(0, n + CHUNK, CHUNK), n)
    accuracies, mixing, entropy, seconds = [], [], [], []
    classes = np.arange(10)
    for seed in SEEDS:
        model = MLPClassifier(
            hidden_layer_sizes=(64,), learning_rate_init=LEARNING_RATE, random_state=seed
        )
        generator = torch.Generator().manual_seed(seed)
        loader = DataLoader(range(n), batch_size=BATCH, shuffle=True, generator=generator)
        for _ in range(epochs):
            drawn = []
            started = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", category=ConvergenceWarning)
                for index in loader:
                    ids = index.numpy()
                    model.partial_fit(x[ids], y[ids], classes=classes)
                    drawn.append(ids)
            seconds.append(time.perf_counter() - started)
            quality = order_quality(np.concatenate(drawn), BATCH, strata)
            assert quality.mixing is not None
            mixing.append(quality.mixing)
            entropy.append(quality.entropy)
        accuracies.append(float(model.score(*test)))
    return {
        "accuracy": float(np.mean(accuracies)),
        "accuracies": accuracies,
        "mixing": float(np.mean(mixing)),
        "label_mixing": float("nan"),  # not counted: no Loader(labels=...)
        "entropy": float(np.mean(entropy)),
        "epoch_seconds": float(np.median(seconds)),
        "load_seconds": float("nan"),
        "buffer_chunks": [],
        "shuffle_quality": None,
    }


def plot(rows: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    exact = rows["exact"]["accuracy"]
    for name, row in rows.items():
        marker = "r*" if name == "auto" else ("gs" if "write_shuffled" in name else "o")
        if name == TORCH:
            marker = "mD"
        left.plot([row["mixing"]], [row["accuracy"]], marker, ms=10 if name == "auto" else 6)
        left.plot([row["entropy"]], [row["accuracy"]], "x", color="grey", ms=6)
        left.plot([row["label_mixing"]], [row["accuracy"]], "^", mfc="none", color="k", ms=5)
        short = name.replace("buffer ", "").replace(" chunks", "").replace(" + buffer 2", "+2")
        left.annotate(short, (row["mixing"], row["accuracy"]), textcoords="offset points",
                      xytext=(4, -10), fontsize=7)  # fmt: skip
        if np.isnan(row["load_seconds"]):  # torch's epoch: batches and training together
            continue
        right.plot([row["load_seconds"] * 1000], [row["accuracy"]], marker)
        right.annotate(short, (row["load_seconds"] * 1000, row["accuracy"]),
                       textcoords="offset points", xytext=(4, -10), fontsize=7)  # fmt: skip
    left.axhline(exact - 0.01, color="grey", lw=0.5, ls="--")
    left.plot([], [], "o", color="C0", label="batch mixing (stats.quality.mixing)")
    left.plot([], [], "x", color="grey", label="neighbour entropy (stats.quality.entropy)")
    left.plot([], [], "^", mfc="none", color="k", label="label mixing (Loader(labels=...))")
    left.set_xlabel("figure, as a fraction of an exact shuffle's")
    left.set_ylabel(f"held-out accuracy ({len(SEEDS)} seeds, {EPOCHS} epochs)")
    left.set_title("Sorted digits: accuracy vs the shuffle's figure")
    left.legend(loc="lower right", fontsize=7)
    right.set_xlabel("epoch time, batches only (ms)")
    right.set_title("accuracy vs epoch time")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run(options: argparse.Namespace) -> None:
    """Every mode trained; ``quality_training.md`` / ``.json`` in ``--out``, the plot in docs/."""
    out = Path(options.out)
    out.mkdir(parents=True, exist_ok=True)
    epochs = options.epochs or EPOCHS
    load = os.getloadavg()
    x_train, y_train, x_test, y_test = digits()
    x, y = stored(x_train), stored(y_train)
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        shuffled = dzb.write_shuffled({"x": x, "y": y}, Path(tmp) / "shuffled.zarr", seed=0)
        write_seconds = time.perf_counter() - started
        rows = {}
        for name, (data, kw) in modes(x, y, shuffled).items():
            rows[name] = train(data, kw, (x_test, y_test), epochs)
        reference = train_torch(x_train, y_train, (x_test, y_test), epochs)
        if reference is not None:
            rows[TORCH] = reference
        for name, row in rows.items():
            print(
                f"  {name:34s} accuracy {row['accuracy']:.3f}  mixing {row['mixing']:.3f}  "
                f"label mixing {row['label_mixing']:.3f}  entropy {row['entropy']:.3f}  "
                f"epoch {row['load_seconds'] * 1000:.0f} ms",
                flush=True,
            )
    figure = Path(__file__).resolve().parents[2] / "docs" / "quality_training.png"
    plot(rows, figure)
    import sklearn

    command = "python -m benchmarks --only quality-training" + (
        f" --epochs {epochs}" if epochs != EPOCHS else ""
    )
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    load_after = os.getloadavg()
    exact = rows["exact"]["accuracy"]
    lines = [
        "# Shuffle quality against training: sorted digits (issue 28)",
        "",
        f"`{command}` on {now}: scikit-learn {sklearn.__version__}'s digits, "
        f"{len(x_train):,} training rows sorted by label in {CHUNK}-row chunks, "
        f"{len(x_test)} held out; MLPClassifier(64 hidden, adam, lr {LEARNING_RATE}), "
        f"partial_fit per batch of {BATCH}, {epochs} epochs, seeds {list(SEEDS)}; "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, zarr {zarr.__version__}, "
        f"numpy {np.__version__}; load average (1 min) {load[0]:.1f} at the start, "
        f"{load_after[0]:.1f} at the end. write_shuffled took {write_seconds:.2f} s.",
        "",
        "| mode | buffer (chunks) | accuracy (mean; per seed) | vs exact | batch mixing | "
        "label mixing | neighbour entropy | epoch (batches only) | epoch (with training) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in rows.items():
        chunks = ", ".join(str(c) for c in row["buffer_chunks"]) or "-"
        seeds = " / ".join(f"{a:.3f}" for a in row["accuracies"])
        labelled = "-" if np.isnan(row["label_mixing"]) else f"{row['label_mixing']:.3f}"
        alone = "-" if np.isnan(row["load_seconds"]) else f"{row['load_seconds'] * 1000:.0f} ms"
        lines.append(
            f"| {name} | {chunks} | {row['accuracy']:.3f} ({seeds}) | "
            f"{(row['accuracy'] - exact) * 100:+.1f} pts | {row['mixing']:.3f} | "
            f"{labelled} | {row['entropy']:.3f} | "
            f"{alone} | {row['epoch_seconds'] * 1000:.0f} ms |"
        )
    auto = rows["auto"]["accuracy"]
    lines += [
        "",
        f'"auto" (default shuffle_quality {rows["auto"]["shuffle_quality"]} of '
        f"batch mixing) trains {(auto - exact) * 100:+.1f} points from the exact shuffle "
        f"(target: within 1 point: {'PASS' if auto >= exact - 0.01 else 'MISS'}); a 2-chunk "
        f"buffer's batch mixing is {rows['buffer 2 chunks']['mixing']:.3f} (target <= 0.5: "
        f"{'PASS' if rows['buffer 2 chunks']['mixing'] <= 0.5 else 'MISS'}), the exact "
        f"shuffle's {rows['exact']['mixing']:.3f} (target >= 0.95: "
        f"{'PASS' if rows['exact']['mixing'] >= 0.95 else 'MISS'}).",
        "",
        "![accuracy vs batch mixing](../../docs/quality_training.png)",
        "",
    ]
    (out / "quality_training.md").write_text("\n".join(lines), encoding="utf-8")
    (out / "quality_training.json").write_text(
        json.dumps({"command": command, "when": now, "rows": rows}, indent=1), encoding="utf-8"
    )
    print(f"wrote {out / 'quality_training.md'} and {figure}")
