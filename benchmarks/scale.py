"""Plans at scale (issue 39): first batch, ``plan_epoch`` and peak RSS per mode at 1e7-1e9 samples.

``python -m benchmarks --only scale [--rows N] [--out DIR]`` builds, for each size, an
``N x 4`` float32 Zarr array in 65,536-row chunks in a memory store with nothing
written (every chunk absent, read as the fill value: ``missing="fill"``), so what is
timed is planning and bookkeeping, not I/O.  Each measurement runs in a fresh process
(its peak RSS is its own): the first batch of the sequential, buffered (8 chunks),
exact and ``"auto"`` streams, ``plan_epoch`` of each, and numpy's permutation of the
same ``N`` (the O(N) way, the reference the targets are ratios of).  A measurement
past :data:`TIMEOUT` seconds is reported as such; numpy's permutation at a size whose
``int64`` indices would not fit thrice in the memory available is skipped.  Writes
``<out>/scale.md``.  Targets (issue 39): at 1e8, every mode's first batch and
``plan_epoch`` within 0.25x numpy's permutation; peak RSS at 1e8 at most 64 MiB above
1e7; at 1e9 every mode starts.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import psutil

from .suite import ROOT

#: the sizes measured (``--rows N``: that size only)
SIZES = (10**7, 10**8, 10**9)
MODES = ("sequential", "buffered", "exact", "auto")
CHUNK_ROWS = 65_536
BATCH = 256
#: seconds one measurement may take
TIMEOUT = 300

CHILD = r"""
import json, resource, sys, time
import numpy as np
n, mode, what = int(sys.argv[1]), sys.argv[2], sys.argv[3]
if what == "permutation":
    started = time.perf_counter()
    np.random.default_rng(0).permutation(n)
    seconds = time.perf_counter() - started
else:
    import zarr
    import daskzarr_batches as dzb
    x = zarr.create_array(zarr.storage.MemoryStore(), shape=(n, 4), chunks=(65536, 4),
                          dtype="f4", fill_value=0)
    kwargs = {"sequential": {}, "buffered": {"shuffle_buffer_size": 8 * 65536},
              "exact": {}, "auto": {"shuffle_buffer_size": "auto"}}[mode]
    started = time.perf_counter()
    if what == "plan":
        dzb.plan_epoch(x, 256, shuffle=mode != "sequential", **kwargs)
    elif mode == "sequential":
        next(iter(dzb.batch_stream(x, 256, missing="fill")))
    else:
        next(iter(dzb.shuffled_batch_stream(x, 256, seed=0, missing="fill", **kwargs)))
    seconds = time.perf_counter() - started
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"seconds": seconds, "rss": rss}), flush=True)
import os
os._exit(0)  # a stream's threads need not be joined: the measurement is done
"""


def measure(n: int, mode: str, what: str) -> dict[str, float] | str:
    """One measurement in a fresh process: ``{"seconds", "rss"}``, or why there is none."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", CHILD, str(n), mode, what],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            cwd=ROOT,
        )
    except subprocess.TimeoutExpired:
        return f"> {TIMEOUT} s"
    if done.returncode != 0:
        why = done.stderr.strip().splitlines()[-1][:60] if done.stderr.strip() else done.returncode
        return f"failed ({why})"
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def run_sizes(sizes: tuple[int, ...]) -> dict[str, dict[str, dict[str, float] | str]]:
    """Every size's measurements: ``{str(n): {"mode what": result}}``."""
    out: dict[str, dict[str, dict[str, float] | str]] = {}
    for n in sizes:
        row: dict[str, dict[str, float] | str] = {}
        if psutil.virtual_memory().available > 3 * 8 * n:
            row["numpy permutation"] = measure(n, "", "permutation")
        else:
            row["numpy permutation"] = "skipped (memory)"
        for mode in MODES:
            for what in ("first", "plan"):
                row[f"{mode} {what}"] = measure(n, mode, what)
                print(f"  {n:.0e} {mode} {what}: {row[f'{mode} {what}']}", flush=True)
        out[str(n)] = row
    return out


def _cell(result: dict[str, float] | str, reference: dict[str, float] | str) -> str:
    if isinstance(result, str):
        return result
    text = f"{result['seconds']:.2f} s"
    if isinstance(reference, dict) and reference["seconds"] > 0:
        text += f" ({result['seconds'] / reference['seconds']:.3f}x)"
    return text


def table(results: dict[str, dict[str, dict[str, float] | str]]) -> list[str]:
    """First batch, ``plan_epoch`` (seconds, x numpy's permutation) and peak RSS per mode."""
    lines = [
        "| N | mode | first batch | plan_epoch | peak RSS first / plan (MiB) |",
        "|---:|---|---:|---:|---:|",
    ]
    for n, row in results.items():
        ref = row["numpy permutation"]
        ref_text = ref if isinstance(ref, str) else f"{ref['seconds']:.2f} s"
        ref_rss = "" if isinstance(ref, str) else f"{ref['rss'] / 2**20:,.0f}"
        lines.append(f"| {int(n):.0e} | numpy permutation | {ref_text} | | {ref_rss} |")
        for mode in MODES:
            first, plan = row[f"{mode} first"], row[f"{mode} plan"]
            rss = " / ".join(
                "-" if isinstance(r, str) else f"{r['rss'] / 2**20:,.0f}" for r in (first, plan)
            )
            lines.append(
                f"| {int(n):.0e} | {mode} | {_cell(first, ref)} | {_cell(plan, ref)} | {rss} |"
            )
    return lines


def run(options: argparse.Namespace) -> None:
    """``python -m benchmarks --only scale``: measure, print and write ``scale.md``."""
    sizes = (int(options.rows),) if getattr(options, "rows", None) else SIZES
    print(f"scale: N x 4 float32, chunks of {CHUNK_ROWS}, nothing written, batch {BATCH}")
    results = run_sizes(sizes)
    lines = table(results)
    print("\n".join(lines))
    out = Path(getattr(options, "out", None) or ROOT / "benchmarks" / "results")
    out.mkdir(parents=True, exist_ok=True)
    (out / "scale.md").write_text("\n".join(lines) + "\n")
    (out / "scale.json").write_text(json.dumps(results, indent=1) + "\n")
