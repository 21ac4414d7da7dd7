"""This checkout's library against an earlier commit's, side by side in one process.

A refactor is done when speed is unchanged; on a noisy shared machine that can
only be seen when both versions run in the same process, interleaved::

    python -m benchmarks compare 8b4206b              # 5 rounds, the suite's dataset
    python -m benchmarks compare HEAD~3 --rounds 9 --rows 250000
    python -m benchmarks compare 8b4206b --cluster    # the streams on a LocalCluster
    python -m benchmarks compare main --first-batch   # + time to first batch vs one chunk read

(``compare REF`` is ``--only compare --old REF``.)  The earlier commit's
``daskzarr_batches/`` is extracted with ``git archive`` into a temporary directory
under another package name (the package imports itself relatively, so it runs as
is) and imported from there by its file location; a cluster's workers get it as a
zip (``Client.upload_file``).  Each round runs every case with both versions,
alternating which goes first.  It prints, per case, the best and
median throughput of each version as a ratio to the round's best L0 (zarr,
chunk-aligned, one thread) and the new/old ratio of the medians.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

import daskzarr_batches as current

from .suite import ROOT
from .suite.cases import transfer_only
from .suite.dataset import Dataset, default_shape, make_dataset
from .suite.measure import consume as drain
from .suite.measure import timed as timed_cpu

BASELINE = "dzb_baseline"
#: default of ``--rounds``
ROUNDS = 5


def load_baseline(ref: str, into: Path) -> ModuleType:
    """The package as of ``ref``, extracted under ``into`` and imported as :data:`BASELINE`.

    Imported from its file location (``sys.path`` is left alone); one baseline per
    process: a second call returns the first one.
    """
    if BASELINE in sys.modules:
        return sys.modules[BASELINE]
    archive = subprocess.run(
        ["git", "archive", "--format=tar", ref, "daskzarr_batches"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    package = into / BASELINE
    (into / "daskzarr_batches").rename(package)
    spec = importlib.util.spec_from_file_location(
        BASELINE, package / "__init__.py", submodule_search_locations=[str(package)]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[BASELINE] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[BASELINE]
        raise
    return module


def ship_baseline(client: Any, baseline: ModuleType, into: Path) -> None:
    """Make :data:`BASELINE` importable on the workers of ``client`` (a zip, uploaded)."""
    package = Path(baseline.__file__ or "").parent
    archive = shutil.make_archive(str(into / BASELINE), "zip", package.parent, package.name)
    client.upload_file(archive)


def cases(dzb: ModuleType, data: Dataset, client: Any = None) -> dict[str, Callable[[], None]]:
    """The library's main cases, as the benchmark suite runs them."""
    x, y = data.features, data.labels
    buffer = 8 * data.chunk_rows
    budget = data.feature_bytes // 4
    if client is not None:
        return {
            "LocalCluster: sequential, batch 256": lambda: drain(
                dzb.batch_stream(x, 256, client=client)
            ),
            "LocalCluster: buffered (8 chunks)": lambda: drain(
                dzb.shuffled_batch_stream(x, 256, seed=0, shuffle_buffer_size=buffer, client=client)
            ),
        }
    return {
        "sequential, batch 256": lambda: drain(dzb.batch_stream(x, 256)),
        "sequential, batch 32": lambda: drain(dzb.batch_stream(x, 32)),
        "buffered (8 chunks), batch 256": lambda: drain(
            dzb.shuffled_batch_stream(x, 256, seed=0, shuffle_buffer_size=buffer)
        ),
        "buffered (8 chunks), batch 32": lambda: drain(
            dzb.shuffled_batch_stream(x, 32, seed=0, shuffle_buffer_size=buffer)
        ),
        "exact, budget 1/4, prefetch 0": lambda: drain(
            dzb.shuffled_batch_stream(x, 256, seed=0, memory_budget=budget)
        ),
        "paired, sequential": lambda: drain(dzb.paired_batch_stream(x, y, 256)),
        "paired, buffered (8 chunks)": lambda: drain(
            dzb.paired_shuffled_batch_stream(x, y, 256, seed=0, shuffle_buffer_size=buffer)
        ),
    }


def timed(function: Callable[[], None]) -> float:
    """Wall seconds of one call."""
    return timed_cpu(function)[0]


def compare(baseline: ModuleType, data: Dataset, rounds: int, client: Any = None) -> str:
    x = data.features

    def l0() -> None:
        for lo in range(0, data.rows, data.chunk_rows):
            np.asarray(x[lo : lo + data.chunk_rows])

    old, new = cases(baseline, data, client), cases(current, data, client)
    l0_seconds: list[float] = []
    ceiling: list[float] = []  # transfer only (on a cluster): its ceiling, in the same rounds
    relayed: list[float] = []  # the same through the scheduler (the ceiling before issue 40)
    seconds: dict[tuple[str, str], list[float]] = {}
    for round_number in range(rounds):
        l0_seconds.append(timed(l0))
        if client is not None:
            ceiling.append(timed(lambda: transfer_only(client, data.feature_bytes)))
            relayed.append(timed(lambda: transfer_only(client, data.feature_bytes, False)))
        for name in old:
            pair = [("old", old[name]), ("new", new[name])]
            for who, function in pair[:: -1 if round_number % 2 else 1]:
                seconds.setdefault((name, who), []).append(timed(function))
    best_l0 = min(l0_seconds)
    lines = [
        f"L0 {data.feature_bytes / best_l0 / 1e6:.0f} MB/s (best of {rounds}); "
        "throughput as ratios to it",
        "",
        "| case | old best | new best | old median | new median | new/old (medians) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name in old:
        o, n = seconds[(name, "old")], seconds[(name, "new")]
        lines.append(
            f"| {name} | {best_l0 / min(o):.3f}x | {best_l0 / min(n):.3f}x "
            f"| {best_l0 / statistics.median(o):.3f}x | {best_l0 / statistics.median(n):.3f}x "
            f"| {statistics.median(o) / statistics.median(n):.2f} |"
        )
    for times, how in ((ceiling, "as the streams fetch"), (relayed, "through the scheduler")):
        if times:
            lines += ceiling_table(times, how, seconds, list(old), data.feature_bytes)
    return "\n".join(lines)


def ceiling_table(
    times: list[float],
    how: str,
    seconds: dict[tuple[str, str], list[float]],
    names: list[str],
    nbytes: int,
) -> list[str]:
    """Lines of the table of each case's ratio to a transfer-only ceiling (``times``)."""
    best, median = min(times), statistics.median(times)
    lines = [
        "",
        f"transfer only (64 MiB results worker -> client, {how}, no read): "
        f"{nbytes / best / 1e6:.0f} MB/s best, {nbytes / median / 1e6:.0f} MB/s median; "
        "ratios to it (per round: to the ceiling of the same round, the median of the rounds):",
        "",
        "| case | old best | new best | old median | new median | old per round | new per round |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name in names:
        o, n = seconds[(name, "old")], seconds[(name, "new")]
        old_round = statistics.median(c / t for c, t in zip(times, o, strict=True))
        new_round = statistics.median(c / t for c, t in zip(times, n, strict=True))
        lines.append(
            f"| {name} | {best / min(o):.3f}x | {best / min(n):.3f}x "
            f"| {median / statistics.median(o):.3f}x | {median / statistics.median(n):.3f}x "
            f"| {old_round:.3f}x | {new_round:.3f}x |"
        )
    return lines


def first_batch(dzb: ModuleType, data: Dataset) -> dict[str, Callable[[], Any]]:
    """Streams whose first batch is timed (constructor call to first batch)."""
    x, y = data.features, data.labels
    buffer = 8 * data.chunk_rows
    return {
        "sequential, batch 256": lambda: dzb.batch_stream(x, 256),
        "buffered (8 chunks), batch 256": lambda: dzb.shuffled_batch_stream(
            x, 256, seed=0, shuffle_buffer_size=buffer
        ),
        "paired, buffered (8 chunks)": lambda: dzb.paired_shuffled_batch_stream(
            x, y, 256, seed=0, shuffle_buffer_size=buffer
        ),
    }


def first_batch_seconds(make: Callable[[], Any]) -> float:
    started = time.perf_counter()
    stream = make()
    with stream:
        next(stream)
        return time.perf_counter() - started


def compare_first_batch(baseline: ModuleType, data: Dataset, rounds: int) -> str:
    """Median time to the first batch of each version, in chunk reads measured beside it."""
    x = data.features

    def one_chunk() -> None:
        np.asarray(x[: data.chunk_rows])

    old, new = first_batch(baseline, data), first_batch(current, data)
    chunk: list[float] = []
    seconds: dict[tuple[str, str], list[float]] = {}
    for round_number in range(rounds):
        chunk.append(timed(one_chunk))
        for name in old:
            pair = [("old", old[name]), ("new", new[name])]
            for who, make in pair[:: -1 if round_number % 2 else 1]:
                seconds.setdefault((name, who), []).append(first_batch_seconds(make))
    read = statistics.median(chunk)
    lines = [
        f"one chunk read {read * 1e3:.1f} ms (median of {rounds}); time to first batch, "
        "median ms (in chunk reads)",
        "",
        "| case | old | new | new/old |",
        "|---|---:|---:|---:|",
    ]
    for name in old:
        o, n = statistics.median(seconds[(name, "old")]), statistics.median(seconds[(name, "new")])
        lines.append(
            f"| {name} | {o * 1e3:.1f} ms ({o / read:.1f}) | {n * 1e3:.1f} ms ({n / read:.1f}) "
            f"| {n / o:.2f} |"
        )
    return "\n".join(lines)


def run(options: argparse.Namespace) -> None:
    """Print the old/new tables (``--cluster``: on a LocalCluster; ``--first-batch``: too)."""
    rows, cols, chunk_rows = default_shape(quick=False)
    rounds = options.rounds or ROUNDS
    Path(options.data).mkdir(parents=True, exist_ok=True)
    data = make_dataset(Path(options.data), options.rows or rows, cols, chunk_rows)
    with tempfile.TemporaryDirectory() as tmp:
        baseline = load_baseline(options.old, Path(tmp))
        print(f"old: {options.old} ({baseline.__file__}); new: this checkout ({current.__file__})")
        if not options.cluster:
            print(compare(baseline, data, rounds))
            if options.first_batch:
                print()
                print(compare_first_batch(baseline, data, 3 * rounds))
            return
        import distributed

        with (
            distributed.LocalCluster(
                n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
            ) as cluster,
            distributed.Client(cluster) as client,
        ):
            ship_baseline(client, baseline, Path(tmp))
            print(compare(baseline, data, rounds, client))
