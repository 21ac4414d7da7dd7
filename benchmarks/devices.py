"""Batches on devices: ``JaxLoader`` and torch's device path against the loops they replace.

    python -m benchmarks --only jax --rounds 9

Shuffled ``Loader`` epochs of 256-row batches (buffered shuffle of 8 chunks of 1024
rows, the short last batch dropped) over two float32 Zarr arrays, 8,192 x 32 and
65,536 x 256 (made once under ``--data``; ``--rows`` gives one ``rows`` x 32 array
instead).  Each case is one epoch, the cases interleaved per round; the table shows the
median and the fastest epoch over ``--rounds`` and their ratio to the case's reference in
the same run:

- ``JaxLoader``, 8 devices: ``NamedSharding(mesh, PartitionSpec("batch"))`` over XLA's
  host platform split in 8 (``XLA_FLAGS=--xla_force_host_platform_device_count=8``, set
  here before JAX is imported), against the hand-written loop ``for b in loader:
  jax.device_put(b, sharding)`` (issue 38: at most 1.0x), each epoch ending when its last
  batch is on the devices (``block_until_ready``); the same with every batch waited for;
- ``JaxLoader``, one device, against ``jax.device_put(b)`` by hand;
- torch: ``ZarrIterableDataset(device="cpu")`` (the device path: batches put ``prefetch``
  ahead, ``tensor.to(device, non_blocking=True)``) against the host tensors moved by hand
  (``tensor.to("cpu", non_blocking=True)``), and a ``DevicePrefetcher`` around a
  0-worker ``DataLoader``;
- the numpy ``Loader`` alone, for scale.

Writes ``--out/jax.md`` and ``--out/jax.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import zarr

import daskzarr_batches as dzb

SHAPES = ((8192, 32), (65536, 256))  # (rows, features): the arrays of issue 38
CHUNK, BATCH, ROUNDS = 1024, 256, 3
TARGET = 1.0  # a device feed: at most this times the hand-written loop's epoch (issue 38)
SHARDED, TORCH = "JaxLoader, 8 devices (sharded)", 'torch: ZarrIterableDataset(device="cpu")'
#: each case's reference: the hand-written loop it replaces (the Loader's own: itself)
REFERENCES = {
    "Loader (numpy)": "Loader (numpy)",
    "hand loop: jax.device_put(b, sharding), 8 devices": "Loader (numpy)",
    SHARDED: "hand loop: jax.device_put(b, sharding), 8 devices",
    "JaxLoader, 8 devices, every batch waited for": (
        "hand loop: jax.device_put(b, sharding), 8 devices"
    ),
    "hand loop: jax.device_put(b), 1 device": "Loader (numpy)",
    "JaxLoader, 1 device": "hand loop: jax.device_put(b), 1 device",
    'torch hand loop: tensor.to("cpu", non_blocking=True)': "Loader (numpy)",
    TORCH: 'torch hand loop: tensor.to("cpu", non_blocking=True)',
    'torch: DevicePrefetcher(DataLoader, "cpu")': (
        'torch hand loop: tensor.to("cpu", non_blocking=True)'
    ),
}


def _path(data: Path, rows: int, features: int) -> Path:
    path = data / f"devices_x{rows}_c{features}_r{CHUNK}.zarr"
    if not path.exists():
        z = zarr.create_array(str(path), shape=(rows, features), chunks=(CHUNK, features),
                              dtype="f4")  # fmt: skip
        z[:] = np.random.default_rng(0).standard_normal((rows, features), dtype=np.float32)
    return path


def _epoch(
    batches: Iterable[Any],
    wait: Callable[[Any], Any] | None = None,
    each: bool = False,
    move: Callable[[Any], Any] | None = None,
) -> float:
    started = time.perf_counter()
    batch = None
    for batch in batches:
        if move is not None:
            batch = move(batch)
        if each and wait is not None:
            wait(batch)
    if wait is not None and batch is not None:
        wait(batch)
    return time.perf_counter() - started


def cases(path: Path) -> dict[str, Callable[[], float]]:
    """Each case: one epoch, its seconds."""
    if "jax" not in sys.modules:
        os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from daskzarr_batches.jax import JaxLoader

    x = zarr.open_array(str(path), mode="r")

    def loader() -> dzb.Loader:
        return dzb.Loader(x, BATCH, shuffle=True, shuffle_buffer_size=8 * CHUNK, seed=0,
                          drop_remainder=True)  # fmt: skip

    sharding = NamedSharding(Mesh(np.array(jax.devices()), ("batch",)), PartitionSpec("batch"))
    ready = jax.block_until_ready
    found: dict[str, Callable[[], float]] = {
        "Loader (numpy)": lambda: _epoch(loader()),
        "hand loop: jax.device_put(b, sharding), 8 devices": lambda: _epoch(
            loader(), ready, move=lambda b: jax.device_put(b, sharding)
        ),
        SHARDED: lambda: _epoch(JaxLoader(loader(), sharding=sharding), ready),
        "JaxLoader, 8 devices, every batch waited for": lambda: _epoch(
            JaxLoader(loader(), sharding=sharding), ready, each=True
        ),
        "hand loop: jax.device_put(b), 1 device": lambda: _epoch(
            loader(), ready, move=jax.device_put
        ),
        "JaxLoader, 1 device": lambda: _epoch(JaxLoader(loader()), ready),
    }
    try:
        import torch.utils.data

        from daskzarr_batches.torch import DevicePrefetcher, ZarrIterableDataset
    except ImportError:
        return found
    found['torch hand loop: tensor.to("cpu", non_blocking=True)'] = lambda: _epoch(
        ZarrIterableDataset(loader()), move=lambda t: t.to("cpu", non_blocking=True)
    )
    found[TORCH] = lambda: _epoch(ZarrIterableDataset(loader(), device="cpu"))
    found['torch: DevicePrefetcher(DataLoader, "cpu")'] = lambda: _epoch(
        DevicePrefetcher(
            torch.utils.data.DataLoader(ZarrIterableDataset(loader()), batch_size=None), "cpu"
        )
    )
    return found


def targets(ratio: dict[str, float], best: dict[str, float]) -> list[dict[str, Any]]:
    """The targets in the suite's shape (``docs/benchmarks.md`` is generated from them)."""
    out = []
    for case in ratio:
        shape, _, name = case.partition(" | ")
        if name in (SHARDED, TORCH):
            out.append({
                "what": f"[{shape}] {name} within {TARGET}x {REFERENCES[name]} (medians)",
                "measured": f"{ratio[case]:.2f}x ({best[case]:.2f}x of the fastest epochs)",
                "passed": ratio[case] <= TARGET,
            })  # fmt: skip
    return out


def run(options: argparse.Namespace) -> dict[str, Any]:
    """Time the cases, print the table and write ``--out/jax.md`` and ``jax.json``."""
    rounds = options.rounds or ROUNDS
    shapes = ((options.rows, 32),) if options.rows else SHAPES
    data, out = Path(options.data), Path(options.out)
    data.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    every: dict[str, Callable[[], float]] = {}
    for rows, features in shapes:
        label = f"{rows:,} x {features}"
        for case, run_once in cases(_path(data, rows, features)).items():
            every[f"{label} | {case}"] = run_once
    for run_once in every.values():  # warm-up: JAX compiles and caches its transfers
        run_once()
    seconds: dict[str, list[float]] = {case: [] for case in every}
    for _ in range(rounds):
        for case, run_once in every.items():
            seconds[case].append(run_once())

    def reference(case: str) -> str:
        shape, _, name = case.partition(" | ")
        return f"{shape} | {REFERENCES[name]}"

    median = {case: statistics.median(values) for case, values in seconds.items()}
    ratio = {case: median[case] / median[reference(case)] for case in every}
    fastest = {case: min(values) for case, values in seconds.items()}
    best = {case: fastest[case] / fastest[reference(case)] for case in every}
    found = targets(ratio, best)
    import jax

    sizes = f" --rows {options.rows}" if options.rows else ""
    command = f"python -m benchmarks --only jax{sizes} --rounds {rounds}"
    lines = [
        "# Batches on devices (issues 29, 38)",
        "",
        f"`{command}`; {platform.python_version()}, jax {jax.__version__}, "
        f"{os.cpu_count()} CPUs. float32 in {CHUNK}-row chunks, batch {BATCH}, buffered "
        f"shuffle of 8 chunks; median epoch of {rounds} interleaved rounds (after one "
        "warm-up round), each ratio to its reference (the loop it replaces) in the same run.",
        "",
        "| array | case | median epoch (s) | vs reference | fastest epoch (s) | vs reference |",
        "|---|---|---|---|---|---|",
        *(
            f"| {case.partition(' | ')[0]} | {case.partition(' | ')[2]} | {median[case]:.4f} "
            f"| {ratio[case]:.2f}x {REFERENCES[case.partition(' | ')[2]]} | "
            f"{fastest[case]:.4f} | {best[case]:.2f}x |"
            for case in every
        ),
        "",
        "The 8 devices are XLA's host platform split over this machine's cores: a put is a "
        "copy on the host. Not measured on GPUs or TPUs.",
        "",
        *(
            f"Target: {t['what']}: {'PASS' if t['passed'] else 'MISS'} ({t['measured']})."
            for t in found
        ),
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    (out / "jax.md").write_text(text, encoding="utf-8")
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    met = all(t["passed"] for t in found)
    result = {"command": command, "date": when, "seconds": seconds, "median": median,
              "ratio": ratio, "fastest": fastest, "fastest_ratio": best,
              "target": TARGET, "met": met, "jax": jax.__version__,
              "targets": found}  # fmt: skip
    (out / "jax.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return result
