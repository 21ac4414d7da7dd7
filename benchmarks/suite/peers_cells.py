"""The peers step's single-cell case (issue 37): sparse cells beside annbatch on its own format.

``python -m benchmarks --only peers-cells [--rows N] [--rounds N]`` needs the ``peers``
extra (annbatch 0.3, anndata).  It writes, once under ``--data``, a Tahoe-like store scaled
to a small machine with annbatch's own writer (``annbatch.write_sharded``, its defaults:
zarr v3, 64 cells of non-zeros per chunk, 1 GB shards, blosc lz4, the narrowest index
dtype): ``X`` a CSR matrix of ``CELLS`` cells x ``GENES`` genes, about ``NNZ`` non-zeros a
cell (counts, float32).  In interleaved rounds (each case once per round, the order
rotated) it measures:

- **L0**: zarr-python reading every stored chunk of ``data`` and of ``indices`` once, shard
  by shard, on one thread: the reference every case is divided by (medians of the rounds);
- **sequential**: ``batch_stream(x, BATCH)`` and annbatch's ``Loader(shuffle=False)``;
- **shuffled**: ``shuffled_batch_stream(x, BATCH, shuffle_buffer_size="auto")`` (its
  batch mixing and buffer printed beside), annbatch's ``Loader(shuffle=True)`` with its
  defaults (``chunk_size=512``, ``preload_nchunks=32``; ``batch_size=BATCH``, its default
  of 1 being no training setting) and with the settings its documentation's example gives
  for speed (``batch_size=4096, chunk_size=32, preload_nchunks=512``).

annbatch reads through ``zarrs.ZarrsCodecPipeline`` when installed ("necessary for local
filesystem performance"), ``preload_to_gpu=False`` (no GPU here).  Every reader yields
every cell once (checked).  Results: ``<out>/peers_cells.md`` and ``peers_cells.json``.
Targets: shuffled auto >= 1.5x annbatch's defaults and >= 1.0x its speed settings, and
sequential >= 1.0x L0, in cells/s (ratios in the same rounds).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import time
import warnings
from collections.abc import Callable
from importlib.metadata import version
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import numpy as np
import zarr

import daskzarr_batches as dzb

from .peers import PEER_WARNINGS

CELLS, GENES, NNZ = 20_000, 8_000, 300
BATCH = 1024
ROUNDS = 3
#: annbatch's documented example "for speed" (its Loader docstring)
SPEED = {"batch_size": 4096, "chunk_size": 32, "preload_nchunks": 512}
L0 = "L0: zarr, every chunk of data and indices once, 1 thread"
SEQ_THIS, SEQ_ANN = "sequential: this library", "sequential: annbatch"
AUTO = 'shuffled, "auto": this library'
ANN_DEFAULTS = "shuffled: annbatch defaults"
ANN_SPEED = "shuffled: annbatch speed settings"

#: one epoch: cells yielded and what it read or planned
Epoch = Callable[[], tuple[int, dict[str, Any]]]


def make_cells(data_dir: Path, cells: int) -> Path:
    """annbatch's ``write_sharded`` store of ``cells`` x ``GENES`` counts (written once)."""
    import anndata as ad
    import pandas as pd
    import scipy.sparse as sp
    from annbatch import write_sharded

    path = data_dir / f"peers_cells_{cells}_g{GENES}_nnz{NNZ}.zarr"
    if (path / "complete").exists():
        return path
    rng = np.random.default_rng(0)
    counts = rng.poisson(NNZ, cells).clip(1, GENES)
    indptr = np.concatenate([[0], np.cumsum(counts)])
    indices = np.concatenate([np.sort(rng.choice(GENES, c, replace=False)) for c in counts])
    data = rng.integers(1, 30, len(indices)).astype(np.float32)
    matrix = sp.csr_matrix((data, indices, indptr), shape=(cells, GENES))
    obs = pd.DataFrame(
        {"cell_type": pd.Categorical(rng.choice(["B", "T", "NK", "mono"], cells))},
        index=[f"cell{i}" for i in range(cells)],
    )
    adata = ad.AnnData(X=matrix, obs=obs, var=pd.DataFrame(index=[f"g{j}" for j in range(GENES)]))
    write_sharded(zarr.open_group(path, mode="w", zarr_format=3), adata)
    (path / "complete").write_text("ok")
    return path


def l0(group: zarr.Group) -> tuple[int, dict[str, Any]]:
    """Every stored chunk of ``data`` and ``indices`` decoded once, shard by shard, in order."""
    for name in ("data", "indices"):
        array = group[name]
        assert isinstance(array, zarr.Array)
        step = (array.shards or array.chunks)[0]
        for lo in range(0, array.shape[0], step):
            array[lo : lo + step]
    return group["indptr"].shape[0] - 1, {}


def this_epoch(make: Callable[[], Any]) -> Epoch:
    def run() -> tuple[int, dict[str, Any]]:
        cells = 0
        with make() as stream:
            for batch in stream:
                cells += batch.shape[0]
        summary = stream.summary()
        quality = summary.quality
        read = {
            "read amplification": stream.stats.read_amplification,
            "chunk reads": stream.stats.chunks_read,
            "batch mixing": None if quality is None else quality.mixing,
            "buffer figure": summary.buffer_figure,
            "buffer": getattr(stream.spec, "window_rows", None),
        }
        return cells, read

    return run


def annbatch_epoch(path: Path, shuffle: bool, **settings: Any) -> Epoch:
    """A new annbatch ``Loader`` over ``X`` (zarrs' pipeline when installed), one epoch."""
    import annbatch
    import anndata as ad

    zarrs = {"codec_pipeline.path": "zarrs.ZarrsCodecPipeline"} if find_spec("zarrs") else {}
    rng = np.random.default_rng(0)

    def run() -> tuple[int, dict[str, Any]]:
        with zarr.config.set(zarrs):
            group = zarr.open_group(path, mode="r")
            x = ad.io.sparse_dataset(group["X"])
            loader = annbatch.Loader(
                shuffle=shuffle, rng=rng, preload_to_gpu=False, **{"batch_size": BATCH, **settings}
            ).add_adata(ad.AnnData(X=x))
            return sum(batch["X"].shape[0] for batch in loader), {}

    return run


def cases(path: Path) -> dict[str, Epoch]:
    group = zarr.open_group(path, mode="r")
    x = dzb.open_array(path, "X")
    return {
        L0: lambda: l0(group["X"]),  # type: ignore[arg-type]
        SEQ_THIS: this_epoch(lambda: dzb.batch_stream(x, BATCH)),
        SEQ_ANN: annbatch_epoch(path, False, chunk_size=512),
        AUTO: this_epoch(
            lambda: dzb.shuffled_batch_stream(x, BATCH, seed=0, shuffle_buffer_size="auto")
        ),
        ANN_DEFAULTS: annbatch_epoch(path, True),
        ANN_SPEED: annbatch_epoch(path, True, **SPEED),
    }


def measure(data_dir: Path, cells: int, repeats: int) -> dict[str, Any]:
    """Seconds of every case in ``repeats`` interleaved rounds, its cells and reads."""
    with warnings.catch_warnings():
        for message in PEER_WARNINGS:
            warnings.filterwarnings("ignore", message)
        warnings.filterwarnings("ignore", category=FutureWarning)
        path = make_cells(data_dir, cells)
        epochs = cases(path)
        names = list(epochs)
        seconds: dict[str, list[float]] = {name: [] for name in names}
        yielded: dict[str, int] = {}
        read: dict[str, dict[str, Any]] = {}
        for round_number in range(repeats):
            shift = round_number % len(names)
            for name in names[shift:] + names[:shift]:
                started = time.perf_counter()
                yielded[name], read[name] = epochs[name]()
                seconds[name].append(time.perf_counter() - started)
    assert len(set(yielded.values())) == 1, yielded  # every reader: every cell once
    group = zarr.open_group(path, mode="r")["X"]
    chunk = group["data"].chunks[0]  # type: ignore[union-attr]
    return {
        "cells": cells, "genes": GENES, "nnz": int(group["indptr"][-1]),  # type: ignore[index]
        "data_chunk": int(chunk), "repeats": repeats, "seconds": seconds, "read": read,
    }  # fmt: skip


def ratios(results: dict[str, Any]) -> dict[str, float]:
    """Every case's median epoch against L0's (> 1: faster than L0)."""
    median = {name: statistics.median(s) for name, s in results["seconds"].items()}
    return {name: median[L0] / value for name, value in median.items()}


def evaluate(results: dict[str, Any]) -> list[dict[str, str]]:
    ratio = ratios(results)
    checks = []
    for what, ours, theirs, target in (
        ("shuffled auto vs annbatch defaults", AUTO, ANN_DEFAULTS, 1.5),
        ("shuffled auto vs annbatch speed settings", AUTO, ANN_SPEED, 1.0),
        ("sequential vs L0", SEQ_THIS, L0, 1.0),
    ):
        measured = ratio[ours] / ratio[theirs]
        checks.append({
            "what": f"{what} >= {target}x", "measured": f"{measured:.2f}x",
            "status": "PASS" if measured >= target else "MISS",
        })  # fmt: skip
    return checks


def versions() -> str:
    names = ("annbatch", "anndata", "zarr", "zarrs", "scipy", "numpy", "dask")
    return ", ".join(f"{name} {version(name)}" for name in names if find_spec(name))


def report(results: dict[str, Any], checks: list[dict[str, str]], command: str, now: str,
           load: tuple[float, float]) -> str:  # fmt: skip
    ratio = ratios(results)
    median = {name: statistics.median(s) for name, s in results["seconds"].items()}
    cells = results["cells"]
    lines = [
        "# Peers: single cells, sparse (issue 37)",
        "",
        f"`{command}` on {now}, Python {platform.python_version()}, {os.cpu_count()} CPUs "
        f"(shared), {versions()}; load average (1 min) {load[0]:.1f} at the start, "
        f"{load[1]:.1f} at the end.  annbatch's `write_sharded` store (its defaults): `X` "
        f"CSR {cells:,} cells x {results['genes']:,} genes, {results['nnz']:,} non-zeros "
        f"({results['nnz'] / cells:.0f} a cell), {results['data_chunk']:,} non-zeros a "
        f"stored chunk.  Batches of {BATCH} cells (annbatch speed settings: "
        f"{SPEED['batch_size']}).  Median epoch of {results['repeats']} interleaved rounds; "
        "ratio to L0 of the same rounds (> 1: faster than L0).",
        "",
        "| case | median s | cells/s | x L0 | read amplification | batch mixing |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name in results["seconds"]:
        read = results["read"].get(name, {})
        amp, mix = read.get("read amplification"), read.get("batch mixing")
        lines.append(
            f"| {name} | {median[name]:.3f} | {cells / median[name]:,.0f} | {ratio[name]:.2f} "
            f"| {'-' if amp is None else format(amp, '.3f')} "
            f"| {'-' if mix is None else format(mix, '.3f')} |"
        )
    auto = results["read"].get(AUTO, {})
    lines += [
        "",
        f'"auto" chose a buffer of {auto.get("buffer")} cells (expected batch mixing '
        f"{auto.get('buffer figure')}).",
        "",
        "| target | measured | result |",
        "|---|---|---|",
        *(f"| {c['what']} | {c['measured']} | {c['status']} |" for c in checks),
    ]
    return "\n".join(lines) + "\n"


def run(options: Any) -> None:
    """``--only peers-cells``: measure, evaluate, write ``peers_cells.md`` and ``.json``."""
    data_dir, out = Path(options.data), Path(options.out)
    data_dir.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    repeats = options.rounds or ROUNDS
    cells = options.rows or CELLS
    load = os.getloadavg()
    results = measure(data_dir, cells, repeats)
    load_after = os.getloadavg()
    checks = evaluate(results)
    command = (
        "python -m benchmarks --only peers-cells"
        + (f" --rounds {repeats}" if repeats != ROUNDS else "")
        + (f" --rows {cells}" if cells != CELLS else "")
    )
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    text = report(results, checks, command, now, (load[0], load_after[0]))
    (out / "peers_cells.md").write_text(text)
    payload = {"command": command, "date": now, "versions": versions(), **results,
               "ratios_to_l0": ratios(results), "targets": checks}  # fmt: skip
    (out / "peers_cells.json").write_text(json.dumps(payload, indent=1, default=str) + "\n")
    print("\n" + text)
