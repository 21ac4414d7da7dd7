"""What DataLoader workers cost and when they pay: ``ZarrIterableDataset`` against its Loader.

    python -m benchmarks --only torch-workers --epochs 3 --rounds 2
    python -m benchmarks --only torch-workers --match heavy   # the cases named so

A 200,000 x 32 float32 Zarr array in 8192-row chunks (made once under
``--data``), batch 256, buffered shuffle of 8 chunks.  Every case runs
``--epochs`` epochs in a row, from a new DataLoader (so worker start-up is
timed), once per round, the cases interleaved; the table shows, per case, the
median over rounds of the first epoch (start-up included), of the later epochs
(steady state), of the time to the first batch of each epoch, and the
throughput ratio to the Loader alone measured in the same run (the plain
IterableDataset shows what the DataLoader itself costs per batch).  ``heavy`` cases
add a per-batch transform that holds the GIL (a Python loop over the batch's
rows), the kind of work workers exist for.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import zarr

import daskzarr_batches as dzb

ROWS, FEATURES, CHUNK, BATCH = 200_000, 32, 8192, 256
#: defaults of the options this benchmark reads
EPOCHS, ROUNDS = 3, 2


def heavy(batch: np.ndarray) -> np.ndarray:
    """A per-batch transform that holds the GIL: a Python loop over the rows (~6 ms)."""
    return np.stack([np.cumsum(np.roll(row, 1)) * np.float32(0.5) for row in batch])


def dataset_path(data: Path) -> Path:
    path = data / f"torch_x{ROWS}_c{FEATURES}_r{CHUNK}.zarr"
    if not path.exists():
        z = zarr.create_array(
            str(path), shape=(ROWS, FEATURES), chunks=(CHUNK, FEATURES), dtype="f4"
        )
        z[:] = np.random.default_rng(0).standard_normal((ROWS, FEATURES), dtype=np.float32)
    return path


def make_loader(path: Path, transform: Callable[[Any], Any] | None) -> dzb.Loader:
    x = zarr.open_array(str(path), mode="r")
    return dzb.Loader(
        x, BATCH, shuffle=True, shuffle_buffer_size=8 * CHUNK, seed=0, transform=transform
    )


def epochs(make: Callable[[], Iterable[Any]], count: int) -> tuple[list[float], list[float]]:
    """Seconds per epoch and to each epoch's first batch, ``count`` epochs of one iterable."""
    batches = make()
    per_epoch, first = [], []
    for _ in range(count):
        started = time.perf_counter()
        samples = 0
        for i, batch in enumerate(batches):
            if i == 0:
                first.append(time.perf_counter() - started)
            samples += len(batch)
        per_epoch.append(time.perf_counter() - started)
        assert samples == ROWS, samples
    return per_epoch, first


def cases(path: Path, count: int) -> dict[str, Callable[[], tuple[list[float], list[float]]]]:
    import torch.utils.data

    from daskzarr_batches.torch import ZarrIterableDataset

    def torch_case(
        workers: int, context: str | None = None, persistent: bool = False, transform: Any = None
    ) -> Callable[[], tuple[list[float], list[float]]]:
        def make() -> Any:
            return torch.utils.data.DataLoader(
                ZarrIterableDataset(make_loader(path, transform)),
                batch_size=None,
                num_workers=workers,
                multiprocessing_context=context,
                persistent_workers=persistent,
            )

        return lambda: epochs(make, count)

    class Plain(torch.utils.data.IterableDataset):
        """The floor of any IterableDataset: the Loader's batches, ``torch.from_numpy``."""

        def __iter__(self) -> Any:
            return map(torch.from_numpy, make_loader(path, None))

    return {
        "Loader": lambda: epochs(lambda: make_loader(path, None), count),
        "ZarrIterableDataset, no DataLoader": lambda: epochs(
            lambda: ZarrIterableDataset(make_loader(path, None)), count
        ),
        "DataLoader floor: plain IterableDataset, 0 workers": lambda: epochs(
            lambda: torch.utils.data.DataLoader(Plain(), batch_size=None), count
        ),
        "DataLoader, 0 workers": torch_case(0),
        "DataLoader, 2 workers, fork": torch_case(2, "fork"),
        "DataLoader, 2 workers, fork, persistent": torch_case(2, "fork", True),
        "DataLoader, 2 workers, spawn": torch_case(2, "spawn"),
        "DataLoader, 2 workers, spawn, persistent": torch_case(2, "spawn", True),
        "heavy: Loader": lambda: epochs(lambda: make_loader(path, heavy), count),
        "heavy: DataLoader, 2 workers, fork, persistent": torch_case(2, "fork", True, heavy),
    }


def base(case: str) -> str:
    """The case ``case`` is compared with: the Loader alone (with the same transform)."""
    return "heavy: Loader" if case.startswith("heavy") else "Loader"


def run(options: argparse.Namespace) -> None:
    """Print the table: per case, epoch 1, later epochs, first batch, ratio to the Loader."""
    args = argparse.Namespace(
        epochs=options.epochs or EPOCHS, rounds=options.rounds or ROUNDS, data=Path(options.data)
    )
    args.data.mkdir(parents=True, exist_ok=True)
    path = dataset_path(args.data)
    match = options.match or ""
    every = cases(path, args.epochs)
    # the cases named by --match, and the Loader each is compared with
    chosen = {k for k in every if match in k}
    chosen |= {base(k) for k in chosen}
    runs = {k: v for k, v in every.items() if k in chosen}
    first: dict[str, list[float]] = {case: [] for case in runs}
    later: dict[str, list[float]] = {case: [] for case in runs}
    to_first: dict[str, list[float]] = {case: [] for case in runs}
    for _ in range(args.rounds):
        for case, run in runs.items():
            seconds, firsts = run()
            first[case].append(seconds[0])
            later[case] += seconds[1:]
            to_first[case] += firsts
    median = statistics.median
    print(
        f"{ROWS:,} x {FEATURES} float32, chunks of {CHUNK}, batch {BATCH}, buffered (8 chunks); "
        f"{args.epochs} epochs per DataLoader, medians of {args.rounds} rounds"
    )
    print("| case | epoch 1 (s) | later epochs (s) | to first batch (s) | later epochs vs Loader |")
    print("|---|---|---|---|---|")
    for case in runs:
        steady = median(later[case]) if later[case] else median(first[case])
        reference = base(case)
        ratio = (
            median(later[reference]) if later[reference] else median(first[reference])
        ) / steady
        print(
            f"| {case} | {median(first[case]):.2f} | {steady:.2f} | "
            f"{median(to_first[case]):.3f} | {ratio:.2f}x |"
        )
