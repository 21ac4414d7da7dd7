"""Collections (issue 18): 50 stores of 20,000 rows against one store of 1,000,000.

``python -m benchmarks --only collection [--rounds N] [--stores N]`` measures every
stream kind (sequential, buffered shuffle of 8 chunks, exact shuffle at the default
budget, chunk stream) on one store of ``STORES * ROWS`` x 64 float32 rows in 8192-row
chunks (the suite's default dataset shape) and on ``STORES`` stores of ``ROWS`` rows
each, joined by :func:`daskzarr_batches.open_collection`, batch 256, in one set of
interleaved rounds; ratios are of the **medians** (collection over single store).  It
also times opening ``OPEN_STORES`` tiny stores with ``open_collection`` (medians of
the rounds) beside opening them one after another with ``open_array``.  ``suite/run.py``
(``run_collection``) writes ``<out>/collection.md`` and ``collection.json``; the
targets are ``COLLECTION_TARGETS`` of ``suite/targets.py``.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import zarr

import daskzarr_batches as dzb

from .measure import Case, Result, drain, rounds

STORES = 50
ROWS = 20_000
COLS = 64
CHUNK_ROWS = 8192
BATCH = 256
BUFFER = 8 * CHUNK_ROWS
OPEN_STORES = 1000
ROUNDS = 5

SEQUENTIAL = f"sequential, batch {BATCH}"
BUFFERED = f"buffered shuffle (8 chunks), batch {BATCH}"
EXACT = f"exact shuffle (default budget), batch {BATCH}"
CHUNKS = "chunk stream"
KINDS = (SEQUENTIAL, BUFFERED, EXACT, CHUNKS)
SINGLE = "one store"
MANY = "collection"


def name(which: str, kind: str) -> str:
    """A case's name, e.g. ``[collection] sequential, batch 256``."""
    return f"[{which}] {kind}"


def _write(path: Path, rows: int, seed: int, chunk_rows: int = CHUNK_ROWS) -> None:
    done = path / "complete"
    if done.exists():
        return
    x = zarr.create_array(
        path, shape=(rows, COLS), chunks=(chunk_rows, COLS), dtype="f4", overwrite=True
    )
    rng = np.random.default_rng(seed)
    step = 16 * chunk_rows
    for lo in range(0, rows, step):
        hi = min(rows, lo + step)
        x[lo:hi] = rng.standard_normal((hi - lo, COLS), dtype=np.float32)
    done.write_text("ok")


def make_stores(data_dir: Path, stores: int) -> tuple[Path, list[Path], list[Path]]:
    """Create (once) the single store, the ``stores`` member stores and the tiny ones."""
    started = time.perf_counter()
    root = data_dir / f"collection_{stores}x{ROWS}_c{COLS}_r{CHUNK_ROWS}"
    single = root / "single.zarr"
    _write(single, stores * ROWS, 0)
    members = [root / f"member{i:03d}.zarr" for i in range(stores)]
    for i, path in enumerate(members):
        _write(path, ROWS, i + 1)
    tiny = [root / "tiny" / f"t{i:04d}.zarr" for i in range(OPEN_STORES)]
    for i, path in enumerate(tiny):
        _write(path, 100, i, chunk_rows=100)
    print(f"collection stores ready in {time.perf_counter() - started:.1f} s", flush=True)
    return single, members, tiny


def _kinds(data: object) -> dict[str, object]:
    return {
        SEQUENTIAL: lambda: drain(dzb.batch_stream(data, BATCH)),
        BUFFERED: lambda: drain(
            dzb.shuffled_batch_stream(data, BATCH, seed=0, shuffle_buffer_size=BUFFER)
        ),
        EXACT: lambda: drain(dzb.shuffled_batch_stream(data, BATCH, seed=0)),
        CHUNKS: lambda: drain(dzb.chunk_stream(data)),
    }


def _open(paths: list[Path]) -> tuple[int, int, float]:
    collection = dzb.open_collection([str(p) for p in paths])
    return 0, len(collection), 1.0


def measure(data_dir: Path, stores: int, repeats: int) -> dict[str, Result]:
    """Every case, in one set of interleaved rounds; then opening the tiny stores."""
    single, members, tiny = make_stores(data_dir, stores)
    # opened as the members are (open_array: zarrs' pipeline when installed), so both
    # sides decode alike
    one = dzb.open_array(str(single))
    started = time.perf_counter()
    many = dzb.open_collection([str(p) for p in members])
    print(f"opened {stores} member stores in {time.perf_counter() - started:.2f} s")
    with dzb.batch_stream(one, BATCH) as stream:  # imports, pools
        next(stream)
    print(
        f"collection: {stores} stores of {ROWS} x {COLS} float32 vs one of "
        f"{stores * ROWS}, {repeats} rounds"
    )
    cases: list[Case] = []
    for which, data in ((SINGLE, one), (MANY, many)):
        for kind, run in _kinds(data).items():
            cases.append(Case(name(which, kind), "this", run))  # type: ignore[arg-type]
    cases.append(Case(f"open {OPEN_STORES} stores", "this", lambda: _open(tiny)))
    results = rounds(cases, repeats)
    started = time.perf_counter()
    for path in tiny:
        dzb.open_array(str(path))
    results[f"open {OPEN_STORES} stores"].extra["one_by_one"] = time.perf_counter() - started
    return results


def median_seconds(result: Result) -> float:
    return float(np.median(result.extra["seconds"]))


def table(results: dict[str, Result]) -> list[str]:
    """One row per kind: the single store's MB/s (median) and the collection's ratio."""
    lines = [
        f"| stream kind | {SINGLE} MB/s | {MANY} MB/s | {MANY} / {SINGLE} |",
        "|---|---:|---:|---:|",
    ]
    for kind in KINDS:
        a, b = results.get(name(SINGLE, kind)), results.get(name(MANY, kind))
        if a is None or b is None:
            continue
        mb_a = a.bytes / median_seconds(a) / 1e6
        mb_b = b.bytes / median_seconds(b) / 1e6
        lines.append(
            f"| {kind} | {mb_a:,.0f} | {mb_b:,.0f} | {median_seconds(a) / median_seconds(b):.2f}x |"
        )
    opened = results.get(f"open {OPEN_STORES} stores")
    if opened is not None:
        lines += [
            "",
            f"Opening {OPEN_STORES} stores of 100 rows: `open_collection` "
            f"{median_seconds(opened):.2f} s (median), one `open_array` after another "
            f"{opened.extra['one_by_one']:.2f} s.",
        ]
    return lines
