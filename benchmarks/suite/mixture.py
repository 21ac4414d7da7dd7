"""Mixtures (issue 18): a two-source mixture against its sources streamed alone.

``python -m benchmarks --only mixture [--rounds N]`` writes two stores of ``COLS``
float32 columns in ``CHUNK_ROWS``-row chunks (``ROWS`` rows each: 400,000 and 200,000),
mixes them with :func:`daskzarr_batches.mix` by their lengths' weights (2/3, 1/3, so
``stop="first_exhausted"`` uses every sample of both: the same bytes as the sources)
and streams one epoch of the mixture with each batch stream kind (sequential, buffered
shuffle of 8 chunks, exact shuffle at the default budget), batch 256, beside one case
that streams the first source then the second with the same settings ("sources
alone").  Every case in one set of interleaved rounds; ratios of the **medians**
(sources alone over the mixture, so > 1 means the mixture is faster).  Each row also
shows the read amplification both ways (a buffered mixture reads each source's buffer
over about ``1 / weight`` windows: ``docs/training.md``, *Mixtures*).  ``suite/run.py``
(``run_mixture``) writes ``<out>/mixture.md`` and ``mixture.json``; the targets are
``MIXTURE_TARGETS`` of ``suite/targets.py``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import zarr

import daskzarr_batches as dzb

from .measure import Case, Measured, Result, drain, rounds

ROWS = (400_000, 200_000)
COLS = 64
CHUNK_ROWS = 8192
BATCH = 256
BUFFER = 8 * CHUNK_ROWS
ROUNDS = 5

SEQUENTIAL = f"sequential, batch {BATCH}"
BUFFERED = f"buffered shuffle (8 chunks), batch {BATCH}"
EXACT = f"exact shuffle (default budget), batch {BATCH}"
KINDS = (SEQUENTIAL, BUFFERED, EXACT)
MIXED = "mixture"
ALONE = "sources alone"


def name(which: str, kind: str) -> str:
    """A case's name, e.g. ``[mixture] sequential, batch 256``."""
    return f"[{which}] {kind}"


def _write(path: Path, rows: int, seed: int, chunk_rows: int) -> None:
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


def make_stores(data_dir: Path, rows: tuple[int, ...], chunk_rows: int) -> list[Path]:
    """Create (once) one store per source."""
    started = time.perf_counter()
    root = data_dir / f"mixture_{'_'.join(map(str, rows))}_c{COLS}_r{chunk_rows}"
    paths = [root / f"source{k}.zarr" for k in range(len(rows))]
    for k, (path, n) in enumerate(zip(paths, rows, strict=True)):
        _write(path, n, k + 1, chunk_rows)
    print(f"mixture stores ready in {time.perf_counter() - started:.1f} s", flush=True)
    return paths


def _stream(data: object, kind: str, buffer: int) -> object:
    if kind == SEQUENTIAL:
        return dzb.batch_stream(data, BATCH)
    if kind == BUFFERED:
        return dzb.shuffled_batch_stream(data, BATCH, seed=0, shuffle_buffer_size=buffer)
    return dzb.shuffled_batch_stream(data, BATCH, seed=0)


def _alone(sources: list[zarr.Array], kind: str, buffer: int) -> Measured:
    """Each source's epoch, one after the other; amplification weighted by bytes."""
    total_bytes = total_samples = 0
    weighted = 0.0
    for x in sources:
        nbytes, samples, amplification = drain(_stream(x, kind, buffer))  # type: ignore[arg-type]
        total_bytes += nbytes
        total_samples += samples
        weighted += amplification * nbytes
    return total_bytes, total_samples, weighted / max(total_bytes, 1)


def measure(
    data_dir: Path,
    repeats: int,
    rows: tuple[int, ...] = ROWS,
    chunk_rows: int = CHUNK_ROWS,
) -> dict[str, Result]:
    """Every case, in one set of interleaved rounds."""
    paths = make_stores(data_dir, rows, chunk_rows)
    # opened as mix opens them (open_array: zarrs' pipeline when installed), so both
    # sides decode alike
    sources = [dzb.open_array(str(p)) for p in paths]
    weights = [n / sum(rows) for n in rows]
    mixture = dzb.mix([str(p) for p in paths], weights, seed=0)
    buffer = 8 * chunk_rows
    with dzb.batch_stream(sources[0], BATCH) as stream:  # imports, pools
        next(stream)
    print(
        f"mixture: sources of {', '.join(f'{n:,}' for n in rows)} x {COLS} float32, weights "
        f"{', '.join(f'{w:.3f}' for w in weights)}, {repeats} rounds"
    )
    cases: list[Case] = []
    for kind in KINDS:
        mixed: Callable[[], Measured] = lambda kind=kind: drain(_stream(mixture, kind, buffer))  # type: ignore[misc, arg-type]  # noqa: E731
        alone: Callable[[], Measured] = lambda kind=kind: _alone(sources, kind, buffer)  # type: ignore[misc]  # noqa: E731
        cases.append(Case(name(MIXED, kind), "this", mixed))
        cases.append(Case(name(ALONE, kind), "this", alone))
    return rounds(cases, repeats)


def median_seconds(result: Result) -> float:
    return float(np.median(result.extra["seconds"]))


def table(results: dict[str, Result]) -> list[str]:
    """One row per kind: both MB/s (medians), the ratio and both read amplifications."""
    lines = [
        f"| stream kind | {ALONE} MB/s | {MIXED} MB/s | {MIXED} / {ALONE} "
        f"| read amplification alone | {MIXED} |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for kind in KINDS:
        a, b = results.get(name(ALONE, kind)), results.get(name(MIXED, kind))
        if a is None or b is None:
            continue
        mb_a = a.bytes / median_seconds(a) / 1e6
        mb_b = b.bytes / median_seconds(b) / 1e6
        lines.append(
            f"| {kind} | {mb_a:,.0f} | {mb_b:,.0f} | "
            f"{median_seconds(a) / median_seconds(b):.2f}x | {a.amplification:.2f} "
            f"| {b.amplification:.2f} |"
        )
    return lines
