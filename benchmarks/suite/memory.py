"""Memory cases: one epoch each in a fresh process, so earlier cases do not inflate its RSS.

The parent runs ``python -m benchmarks.suite.memory DATASET [--buffer N | --budget N]
--prefetch N`` from the repository root; the child prints its peak RSS as JSON.
``python -m benchmarks --only exact-sweep`` runs the exact-shuffle sweep alone.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import zarr

import daskzarr_batches as dzb
import daskzarr_batches.plan as dzplan

from . import ROOT
from .dataset import Dataset, make_dataset
from .measure import MiB, PeakRSS, drain

#: glibc returns large freed blocks to the system only above its mmap threshold,
#: which it raises as blocks are freed; fixing it shows how much of a peak RSS
#: is memory the allocator kept rather than memory the stream holds.
MMAP_ENV = {"MALLOC_MMAP_THRESHOLD_": "524288"}

#: the cases, by the key the targets and the report use
LABELS = {"one": "1x", "four": "4x", "exact": "exact", "exact_mmap": "exact+"}


def one_epoch(path: Path, *, buffer: int, budget: int, prefetch: int) -> dict[str, Any]:
    """In this process: one shuffled epoch; baseline and peak RSS."""
    x = zarr.open_array(path / "features", mode="r")
    baseline = psutil.Process().memory_info().rss
    started = time.perf_counter()
    with PeakRSS() as rss:
        if budget:
            stream = dzb.shuffled_batch_stream(
                x, 256, seed=0, memory_budget=budget, prefetch=prefetch
            )
        else:
            stream = dzb.shuffled_batch_stream(
                x, 256, seed=0, shuffle_buffer_size=buffer, prefetch=prefetch
            )
        _, samples, amplification = drain(stream)
    seconds = time.perf_counter() - started
    return {
        "seconds": seconds,
        "baseline": baseline,
        "peak": rss.peak,
        "amplification": amplification,
        "samples": samples,
        "peak_window_bytes": stream.summary().peak_window_bytes,
    }


def in_fresh_process(
    path: Path,
    *,
    buffer: int = 0,
    budget: int = 0,
    prefetch: int,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """:func:`one_epoch` in a child process."""
    command = [
        sys.executable, "-m", "benchmarks.suite.memory", str(path),
        "--buffer", str(buffer), "--budget", str(budget), "--prefetch", str(prefetch),
    ]  # fmt: skip
    done = subprocess.run(
        command, capture_output=True, text=True, check=True, cwd=ROOT, env=os.environ | (env or {})
    )
    epoch: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return epoch


def memory_cases(
    ds: Dataset, data_dir: Path, buffer_rows: int, budget: int, sweep: bool = True
) -> dict[str, Any]:
    """Buffered at 1x and 4x the dataset, exact with and without a fixed mmap threshold,
    and (``sweep``) the exact-shuffle budget sweep (:func:`exact_sweep`)."""
    big = make_dataset(data_dir, 4 * ds.rows, ds.cols, ds.chunk_rows)
    prefetch = dzplan.DEFAULT_PREFETCH
    window_bytes = buffer_rows * ds.row_bytes
    bound = 1.5 * (prefetch + 1) * window_bytes + 300 * MiB
    cases = {
        "one": in_fresh_process(ds.path, buffer=buffer_rows, prefetch=prefetch),
        "four": in_fresh_process(big.path, buffer=buffer_rows, prefetch=prefetch),
        "exact": in_fresh_process(ds.path, budget=budget, prefetch=0),
        "exact_mmap": in_fresh_process(ds.path, budget=budget, prefetch=0, env=MMAP_ENV),
    }
    for key, case in cases.items():
        print(
            f"  {LABELS[key]:6s} peak RSS {case['peak'] / MiB:7.0f} MiB "
            f"(baseline {case['baseline'] / MiB:.0f} MiB)"
        )
    if sweep:
        cases["exact_sweep"] = exact_sweep(data_dir)
    return cases | {
        "bound": bound,
        "window_bytes": window_bytes,
        "budget": budget,
        "prefetch": prefetch,
    }


#: the exact-shuffle memory sweep (issue 10): budgets in MiB, on a 262,144 x 64 float32 array
SWEEP_BUDGETS_MIB = (4, 16, 64, 1024)
SWEEP_SHAPE = (262_144, 64, 8192)  # rows, cols, chunk rows: a 64 MiB array of 256-byte rows
#: what peak RSS over the baseline may exceed the budget by
SWEEP_SLACK_MIB = 16


def exact_sweep(data_dir: Path) -> dict[str, Any]:
    """One exact-shuffle epoch per budget of :data:`SWEEP_BUDGETS_MIB`, each in a fresh process.

    Returns ``{"shape": ..., "cases": {"4": epoch, ...}}``, each epoch as
    :func:`one_epoch` reports it plus its ``budget`` in bytes.
    """
    ds = make_dataset(data_dir, *SWEEP_SHAPE)
    cases: dict[str, Any] = {}
    for mib in SWEEP_BUDGETS_MIB:
        case = in_fresh_process(ds.path, budget=mib * MiB, prefetch=0)
        over = (case["peak"] - case["baseline"]) / MiB
        print(
            f"  exact sweep, budget {mib:5d} MiB: RSS over baseline {over:6.1f} MiB "
            f"(<= {mib + SWEEP_SLACK_MIB} MiB?), read amplification {case['amplification']:.2f}",
            flush=True,
        )
        cases[str(mib)] = case | {"budget": mib * MiB}
    return {"shape": SWEEP_SHAPE, "cases": cases}


def run_sweep(options: argparse.Namespace) -> None:
    """The exact-shuffle sweep alone (``python -m benchmarks --only exact-sweep``)."""
    Path(options.data).mkdir(parents=True, exist_ok=True)
    exact_sweep(Path(options.data))


def main(argv: list[str] | None = None) -> None:
    """The child: one epoch of a dataset, its peak RSS printed as JSON."""
    parser = argparse.ArgumentParser(description="one epoch; print peak RSS as JSON")
    parser.add_argument("dataset", type=Path, help="a dataset made by make_dataset")
    parser.add_argument("--buffer", type=int, default=0)
    parser.add_argument("--budget", type=int, default=0)
    parser.add_argument("--prefetch", type=int, default=2)
    args = parser.parse_args(argv)
    epoch = one_epoch(args.dataset, buffer=args.buffer, budget=args.budget, prefetch=args.prefetch)
    print(json.dumps(epoch))


if __name__ == "__main__":
    main()
