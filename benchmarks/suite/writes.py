"""Per-chunk jobs that write (issue 19): ``map_to_zarr`` against dask, a resume, a shuffled copy.

``python -m benchmarks --only writes [--rows N] [--rounds N]`` writes one array of
``rows`` x 64 float32 in 8192-row chunks (zstd, a local directory) and measures, in
interleaved rounds (medians):

- ``map_to_zarr`` with a normalising ``func`` (``(x - mean) / std`` per feature, the
  moments computed once beforehand) against ``da.from_zarr(x).map_blocks(f).to_zarr(out)``
  on the same data, chunks and codec, both on local threads;
- a resume after the job was interrupted at half: a complete output whose second half's
  chunk objects are deleted (the state a job killed after writing half its chunks leaves:
  the objects present are complete, a truncated one would be found and redone as well),
  then ``map_to_zarr`` again; its time over a full run's;
- ``write_shuffled`` at a quarter-dataset budget against one epoch of the exact shuffle
  (``shuffled_batch_stream(..., memory_budget=same)``, batch 256) streamed and dropped;
- ``map_to_zarr(..., client=client)`` against ``x.map_blocks(f).to_zarr(out)`` computed
  by the same client, on one ``LocalCluster`` of ``WORKERS`` process workers x 1 thread
  (127.0.0.1), started once before the rounds (``--no-cluster`` leaves these out).

``suite/run.py`` (``run_writes``) writes ``<out>/writes.md`` and ``writes.json``; the
targets are ``WRITE_TARGETS`` of ``suite/targets.py``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import numpy as np
import zarr

import daskzarr_batches as dzb

from .measure import Case, Result, drain, rounds

ROWS = 400_000
COLS = 64
CHUNK_ROWS = 8192
BATCH = 256
ROUNDS = 3
WORKERS = 2
ROOT = Path(__file__).resolve().parents[2]

MAP = "map_to_zarr, normalising func"
DASK = "x.map_blocks(f).to_zarr(out) (dask)"
RESUME = "map_to_zarr resumed after an interruption at half"
SHUFFLED = "write_shuffled, quarter-dataset budget"
EXACT = "exact shuffle streamed once, same budget"
CLUSTER_MAP = f"map_to_zarr on a LocalCluster ({WORKERS} process workers)"
CLUSTER_DASK = "x.map_blocks(f).to_zarr(out) on the same LocalCluster (dask)"
KINDS = (MAP, DASK, RESUME, SHUFFLED, EXACT, CLUSTER_MAP, CLUSTER_DASK)


class Normalise:
    """``(x - mean) / std`` per feature, float32 (picklable)."""

    def __init__(self, moments: Any) -> None:
        self.mean = moments.mean.astype(np.float32)
        self.scale = (1.0 / moments.std()).astype(np.float32)

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        return (rows - self.mean) * self.scale


def make_input(data_dir: Path, rows: int) -> Path:
    path = data_dir / f"writes_{rows}x{COLS}_r{CHUNK_ROWS}.zarr"
    done = path / "complete"
    if done.exists():
        return path
    x = zarr.create_array(path, shape=(rows, COLS), chunks=(CHUNK_ROWS, COLS), dtype="f4",
                          overwrite=True)  # fmt: skip
    rng = np.random.default_rng(0)
    for lo in range(0, rows, 16 * CHUNK_ROWS):
        hi = min(rows, lo + 16 * CHUNK_ROWS)
        x[lo:hi] = rng.standard_normal((hi - lo, COLS), dtype=np.float32) * 3 + 1
    done.write_text("ok")
    return path


@contextlib.contextmanager
def local_cluster(workers: int) -> Iterator[Any]:
    """A client of a LocalCluster of ``workers`` process workers x 1 thread on 127.0.0.1.

    The workers import ``benchmarks`` (they unpickle ``Normalise``): the repository root
    is put on their ``PYTHONPATH``.
    """
    from distributed import Client, LocalCluster

    extra = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *([extra] if extra else [])])
    try:
        with (
            LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                         host="127.0.0.1", dashboard_address=":0") as cluster,
            Client(cluster, set_as_default=False) as client,
        ):  # fmt: skip
            yield client
    finally:
        if extra is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = extra


def _fresh(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    return path


def measure(data_dir: Path, rows: int, repeats: int, cluster: bool = True) -> dict[str, Result]:
    """Every case, in one set of interleaved rounds (the cluster's cases with ``cluster``)."""
    with contextlib.ExitStack() as stack:
        client = stack.enter_context(local_cluster(WORKERS)) if cluster else None
        return _measure(data_dir, rows, repeats, client)


def _measure(data_dir: Path, rows: int, repeats: int, client: Any) -> dict[str, Result]:
    source = make_input(data_dir, rows)
    x = zarr.open_array(source, mode="r")
    func = Normalise(dzb.feature_moments(x))
    nbytes = rows * COLS * 4
    work = data_dir / "writes_out"
    work.mkdir(exist_ok=True)
    budget = nbytes // 4

    def run_map() -> tuple[int, int, float]:
        dzb.map_to_zarr(func, x, _fresh(work / "map.zarr"), job_id="normalise")
        return nbytes, rows, 1.0

    def run_dask() -> tuple[int, int, float]:
        da.from_zarr(x).map_blocks(func, dtype=np.float32).to_zarr(
            str(_fresh(work / "dask.zarr")), overwrite=True
        )
        return nbytes, rows, 1.0

    def run_resume() -> tuple[int, int, float]:
        # untimed set-up is not possible inside a round: time the resume alone
        out = _fresh(work / "resume.zarr")
        dzb.map_to_zarr(func, x, out, job_id="normalise")
        chunks = -(-rows // CHUNK_ROWS)
        for i in range(chunks // 2, chunks):
            (out / "c" / str(i) / "0").unlink()
        stats = dzb.WriteStats()
        started = time.perf_counter()
        dzb.map_to_zarr(func, x, out, job_id="normalise", stats=stats)
        resumed = time.perf_counter() - started
        assert stats.units_written == chunks - chunks // 2, stats
        seconds_of_resume.append(resumed)
        return nbytes, rows, 1.0

    def run_shuffled() -> tuple[int, int, float]:
        dzb.write_shuffled(x, _fresh(work / "shuffled.zarr"), seed=0, memory_budget=budget)
        return nbytes, rows, 1.0

    def run_exact() -> tuple[int, int, float]:
        return drain(dzb.shuffled_batch_stream(x, BATCH, seed=0, memory_budget=budget))

    def run_cluster_map() -> tuple[int, int, float]:
        dzb.map_to_zarr(func, x, str(_fresh(work / "cmap.zarr")), job_id="normalise",
                        client=client)  # fmt: skip
        return nbytes, rows, 1.0

    def run_cluster_dask() -> tuple[int, int, float]:
        stored = (
            da.from_zarr(x)
            .map_blocks(func, dtype=np.float32)
            .to_zarr(str(_fresh(work / "cdask.zarr")), overwrite=True, compute=False)
        )
        dask.compute(stored, scheduler=client)
        return nbytes, rows, 1.0

    seconds_of_resume: list[float] = []
    run_map()  # imports, pools, page cache
    if client is not None:
        run_cluster_map()  # the workers' imports
        run_cluster_dask()
    print(f"writes: {rows} x {COLS} float32 in {CHUNK_ROWS}-row chunks, {repeats} rounds")
    cases = [
        Case(MAP, "this", run_map),
        Case(DASK, "dask", run_dask),
        Case(RESUME, "this", run_resume),
        Case(SHUFFLED, "this", run_shuffled),
        Case(EXACT, "this", run_exact),
    ]
    if client is not None:
        cases += [Case(CLUSTER_MAP, "cluster", run_cluster_map),
                  Case(CLUSTER_DASK, "dask", run_cluster_dask)]  # fmt: skip
    results = rounds(cases, repeats)
    results[RESUME].extra["resume_seconds"] = seconds_of_resume
    shutil.rmtree(work, ignore_errors=True)
    return results


def median_seconds(result: Result) -> float:
    return float(np.median(result.extra["seconds"]))


def resume_share(results: dict[str, Result]) -> float:
    """The resume's time (median) over a full ``map_to_zarr`` run's (median)."""
    resumed = float(np.median(results[RESUME].extra["resume_seconds"]))
    return resumed / median_seconds(results[MAP])


def table(results: dict[str, Result]) -> list[str]:
    lines = ["| case | seconds (median) | MB/s |", "|---|---:|---:|"]
    for kind in KINDS:
        result = results.get(kind)
        if result is None:
            continue
        seconds = median_seconds(result)
        if kind == RESUME:
            seconds = float(np.median(result.extra["resume_seconds"]))
            lines.append(f"| {kind} (the second run alone) | {seconds:.2f} | |")
            continue
        lines.append(f"| {kind} | {seconds:.2f} | {result.bytes / seconds / 1e6:,.0f} |")
    return lines
