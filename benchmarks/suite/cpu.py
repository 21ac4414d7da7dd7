"""CPU per GB near the decode limit, and steady (issue 20).

``python -m benchmarks --only cpu [--rounds 8]`` (and the suite, as one of its steps)
measures, on a 400,000 x 64 float32 array in 8,192-row chunks (zstd, a local
directory store), in one set of interleaved rounds:

- the **raw-decode floor**: every stored chunk's bytes, read before the clock starts,
  decoded by the array's own codec (numcodecs) on one thread (``cases.RawFloor``);
- **L0**: zarr reading the chunks one at a time on one thread (zarr's pipeline);
- the sequential stream, the buffered shuffle (8 chunks) and ``chunk_stream``, each
  over ``open_array(..., codec_pipeline=...)`` with zarrs' pipeline and with zarr's.

Every case's CPU is this process's (``time.process_time``: all threads, Rust and C
ones included), timed around the same region as its wall clock; the table gives
the medians of the rounds as cpu-s/GB and as multiples of the floor's, and the
spread of the wall times (min / median / max, and slowest over fastest).

Then, in a child process started pinned to one core (``os.sched_setaffinity`` before
it execs, so every thread it makes inherits the one core), L0 and the sequential
stream on zarr's pipeline in interleaved rounds: the stream's median throughput over
L0's there says what it delivers when nothing runs beside it but the one core.

The targets are ``CPU_TARGETS`` in ``suite/targets.py``; ``run`` writes
``<out>/cpu.md`` and ``cpu.json``.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import daskzarr_batches as dzb

from ..internals import zarr_behind
from .cases import START_ROWS, RawFloor, l0, raw_decoder
from .dataset import Dataset, make_dataset
from .measure import L0, MB, Case, Measured, Result, drain, rounds

#: rounds of ``--only cpu`` (the issue's targets are on the medians of 8)
ROUNDS = 8
#: the codec pipelines each stream kind is measured with
PIPELINES = ("zarrs", "zarr")
#: the stream kinds (the second part of a case name)
SEQUENTIAL = "sequential, batch 256"
BUFFERED = "buffered shuffle (8 chunks), batch 256"
CHUNKS = "chunk_stream"
KINDS = (SEQUENTIAL, BUFFERED, CHUNKS)
#: case names of the references
FLOOR = "[cpu] raw-decode floor: chunk bytes read beforehand, decode only, 1 thread"
CPU_L0 = f"[cpu] {L0}"
#: the pinned child's cases
PINNED_L0 = f"[pinned to 1 core] {L0}"
PINNED_SEQUENTIAL = f"[pinned to 1 core] {SEQUENTIAL} (zarr's pipeline)"
#: the key of ``skipped`` that says why these cases did not run
SKIP_KEY = "cpu"


def name(pipeline: str, kind: str) -> str:
    """A case's name, e.g. ``[cpu, zarrs] sequential, batch 256``."""
    return f"[cpu, {pipeline}] {kind}"


def pipeline_label(pipeline: str) -> str:
    return "zarrs" if pipeline == "zarrs" else "zarr's pipeline"


def stream_cases(path: Path, chunk_rows: int, pipelines: tuple[str, ...]) -> list[Case]:
    """Each kind over ``open_array(..., codec_pipeline=p)`` for each pipeline."""
    out: list[Case] = []
    buffer = 8 * chunk_rows
    for pipeline in pipelines:
        x = dzb.open_array(path / "features", codec_pipeline=pipeline)
        runs: dict[str, Callable[[], Measured]] = {
            SEQUENTIAL: lambda x=x: drain(dzb.batch_stream(x, 256)),
            BUFFERED: lambda x=x: drain(
                dzb.shuffled_batch_stream(x, 256, seed=0, shuffle_buffer_size=buffer)
            ),
            CHUNKS: lambda x=x: drain(dzb.chunk_stream(x)),
        }
        out += [Case(name(pipeline, kind), "this", runs[kind]) for kind in KINDS]
    return out


def measure(ds: Dataset, repeats: int, skipped: dict[str, str]) -> dict[str, Result]:
    """The floor, L0 and every kind with each installed pipeline; then the pinned child."""
    x = ds.features
    if raw_decoder(x) is None:
        skipped[SKIP_KEY] = "codec pipeline is not bytes + one compressor (no floor)"
        return {}
    pipelines = PIPELINES
    try:
        import zarrs  # noqa: F401
    except ImportError as exc:
        skipped["zarrs"] = f"not installed ({exc}); pip install .[bench]"
        pipelines = ("zarr",)
    zarr_x = zarr_behind(dzb.open_array(ds.path / "features", codec_pipeline="zarr"))
    cases = [
        RawFloor(x, ds.path / "features").case(FLOOR),
        Case(CPU_L0, "reference", lambda: l0(zarr_x)),
        *stream_cases(ds.path, ds.chunk_rows, pipelines),
    ]
    for case in cases:  # imports, pools, page cache
        if case.setup is not None:
            case.setup()
        case.run()
    print(f"CPU per GB (issue 20): {ds.path.name}, {repeats} interleaved rounds")
    results = rounds(cases, repeats)
    results |= pinned(ds, repeats)
    return results


def pinned(ds: Dataset, repeats: int) -> dict[str, Result]:
    """L0 and the sequential stream (zarr's pipeline) in a child pinned to one core."""
    core = min(os.sched_getaffinity(0))
    command = [sys.executable, "-m", "benchmarks.suite.cpu", str(ds.path), str(repeats)]
    print(f"pinned to core {core} (a child process, every thread on it), {repeats} rounds")
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        check=False,
        preexec_fn=lambda: os.sched_setaffinity(0, {core}),
        cwd=Path(__file__).resolve().parents[2],
    )
    if done.returncode != 0:
        raise RuntimeError(f"the pinned child failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    print(done.stdout.rstrip().rpartition("\n")[0], flush=True)
    record = json.loads(done.stdout.strip().splitlines()[-1])
    results = {}
    for case, values in record["cases"].items():
        best = values["seconds"].index(min(values["seconds"]))  # the round kept, as rounds()
        result = Result(case, values["group"], values["seconds"][best], values["bytes"],
                        values["samples"], cpu=values["cpu"][best])  # fmt: skip
        result.extra |= {"seconds": values["seconds"], "cpu": values["cpu"], "core": core}
        results[case] = result
    return results


def child(path: str, repeats: int) -> None:
    """The pinned child: its rounds, then one JSON line (what :func:`pinned` reads)."""
    ds_path = Path(path)
    x = dzb.open_array(ds_path / "features", codec_pipeline="zarr")
    zarr_x = zarr_behind(x)
    cases = [
        Case(PINNED_L0, "reference", lambda: l0(zarr_x)),
        Case(PINNED_SEQUENTIAL, "this", lambda: drain(dzb.batch_stream(x, 256))),
    ]
    for case in cases:
        case.run()
    results = rounds(cases, repeats)
    record = {
        "affinity": sorted(os.sched_getaffinity(0)),
        "cases": {
            r.name: {
                "group": r.group,
                "bytes": r.bytes,
                "samples": r.samples,
                "seconds": r.extra["seconds"],
                "cpu": r.extra["cpu"],
            }
            for r in results.values()
        },
    }
    print(json.dumps(record), flush=True)


# --------------------------------------------------------------------------
# Figures and the table


def median_seconds(result: Result) -> float:
    return float(statistics.median(result.extra.get("seconds") or [result.seconds]))


def slowest_over_fastest(result: Result) -> float:
    low, _, high = result.spread
    return high / low


def pinned_vs_l0(results: dict[str, Result]) -> float:
    """Median throughput of the pinned sequential stream over pinned L0's."""
    seq, ref = results[PINNED_SEQUENTIAL], results[PINNED_L0]
    return (seq.bytes / median_seconds(seq)) / (ref.bytes / median_seconds(ref))


def table(results: dict[str, Result]) -> list[str]:
    """One row per case: median MB/s, median cpu-s/GB and over the floor, wall spread."""
    order = [FLOOR, CPU_L0, *(name(p, k) for k in KINDS for p in PIPELINES)]
    order += [PINNED_L0, PINNED_SEQUENTIAL]
    lines = [
        "| case | MB/s (median) | cpu-s/GB (median) | x floor | wall s min / med / max "
        "| slowest / fastest |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    floor = results[FLOOR].cpu_s_gb if FLOOR in results else float("nan")
    for case in order:
        if case not in results:
            continue
        r = results[case]
        low, median, high = r.spread
        lines.append(
            f"| {case} | {r.bytes / median / MB:,.0f} | {r.cpu_s_gb:.2f} | "
            f"{r.cpu_s_gb / floor:.2f}x | {low:.3f} / {median:.3f} / {high:.3f} | "
            f"{high / low:.2f}x |"
        )
    if PINNED_L0 in results and PINNED_SEQUENTIAL in results:
        core = results[PINNED_L0].extra.get("core")
        lines += [
            "",
            f"Pinned to core {core}: the sequential stream (zarr's pipeline) at "
            f"{pinned_vs_l0(results):.2f}x L0 (medians).",
        ]
    return lines


def section(results: dict[str, Result]) -> list[str]:
    """The report's section (empty when not measured)."""
    if FLOOR not in results:
        return []
    return [
        "## CPU per GB (issue 20)",
        "",
        "CPU seconds of this process (all threads) per GB delivered, medians of the rounds, "
        "and as multiples of the raw-decode floor's (the stored chunks decoded by numcodecs "
        "on one thread, their bytes read beforehand); the wall times' spread over the rounds. "
        "The pinned cases ran in a child process bound to one core.",
        "",
        *table(results),
    ]


def payload(results: dict[str, Result]) -> dict[str, Any]:
    return {
        r.name: {
            "bytes": r.bytes,
            "seconds": r.extra.get("seconds"),
            "cpu": r.extra.get("cpu"),
            "cpu_s_gb": r.cpu_s_gb,
        }
        for r in results.values()
    }


def dataset(data_dir: Path, rows: int | None, cols: int | None, chunk_rows: int | None) -> Dataset:
    """The issue's array: 400,000 x 64 float32 in 8,192-row chunks (or the options')."""
    return make_dataset(data_dir, rows or START_ROWS, cols or 64, chunk_rows or 8192)


if __name__ == "__main__":
    child(sys.argv[1], int(sys.argv[2]))
