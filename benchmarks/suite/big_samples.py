"""Big samples (issue 16): fields of 181 x 360 float32 (254.5 KiB), 1, 4 and 32 to a chunk.

``python -m benchmarks --only big-samples [--fields N] [--rounds N]`` measures, for
each chunking, zarr reading the chunks one at a time (L0) beside this library's
sequential, buffered (a buffer of :data:`BUFFER`, a size in bytes) and exact (default
``memory_budget``) streams, batch :data:`BATCH`, all in one set of interleaved rounds.
Ratios are of the **medians** over the rounds (not the best round): on a shared 2-core
machine the best round of a 0.2 s epoch is luck.  The arrays are generated once under
``--data`` (zarr's default codec, zstd) and opened read-only.  ``suite/run.py``
(``run_big_samples``) writes ``<out>/big_samples.md`` and ``big_samples.json``; the
targets are the rows ``BIG_SAMPLE_TARGETS`` of ``suite/targets.py``.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import zarr

import daskzarr_batches as dzb

from .cases import l0
from .measure import MB, Case, Result, drain, rounds, timed

#: one sample: a 0.5-degree global field
FIELD = (181, 360)
#: samples per stored chunk of each array
PER_CHUNK = (1, 4, 32)
#: fields of each array (``--fields``)
FIELDS = 768
BATCH = 16
#: the buffered shuffle's buffer, in bytes (257 fields)
BUFFER = "64MiB"
ROUNDS = 5

L0_KIND = "L0: zarr chunk-aligned, 1 thread"
SEQUENTIAL = f"sequential, batch {BATCH}"
BUFFERED = f"buffered shuffle ({BUFFER}), batch {BATCH}"
EXACT = f"exact shuffle (default budget), batch {BATCH}"
KINDS = (L0_KIND, SEQUENTIAL, BUFFERED, EXACT)


def name(per_chunk: int, kind: str) -> str:
    """A case's name, e.g. ``[fields, 4/chunk] sequential, batch 16``."""
    return f"[fields, {per_chunk}/chunk] {kind}"


def make_fields(data_dir: Path, fields: int, per_chunk: int) -> zarr.Array:
    """Create (once) ``fields`` x 181 x 360 float32 in chunks of ``per_chunk`` fields."""
    path = data_dir / f"fields{fields}_{FIELD[0]}x{FIELD[1]}_k{per_chunk}.zarr"
    done = path / "complete"
    if not done.exists():
        started = time.perf_counter()
        x = zarr.create_array(
            path, shape=(fields, *FIELD), chunks=(per_chunk, *FIELD), dtype="f4", overwrite=True
        )
        rng = np.random.default_rng(per_chunk)
        step = 64 * per_chunk
        for lo in range(0, fields, step):
            hi = min(fields, lo + step)
            x[lo:hi] = rng.standard_normal((hi - lo, *FIELD), dtype=np.float32)
        done.write_text("ok")
        print(f"generated {path} in {time.perf_counter() - started:.1f} s", flush=True)
    return zarr.open_array(path, mode="r")


def cases(arrays: dict[int, zarr.Array]) -> list[Case]:
    """L0 and the three stream kinds on each array."""
    out: list[Case] = []
    for k, x in arrays.items():
        out += [
            Case(name(k, L0_KIND), "reference", lambda x=x: l0(x)),
            Case(name(k, SEQUENTIAL), "this", lambda x=x: drain(dzb.batch_stream(x, BATCH))),
            Case(name(k, BUFFERED), "this", lambda x=x: drain(
                dzb.shuffled_batch_stream(x, BATCH, seed=0, shuffle_buffer_size=BUFFER))),
            Case(name(k, EXACT), "this", lambda x=x: drain(
                dzb.shuffled_batch_stream(x, BATCH, seed=0))),
        ]  # fmt: skip
    return out


def measure(data_dir: Path, fields: int, repeats: int) -> dict[str, Result]:
    """Every case, in one set of interleaved rounds."""
    arrays = {k: make_fields(data_dir, fields, k) for k in PER_CHUNK}
    with dzb.batch_stream(arrays[PER_CHUNK[0]], BATCH) as stream:  # imports, pools
        next(stream)
    print(f"big samples: {fields} fields of {FIELD[0]} x {FIELD[1]} float32, {repeats} rounds")
    measured = cases(arrays)
    results = rounds(measured, repeats)
    print("  CPU seconds of one more epoch each (all threads of this process)")
    for case in measured:
        results[case.name].extra["cpu"] = timed(case.run)[1]
    return results


def median_seconds(result: Result) -> float:
    return float(np.median(result.extra["seconds"]))


def table(results: dict[str, Result]) -> list[str]:
    """One row per chunking: L0's MB/s (median), each kind's median ratio over L0."""
    lines = [
        "| samples per chunk | L0 MB/s | " + " | ".join(KINDS[1:]) + " |",
        "|---:|---:|" + "---:|" * (len(KINDS) - 1),
    ]
    for k in PER_CHUNK:
        if name(k, L0_KIND) not in results:
            continue
        ref = results[name(k, L0_KIND)]
        cells = [f"{ref.bytes / median_seconds(ref) / MB:,.0f}"]
        for kind in KINDS[1:]:
            cells.append(f"{median_seconds(ref) / median_seconds(results[name(k, kind)]):.2f}x")
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    return lines


def cpu_table(results: dict[str, Result]) -> list[str]:
    """One row per chunking: each kind's CPU seconds per epoch over L0's (one more epoch)."""
    lines = [
        "| samples per chunk | L0 CPU s | " + " | ".join(KINDS[1:]) + " |",
        "|---:|---:|" + "---:|" * (len(KINDS) - 1),
    ]
    for k in PER_CHUNK:
        ref = results.get(name(k, L0_KIND))
        if ref is None or "cpu" not in ref.extra:
            continue
        cells = [f"{ref.extra['cpu']:.2f}"]
        for kind in KINDS[1:]:
            cells.append(f"{results[name(k, kind)].extra['cpu'] / ref.extra['cpu']:.2f}x")
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    return lines
