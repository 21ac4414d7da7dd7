"""Where a stream's CPU goes (issue 20): yappi's CPU clock over epochs, sorted into kinds of work.

``python -m benchmarks --only cpu-profile [--rows N] [--rounds EPOCHS]`` profiles the
sequential stream and the buffered shuffle (8 chunks), batch 256, over the 400,000 x 64
float32 array in 8,192-row chunks (zstd, local directory store), each with zarrs'
pipeline and with zarr's, each case in a fresh child process:

1. the child opens the array (``open_array(..., codec_pipeline=...)``) and runs one
   epoch (imports, pools, page cache);
2. ``EPOCHS`` epochs (``--rounds``, default 10) unprofiled: the process's CPU seconds;
3. the same epochs under yappi (``set_clock_type("cpu")``: each thread's own CPU
   clock, so a blocked or runnable-but-waiting thread costs nothing; builtins and
   every thread profiled): each function's own CPU (``tsub``) goes to the first kind
   of :data:`KINDS` that names it, and the process CPU that no profiled function
   spent is its own row: zarrs' Rust, in its own threads (sequential windows) or
   called through ``asyncio.to_thread`` (a PyO3 method yappi does not see), which
   decodes; with zarr's pipeline that row is under 0.05 cpu-s/GB.

yappi's hooks cost CPU on every Python call, so the profiled epochs take more than the
unprofiled ones (both are printed); the native work (decoding, copies, reads) is timed
right, the Python per call is inflated.  The shares are of the profiled CPU.

py-spy was tried first (``--native``, raw stacks): on this shared 2-core machine (load
5-6) it counts a thread that is runnable but waiting for a core as active, and with
libc unsymbolised it misses blocked threads, so its samples came to 0.56-1.63x the
measured CPU; a CPU clock per thread does not have that problem.

Then :func:`direct_costs` times single operations of an epoch alone on one thread.
Writes ``--out/cpu-profile.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import daskzarr_batches as dzb

from .suite.cases import START_ROWS
from .suite.dataset import make_dataset
from .suite.measure import consume

#: epochs profiled per case (``--rounds``)
EPOCHS = 10
PIPELINES = ("zarrs", "zarr")
STREAMS = ("sequential", "buffered")

#: (kind, pattern): a function goes to the first kind whose pattern matches
#: ``module:name`` (its file or builtin module, then its qualified name)
KINDS: tuple[tuple[str, str], ...] = (
    ("decode: zstd via numcodecs (zarr's `as_numpy_array_wrapper`)",
     r"zarr/core/buffer/cpu\.py:as_numpy_array_wrapper$|numcodecs"),
    ("file reads (open, read)", r"'read' of '_io|^io:open$|pathlib\.py:Path\.read_bytes"),
    ("copy in zarr: each decoded chunk into the window (`NDBuffer.__setitem__`)",
     r"zarr/core/buffer/cpu\.py:NDBuffer\.__setitem__$"),
    ("sample ids: `np.asarray(range)` per window (`BatchStream._take`)", r"^numpy:asarray$"),
    ("copies in this library: batches (`_rows`: `.copy()`, `np.take`), pieces placed",
     r"'copy' of 'numpy\.ndarray'|'take' of 'numpy\.ndarray'|_Placer\.piece|put_rows|"
     r"join_rows|_aligned|concatenate"),
    ("epoch plan and shuffle quality (plan/)", r"daskzarr_batches/plan/(epoch|windows|quality)"),
    ("dask: graphs, local scheduler", r"(^|/)(dask|distributed|toolz|tlz)/"),
    ("zarr's pipeline and asyncio's event loop (Python)",
     r"(^|/)zarr/|(^|/)zarrs/|asyncio/|_contextvars|selectors\.py|'send' of '_socket"),
    ("threads, locks, queues, futures", r"threading\.py|queue|concurrent/|_thread\.|lock"),
    ("this library's Python per batch and window", r"daskzarr_batches/"),
)  # fmt: skip
OTHER = "other (builtins, numpy's Python, the benchmark loop)"
RUST = "outside every profiled Python function (zarrs' Rust: decode, its copies)"


def kind_of(function: str) -> str:
    for kind, pattern in KINDS:
        if re.search(pattern, function):
            return kind
    return OTHER


def profile(path: Path, pipeline: str, stream: str, epochs: int) -> dict[str, Any]:
    """One case in a fresh child; its record (what :func:`child` prints)."""
    command = [sys.executable, "-m", "benchmarks.profile_cpu", str(path), pipeline, stream,
               str(epochs)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:  # the child's own error, not only its exit status
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr}")
    record: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return record


def child(path: str, pipeline: str, stream: str, epochs: int) -> None:
    """A warm epoch, ``epochs`` plain, ``epochs`` under yappi; one JSON line."""
    import yappi

    x = dzb.open_array(Path(path) / "features", codec_pipeline=pipeline)
    chunk_rows = int(x.chunksize[0])

    def epoch() -> None:
        if stream == "sequential":
            consume(dzb.batch_stream(x, 256))
        else:
            consume(dzb.shuffled_batch_stream(x, 256, seed=0, shuffle_buffer_size=8 * chunk_rows))

    epoch()
    cpu = time.process_time()
    for _ in range(epochs):
        epoch()
    plain = time.process_time() - cpu
    yappi.set_clock_type("cpu")
    yappi.start(builtins=True, profile_threads=True)
    cpu = time.process_time()
    for _ in range(epochs):
        epoch()
    profiled = time.process_time() - cpu
    yappi.stop()
    in_threads = sum(thread.ttot for thread in yappi.get_thread_stats())
    functions: dict[str, float] = {}
    for stat in yappi.get_func_stats():
        module = re.sub(r".*(site-packages|python3\.\d+|m20)/", "", stat.module)
        name = f"{module}:{stat.name}"
        functions[name] = functions.get(name, 0.0) + stat.tsub
    nbytes = epochs * int(x.nbytes)
    record = {"plain": plain, "profiled": profiled, "in_threads": in_threads, "bytes": nbytes,
              "functions": functions}  # fmt: skip
    print(json.dumps(record), flush=True)


def shares(record: dict[str, Any]) -> dict[str, float]:
    """CPU seconds per kind of the profiled epochs, and what no Python thread spent."""
    kinds: dict[str, float] = {}
    for function, seconds in record["functions"].items():
        kind = kind_of(function)
        kinds[kind] = kinds.get(kind, 0.0) + seconds
    kinds[RUST] = max(0.0, record["profiled"] - sum(record["functions"].values()))
    return kinds


def report(cases: dict[str, dict[str, Any]], top: int = 8) -> str:
    """The kinds' shares of each case's profiled CPU (a table), then its top functions."""
    every = [kind for kind, _ in KINDS] + [OTHER, RUST]
    names = list(cases)

    def gb(c: dict[str, Any]) -> float:
        return float(c["bytes"]) / 1e9

    lines = [
        "| | " + " | ".join(names) + " |",
        "|---|" + "---:|" * len(names),
        "| cpu-s/GB, unprofiled epochs | "
        + " | ".join(f"{c['plain'] / gb(c):.2f}" for c in cases.values()) + " |",
        "| cpu-s/GB, profiled epochs (yappi's hooks included) | "
        + " | ".join(f"{c['profiled'] / gb(c):.2f}" for c in cases.values()) + " |",
    ]  # fmt: skip
    split = {name: shares(c) for name, c in cases.items()}
    for kind in every:
        cells = [
            f"{100 * split[n].get(kind, 0.0) / cases[n]['profiled']:.1f}% "
            f"({split[n].get(kind, 0.0) / gb(cases[n]):.2f})"
            for n in names
        ]
        lines.append(f"| {kind} | " + " | ".join(cells) + " |")
    for name, c in cases.items():
        lines += ["", f"{name}: the functions with the most own CPU (yappi `tsub`)", ""]
        ranked = sorted(c["functions"].items(), key=lambda item: -item[1])[:top]
        for function, seconds in ranked:
            lines.append(
                f"- {100 * seconds / c['profiled']:4.1f}%  {seconds / gb(c):.3f} cpu-s/GB  "
                f"`{function}`"
            )
    return "\n".join(lines)


def direct_costs(rows: int, cols: int, chunk_rows: int, repeats: int = 5) -> dict[str, float]:
    """cpu-s/GB of single operations a stream does per epoch, each alone on one thread.

    Timed with ``time.process_time`` over an epoch's worth (``rows`` x ``cols``
    float32), median of ``repeats``; what removing each would save, before any
    overlap with other threads: the sample ids as ``np.asarray(range)`` per
    sequential window (``BatchStream._take``) and as ``np.arange``; one copy of
    every sample into 256-row batches (``_rows``: ``window[a:b].copy()``) and by
    ``np.take`` with a permutation (the buffered shuffle's batches); each decoded
    chunk copied into a window's output (zarr's ``NDBuffer.__setitem__``), into a
    reused output and into a new one each window (first-touch page faults).
    """
    import numpy as np

    row_bytes = cols * 4
    window_rows = (32 * 2**20) // row_bytes  # DEFAULT_WINDOW_BYTES
    gb = rows * row_bytes / 1e9
    rng = np.random.default_rng(0)
    window = rng.standard_normal((window_rows, cols), dtype=np.float32)
    chunk = window[:chunk_rows].copy()
    order = rng.permutation(window_rows)
    windows = [(lo, min(rows, lo + window_rows)) for lo in range(0, rows, window_rows)]
    reused = np.empty_like(window)

    def ids_asarray() -> None:
        for lo, hi in windows:
            np.asarray(range(lo, hi))

    def ids_arange() -> None:
        for lo, hi in windows:
            np.arange(lo, hi, dtype=np.int64)

    def batches(take: bool) -> None:
        for lo, hi in windows:
            for a in range(0, hi - lo, 256):
                if take:
                    np.take(window, order[a : min(a + 256, hi - lo)], axis=0)
                else:
                    window[a : a + 256].copy()

    def chunks_into(fresh: bool) -> None:
        for lo, hi in windows:
            out = np.empty_like(window) if fresh else reused
            for a in range(0, hi - lo, chunk_rows):
                n = min(chunk_rows, hi - lo - a)
                out[a : a + n] = chunk[:n]

    found: dict[str, Any] = {
        "sample ids: np.asarray(range) per window": ids_asarray,
        "sample ids: np.arange per window": ids_arange,
        "batches: window[a:b].copy(), 256 rows": lambda: batches(take=False),
        "batches: np.take(window, permutation), 256 rows": lambda: batches(take=True),
        "chunks into a reused window output": lambda: chunks_into(fresh=False),
        "chunks into a new window output (page faults)": lambda: chunks_into(fresh=True),
    }
    costs = {}
    for name, function in found.items():
        function()
        spent = []
        for _ in range(repeats):
            cpu = time.process_time()
            function()
            spent.append(time.process_time() - cpu)
        costs[name] = sorted(spent)[len(spent) // 2] / gb
    return costs


def run(options: argparse.Namespace) -> None:
    """Profile the four cases, time the single operations; print and write the breakdown."""
    data_dir = Path(options.data)
    data_dir.mkdir(parents=True, exist_ok=True)
    ds = make_dataset(data_dir, options.rows or START_ROWS, 64, 8192)
    epochs = options.rounds or EPOCHS
    print(f"profiling {ds.path.name}: 4 cases, then single operations", flush=True)
    load = os.getloadavg()
    cases = {
        f"{stream}, {pipeline}": profile(ds.path, pipeline, stream, epochs)
        for stream in STREAMS
        for pipeline in PIPELINES
    }
    costs = direct_costs(ds.rows, ds.cols, ds.chunk_rows)
    load_after = os.getloadavg()
    command = "python -m benchmarks --only cpu-profile" + (
        f" --rounds {epochs}" if epochs != EPOCHS else ""
    )
    lines = [
        f"`{command}`: yappi (CPU clock, builtins, all threads), {epochs} epochs per case "
        f"after a warm one, {ds.rows:,} x 64 float32, 8192-row chunks, batch 256; load "
        f"average {load[0]:.2f} at the start, {load_after[0]:.2f} at the end.  Each kind's "
        "share of the profiled CPU (cpu-s/GB in brackets).",
        "",
        report(cases),
        "",
        "Single operations of an epoch, alone on one thread (cpu-s/GB, median of 5):",
        "",
        *(f"- {value:.3f}  {name}" for name, value in costs.items()),
    ]
    text = "\n".join(lines) + "\n"
    out = Path(options.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cpu-profile.md").write_text(text)
    print(text)


if __name__ == "__main__":
    child(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
