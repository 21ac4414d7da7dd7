"""The patch cases of issue 16: N-D patches and forecast pairs over a weather-like field.

``python -m benchmarks --only patches`` generates (once, under ``--data``) a float32
field of ``(steps, 721, 1440)`` (a smooth large-scale pattern that moves with time,
plus Gaussian noise; zstd) in two chunkings, ``(1, 721, 1440)`` (one field per
chunk) and ``(8, 180, 360)``, holding the same values, and measures on each, in
interleaved rounds:

- **L0**: zarr-python reading the stored chunks one at a time in C order, each
  decoded once (the decode floor of a naive loop);
- **patches** ``patch_stream(z, {0: 1, 1: 64, 2: 64}, 256, input_overlap={1: 16, 2: 16})``:
  sequential, buffered shuffle (8 fields of patches) and exact shuffle (default budget);
- **forecast pairs** ``patch_stream(z, {0: 1}, 4, target_offset={0: 1})``, sequential;
- **xbatcher** ``BatchGenerator`` with the same ``input_dims`` / ``input_overlap``
  over the array opened with ``xarray.open_zarr`` (dask, the stored chunks), every
  patch taken as numpy, on the first :data:`XBATCHER_STEPS` time steps only (it
  makes ~120 patches/s) and compared per patch.

Ratios are of **medians** over the rounds (the best round is in ``patches.json``):
against L0 they compare the seconds of an epoch over the same stored data (stored
MB/s), against xbatcher the patches per second.  The stream cases also record the
read amplification of their epoch (``stream.stats``) and of their plan
(``stream.summary()``).  Results go to ``<out>/patches.md`` and ``<out>/patches.json``.
"""

from __future__ import annotations

import datetime
import functools
import itertools
import json
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.codecs import ZstdCodec

import daskzarr_batches as dzb

from .cases import installed
from .measure import MB, Case, Measured, Result, SuiteRun, rounds

#: time steps of the field by default (``--steps``): 64 x 4.15 MB = 266 MB decoded
STEPS = 64
#: the field's (lat, lon), as ERA5's 0.25 degree grid
GRID = (721, 1440)
#: the two chunkings: one field per chunk, and 8 steps of a 4 x 4 tiling (edge chunks short)
CHUNKINGS = ((1, 721, 1440), (8, 180, 360))
PATCH = {0: 1, 1: 64, 2: 64}
OVERLAP = {1: 16, 2: 16}
BATCH = 256
#: forecast pairs: fields (t, t + 1) per batch (2 x 4 x 4.15 MB)
PAIR_BATCH = 4
#: the buffered shuffle holds the patches of this many time steps
BUFFER_STEPS = 8
#: time steps xbatcher reads (it is ~200x slower; compared per patch)
XBATCHER_STEPS = 1
#: rounds by default (``--rounds``); xbatcher takes part in at most 2
ROUNDS = 5
XBATCHER_ROUNDS = 2

# Case kinds (the second part of a name; the first names the chunking).
L0_KIND = "L0: zarr chunk by chunk, 1 thread"
SEQUENTIAL = "patches, sequential"
BUFFERED = f"patches, buffered shuffle ({BUFFER_STEPS} steps)"
EXACT = "patches, exact shuffle (default budget)"
XBATCHER = f"xbatcher BatchGenerator, {XBATCHER_STEPS} step(s)"
PAIRS = f"forecast pairs (t, t+1), sequential, batch {PAIR_BATCH}"
KINDS = (L0_KIND, SEQUENTIAL, BUFFERED, EXACT, XBATCHER, PAIRS)
#: what ``skipped`` holds when the patch cases did not run
SKIP_KEY = "patches"


def chunk_label(chunks: tuple[int, ...]) -> str:
    return "chunks " + "x".join(map(str, chunks))


def name(chunks: tuple[int, ...], kind: str) -> str:
    """A case's name: ``[chunks 1x721x1440] patches, sequential``."""
    return f"[{chunk_label(chunks)}] {kind}"


# --------------------------------------------------------------------------
# The field


@dataclass(frozen=True)
class Field:
    path: Path
    shape: tuple[int, int, int]
    chunks: tuple[int, int, int]

    @property
    def array(self) -> zarr.Array:
        return zarr.open_array(self.path / "field", mode="r")

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * 4


def field_step(t: int, grid: tuple[int, int]) -> np.ndarray:
    """Time step ``t``: ~280 K with waves moving in longitude, plus noise of s.d. 0.5."""
    lat = np.linspace(-np.pi / 2, np.pi / 2, grid[0], dtype="f4")[:, None]
    lon = np.linspace(0, 2 * np.pi, grid[1], endpoint=False, dtype="f4")[None, :]
    smooth = (
        280
        + 30 * np.cos(lat)
        + 5 * np.sin(3 * lon + 0.1 * t) * np.cos(2 * lat)
        + 2 * np.sin(7 * lon - 0.05 * t) * np.sin(5 * lat + 0.03 * t)
    )
    noise = np.random.default_rng(t).standard_normal(grid, dtype=np.float32)
    return (smooth + 0.5 * noise).astype("f4")


def make_field(
    data_dir: Path, steps: int, chunks: tuple[int, int, int], grid: tuple[int, int] = GRID
) -> Field:
    """Create (once) a group holding ``field`` (dims time, lat, lon; zstd level 3)."""
    shape = (steps, *grid)
    tag = "x".join(map(str, chunks))
    path = data_dir / f"field_t{steps}_{grid[0]}x{grid[1]}_c{tag}.zarr"
    field = Field(path, shape, chunks)
    done = path.with_name(path.name + ".complete")  # beside it: xarray reads the group
    if done.exists():
        return field
    started = time.perf_counter()
    group = zarr.open_group(path, mode="w")
    z = group.create_array(
        "field", shape=shape, chunks=chunks, dtype="f4", compressors=ZstdCodec(level=3),
        dimension_names=("time", "lat", "lon"),
    )  # fmt: skip
    step = max(8, chunks[0])
    for lo in range(0, steps, step):
        hi = min(steps, lo + step)
        z[lo:hi] = np.stack([field_step(t, grid) for t in range(lo, hi)])
    done.write_text("ok")
    print(f"generated {path} in {time.perf_counter() - started:.1f} s", flush=True)
    return field


# --------------------------------------------------------------------------
# The cases


def l0_chunks(z: zarr.Array) -> Measured:
    """Every stored chunk read once, in C order, on one thread."""
    grid = [range(0, size, chunk) for size, chunk in zip(z.shape, z.chunks, strict=True)]
    for origin in itertools.product(*grid):
        z[tuple(slice(o, o + c) for o, c in zip(origin, z.chunks, strict=True))]
    return z.nbytes, 0, 1.0


class Epoch:
    """One epoch of a stream made by ``make``: stored bytes, samples, amplification.

    The last stream is kept, so its plan's read amplification (``stream.summary()``, a
    few ms of planning) is taken after the rounds, outside the timed epoch.
    """

    def __init__(self, make: Callable[[], Any], stored_bytes: int) -> None:
        self.make = make
        self.stored_bytes = stored_bytes
        self.last: Any = None

    def __call__(self) -> Measured:
        with self.make() as stream:
            samples = 0
            for item in stream:
                samples += len(item[0] if isinstance(item, tuple) else item)
        self.last = stream
        return self.stored_bytes, samples, stream.stats.read_amplification

    @property
    def plan_amplification(self) -> float:
        return float(self.last.summary().read_amplification)


def xbatcher_patches(path: Path, steps: int) -> Measured:
    """xbatcher over the first ``steps`` time steps, each patch taken as numpy."""
    import xarray as xr
    import xbatcher

    data = xr.open_zarr(path, consolidated=False)["field"].isel(time=slice(0, steps))
    generator = xbatcher.BatchGenerator(
        data,
        input_dims={"time": 1, "lat": PATCH[1], "lon": PATCH[2]},
        input_overlap={"lat": OVERLAP[1], "lon": OVERLAP[2]},
    )
    samples = 0
    for item in generator:
        np.asarray(item.values)
        samples += 1
    return steps * data.shape[1] * data.shape[2] * 4, samples, float("nan")


def patches_per_step(grid: tuple[int, int]) -> int:
    strides = [PATCH[d] - OVERLAP[d] for d in (1, 2)]
    sizes = [PATCH[1], PATCH[2]]
    return int(np.prod([(n - s) // st + 1 for n, s, st in zip(grid, sizes, strides, strict=True)]))


@dataclass
class PatchCases:
    cases: list[Case]
    epochs: dict[str, Epoch]


def field_cases(field: Field, skipped: dict[str, str]) -> PatchCases:
    z = field.array
    buffer = BUFFER_STEPS * patches_per_step(field.shape[1:])
    epochs = {
        name(field.chunks, SEQUENTIAL): Epoch(
            lambda: dzb.patch_stream(z, PATCH, BATCH, input_overlap=OVERLAP), field.nbytes
        ),
        name(field.chunks, BUFFERED): Epoch(
            lambda: dzb.patch_stream(z, PATCH, BATCH, input_overlap=OVERLAP, shuffle=True,
                                     shuffle_buffer_size=buffer), field.nbytes),
        name(field.chunks, EXACT): Epoch(
            lambda: dzb.patch_stream(z, PATCH, BATCH, input_overlap=OVERLAP, shuffle=True),
            field.nbytes),
        name(field.chunks, PAIRS): Epoch(
            lambda: dzb.patch_stream(z, {0: 1}, PAIR_BATCH, target_offset={0: 1}), field.nbytes),
    }  # fmt: skip
    cases = [Case(name(field.chunks, L0_KIND), "reference", lambda: l0_chunks(z))]
    cases += [Case(case, "this", epoch) for case, epoch in epochs.items()]
    if installed("xbatcher", skipped) and installed("xarray", skipped):
        steps = min(XBATCHER_STEPS, field.shape[0])
        run = functools.partial(xbatcher_patches, field.path, steps)
        cases.append(Case(name(field.chunks, XBATCHER), "peer", run, repeats=XBATCHER_ROUNDS))
    return PatchCases(cases, epochs)


def measure_patches(
    data_dir: Path,
    *,
    steps: int = STEPS,
    grid: tuple[int, int] = GRID,
    chunkings: tuple[tuple[int, int, int], ...] = CHUNKINGS,
    repeats: int = ROUNDS,
    skipped: dict[str, str],
) -> dict[str, Result]:
    """Every patch case of both chunkings in the same interleaved rounds.

    Each result gets ``extra["median_seconds"]``, ``extra["patch_bytes"]`` (bytes of
    the patches (or pairs) it delivered) and, for this library's streams,
    ``extra["plan_amplification"]``.
    """
    fields = [make_field(data_dir, steps, chunks, grid) for chunks in chunkings]
    all_cases: list[Case] = []
    epochs: dict[str, Epoch] = {}
    for field in fields:
        made = field_cases(field, skipped)
        all_cases += made.cases
        epochs |= made.epochs
    print(f"patches: {steps} x {grid[0]} x {grid[1]} float32, {repeats} interleaved rounds")
    results = rounds(all_cases, repeats)
    for case, result in results.items():
        result.extra["median_seconds"] = float(np.median(result.extra["seconds"]))
        if case.endswith(PAIRS):
            result.extra["patch_bytes"] = result.samples * 2 * grid[0] * grid[1] * 4
        else:
            result.extra["patch_bytes"] = result.samples * PATCH[1] * PATCH[2] * 4
        if case in epochs:
            result.extra["plan_amplification"] = epochs[case].plan_amplification
    return results


# --------------------------------------------------------------------------
# What the targets and the report read


def median_mb_s(result: Result) -> float:
    """Stored MB/s of the median round."""
    return result.bytes / result.extra["median_seconds"] / MB


def median_patches_s(result: Result) -> float:
    return result.samples / result.extra["median_seconds"]


def vs_l0(run: SuiteRun, case: str) -> float:
    """Median stored MB/s of ``case`` over that of L0 on the same chunks."""
    label = case[: case.index("]") + 1]
    return median_mb_s(run.result(case)) / median_mb_s(run.result(f"{label} {L0_KIND}"))


def patches_table(results: dict[str, Result]) -> list[str]:
    lines = [
        "| case | patch MB/s | stored MB/s | patches/s | vs L0 | epoch s (median; best) "
        "| read amp. (epoch / plan) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    refs = {case[: case.index("]") + 1]: r for case, r in results.items() if L0_KIND in case}
    for case, r in results.items():
        if not case.startswith("[chunks"):
            continue
        seconds = r.extra["median_seconds"]
        ref = refs.get(case[: case.index("]") + 1])
        ratio = f"{median_mb_s(r) / median_mb_s(ref):.2f}x" if ref else "-"
        patches = "-" if L0_KIND in case else f"{r.extra['patch_bytes'] / seconds / MB:,.1f}"
        rate = "-" if L0_KIND in case else f"{median_patches_s(r):,.0f}"
        amp = (
            f"{r.amplification:.2f} / {r.extra['plan_amplification']:.2f}"
            if "plan_amplification" in r.extra
            else "-"
        )
        lines.append(
            f"| {case} | {patches} | {median_mb_s(r):,.1f} | {rate} | {ratio} | "
            f"{seconds:.3f}; {r.seconds:.3f} | {amp} |"
        )
    return lines


def write_outputs(
    results: dict[str, Result],
    targets: list[Any],
    out: Path,
    *,
    command: str,
    steps: int,
    grid: tuple[int, int] = GRID,
) -> str:
    """``<out>/patches.md`` and ``<out>/patches.json``; returns the markdown."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Patch benchmark (issue 16)",
        "",
        f"`{command}` on {now}: a ({steps}, {grid[0]}, {grid[1]}) float32 field (smooth + "
        f"noise, zstd), {os.cpu_count()} CPUs, load (1 min) {os.getloadavg()[0]:.1f} at the "
        f"end, Python {platform.python_version()}, zarr {zarr.__version__}, numpy "
        f"{np.__version__}.  Patches 64 x 64 (x 1 step), overlap 16, batch {BATCH}; medians "
        f"of interleaved rounds (xbatcher: {XBATCHER_STEPS} step(s), at most "
        f"{XBATCHER_ROUNDS} rounds, compared per patch).",
        "",
        *patches_table(results),
        "",
        "| target | measured | result |",
        "|---|---|---|",
        *(f"| {t.what} | {t.measured} | {t.status}{f' ({t.why})' if t.why else ''} |"
          for t in targets),
    ]  # fmt: skip
    text = "\n".join(lines) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    (out / "patches.md").write_text(text)
    payload = {
        "command": command,
        "date": now,
        "results": [asdict(r) | {"median_mb_s": median_mb_s(r)} for r in results.values()],
        "targets": [asdict(t) for t in targets],
    }
    (out / "patches.json").write_text(json.dumps(payload, indent=1, default=str) + "\n")
    return text
