"""Measure sequential window size x prefetch, to choose the stream defaults.

Run from the repository root after ``benchmarks/run.py`` made the dataset::

    python benchmarks/defaults.py [--rows 1000000 --cols 64 --chunk-rows 8192]

Every combination and L0 run in interleaved rounds (best kept); the table goes to
``benchmarks/results/defaults.md`` as ratios against L0 measured in the same run.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

import zarr

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import daskzarr_batches as dzb  # noqa: E402
from benchmarks.suite.cases import l0  # noqa: E402
from benchmarks.suite.dataset import make_dataset  # noqa: E402
from benchmarks.suite.measure import Case, Measured, drain, rounds  # noqa: E402

WINDOW_MIB = (8, 16, 32, 64, 128)
PREFETCH = (0, 1, 2, 4)


def sequential(x: zarr.Array, window_bytes: int, prefetch: int) -> Measured:
    return drain(dzb.batch_stream(x, 256, window_bytes=window_bytes, prefetch=prefetch))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--cols", type=int, default=64)
    parser.add_argument("--chunk-rows", type=int, default=8192)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = parser.parse_args()
    ds = make_dataset(ROOT / "benchmarks" / "data", args.rows, args.cols, args.chunk_rows)
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
        f"`python benchmarks/defaults.py` on {ds.rows:,} x {ds.cols} float32, "
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


if __name__ == "__main__":
    main()
