"""Measure sequential window size x prefetch, to choose the stream defaults.

Run from the repository root (the dataset is the suite's, made once under ``--data``)::

    python -m benchmarks --only defaults [--rows 1000000 --cols 64 --chunk-rows 8192]

Every combination and L0 run in interleaved rounds (best kept); the table goes to
``<out>/defaults.md`` (``benchmarks/results/``) as ratios against L0 measured in the same run.
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

import zarr

import daskzarr_batches as dzb

from .suite.cases import l0
from .suite.dataset import default_shape, make_dataset
from .suite.measure import Case, Measured, drain, rounds

WINDOW_MIB = (8, 16, 32, 64, 128)
PREFETCH = (0, 1, 2, 4)
#: default of ``--rounds``
ROUNDS = 3


def sequential(x: zarr.Array, window_bytes: int, prefetch: int) -> Measured:
    return drain(dzb.batch_stream(x, 256, window_bytes=window_bytes, prefetch=prefetch))


def run(options: argparse.Namespace) -> None:
    """Write ``<out>/defaults.md`` and print it."""
    rows, cols, chunk_rows = default_shape(False)
    args = argparse.Namespace(rounds=options.rounds or ROUNDS, out=options.out)
    Path(options.data).mkdir(parents=True, exist_ok=True)
    ds = make_dataset(
        Path(options.data),
        options.rows or rows,
        options.cols or cols,
        options.chunk_rows or chunk_rows,
    )
    x = ds.features
    cases = [Case("L0", "reference", lambda: l0(x))]
    for mib in WINDOW_MIB:
        for prefetch in PREFETCH:
            run = functools.partial(sequential, x, mib * 2**20, prefetch)
            cases.append(Case(f"{mib} MiB / prefetch {prefetch}", "this", run))
    best = {name: result.seconds for name, result in rounds(cases, args.rounds).items()}
    ref = best["L0"]
    lines = [
        "# Sequential window size x prefetch (batch 256), ratio vs L0",
        "",
        f"`python -m benchmarks --only defaults` on {ds.rows:,} x {ds.cols} float32, "
        f"{ds.chunk_rows}-row chunks; L0 = {ds.feature_bytes / ref / 1e6:.0f} MB/s; "
        f"best of {args.rounds} interleaved rounds.",
        "",
        "| window | " + " | ".join(f"prefetch {p}" for p in PREFETCH) + " |",
        "|---|" + "---:|" * len(PREFETCH),
    ]
    for mib in WINDOW_MIB:
        cells = [f"{ref / best[f'{mib} MiB / prefetch {p}']:.2f}x" for p in PREFETCH]
        lines.append(f"| {mib} MiB | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "defaults.md").write_text(text)
    print(text)
