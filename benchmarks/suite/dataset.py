"""The generated dataset: float32 ``features`` + int64 ``labels`` in one Zarr group."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zarr

MiB = 2**20


def default_shape(quick: bool) -> tuple[int, int, int]:
    """``(rows, cols, chunk_rows)`` of the dataset when the command line gives none."""
    return (250_000, 64, 8192) if quick else (1_000_000, 64, 8192)


@dataclass(frozen=True)
class Dataset:
    path: Path
    rows: int
    cols: int
    chunk_rows: int

    @property
    def features(self) -> zarr.Array:
        return zarr.open_array(self.path / "features", mode="r")

    @property
    def labels(self) -> zarr.Array:
        return zarr.open_array(self.path / "labels", mode="r")

    @property
    def feature_bytes(self) -> int:
        return self.rows * self.cols * 4

    @property
    def row_bytes(self) -> int:
        return self.cols * 4


def make_dataset(data_dir: Path, rows: int, cols: int, chunk_rows: int) -> Dataset:
    """Create (once) a group with ``features`` (float32) and ``labels`` (int64)."""
    path = data_dir / f"x{rows}_c{cols}_r{chunk_rows}.zarr"
    dataset = Dataset(path, rows, cols, chunk_rows)
    done = path / "complete"
    if done.exists():
        return dataset
    started = time.perf_counter()
    group = zarr.open_group(path, mode="w")
    x = group.create_array("features", shape=(rows, cols), chunks=(chunk_rows, cols), dtype="f4")
    y = group.create_array("labels", shape=(rows,), chunks=(chunk_rows,), dtype="i8")
    rng = np.random.default_rng(0)
    step = chunk_rows * max(1, (64 * MiB) // (chunk_rows * cols * 4))
    for lo in range(0, rows, step):
        hi = min(rows, lo + step)
        x[lo:hi] = rng.standard_normal((hi - lo, cols), dtype=np.float32)
        y[lo:hi] = np.arange(lo, hi)
    done.write_text("ok")
    print(f"generated {path} in {time.perf_counter() - started:.1f} s", flush=True)
    return dataset


def make_sharded(ds: Dataset, shard_chunks: int = 8) -> Dataset:
    """Create (once) a copy of ``ds`` with ``shard_chunks`` inner chunks per Zarr v3 shard.

    Same chunks and codec (zarr's default) as ``ds``; the shards run along the rows,
    so a shard holds ``shard_chunks * chunk_rows`` rows (the last one is partial).
    """
    path = ds.path.with_name(f"{ds.path.stem}_s{shard_chunks}.zarr")
    sharded = Dataset(path, ds.rows, ds.cols, ds.chunk_rows)
    done = path / "complete"
    if done.exists():
        return sharded
    started = time.perf_counter()
    group = zarr.open_group(path, mode="w")
    shard_rows = shard_chunks * ds.chunk_rows
    for name, source in (("features", ds.features), ("labels", ds.labels)):
        copy = group.create_array(
            name,
            shape=source.shape,
            chunks=source.chunks,
            shards=(shard_rows, *source.shape[1:]),
            dtype=source.dtype,
        )
        step = shard_rows * max(1, (64 * MiB) // (shard_rows * ds.row_bytes))
        for lo in range(0, ds.rows, step):
            copy[lo : lo + step] = source[lo : lo + step]
    done.write_text("ok")
    print(f"generated {path} in {time.perf_counter() - started:.1f} s", flush=True)
    return sharded
