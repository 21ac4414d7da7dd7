"""Every stream kind against zarr's own ``x[:]`` on a store that sleeps before each get.

An object store answers each request after tens of milliseconds; a wrapper store
that sleeps ``--latency`` seconds before every chunk ``get`` of a local store
stands for one.  Each round runs every case once, interleaved, in this process,
and the table shows each case's median time as a ratio of throughput to the
round's ``x[:]`` (zarr's own concurrent read of the whole array, on the same
wrapped store; ``--latency 0`` reads the local store itself, unwrapped)::

    python benchmarks/latency.py --latency 0.02 --rounds 5
    python benchmarks/latency.py --latency 0.1 --rounds 3
    python benchmarks/latency.py --latency 0 --old main   # local: this tree vs main's library
    python benchmarks/latency.py --latency 0.02 --sharded # 8 chunks per shard
    python benchmarks/latency.py --latency 0.1 --sweep    # chunk_stream per io_concurrency

``--old REF`` runs the chunk-stream cases of the library as of ``REF`` beside
this tree's (``benchmarks/compare.py`` extracts it).  The dataset (600,000 x 64
float32 in 8192-row chunks, Zarr's default codecs) is generated once under
``--data``.
"""

from __future__ import annotations

import argparse
import asyncio
import operator
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import zarr
import zarr.storage
from zarr.abc.store import ByteRequest
from zarr.core.buffer import Buffer, BufferPrototype

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import daskzarr_batches as current  # noqa: E402
from benchmarks.compare import load_baseline  # noqa: E402

METADATA = ("zarr.json", ".zarray", ".zattrs", ".zgroup")


class LatencyStore(zarr.storage.WrapperStore[Any]):
    """Sleeps ``delay`` seconds before every chunk get; counts gets and peak in flight."""

    def __init__(self, store: Any, delay: float, state: dict[str, int] | None = None) -> None:
        super().__init__(store)
        self.delay = delay
        self.state = {"now": 0, "peak": 0, "gets": 0} if state is None else state

    def _with_store(self, store: Any) -> LatencyStore:
        return type(self)(store, self.delay, self.state)

    async def get(
        self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        if key.rsplit("/", 1)[-1] in METADATA:
            return await self._store.get(key, prototype, byte_range)
        self.state["now"] += 1  # on zarr's single event loop: no lock needed
        self.state["gets"] += 1
        self.state["peak"] = max(self.state["peak"], self.state["now"])
        try:
            if self.delay:
                await asyncio.sleep(self.delay)
            return await self._store.get(key, prototype, byte_range)
        finally:
            self.state["now"] -= 1

    async def get_partial_values(self, prototype: BufferPrototype, key_ranges: Any) -> Any:
        ranges = list(key_ranges)
        return await asyncio.gather(*(self.get(k, prototype, r) for k, r in ranges))


def make_data(data_dir: Path, rows: int, sharded: bool) -> Path:
    """600,000 x 64 float32 in 8192-row chunks (optionally 8 chunks per shard), once."""
    path = data_dir / f"latency_x{rows}{'_sharded' if sharded else ''}.zarr"
    if (path / "complete").exists():
        return path
    x = zarr.create_array(
        path,
        shape=(rows, 64),
        chunks=(8192, 64),
        shards=(8 * 8192, 64) if sharded else None,
        dtype="f4",
        overwrite=True,
    )
    rng = np.random.default_rng(0)
    for lo in range(0, rows, 8 * 8192):
        hi = min(rows, lo + 8 * 8192)
        x[lo:hi] = rng.standard_normal((hi - lo, 64), dtype=np.float32)
    (path / "complete").write_text("ok")
    return path


def drain(stream: Any) -> None:
    with stream:
        for _ in stream:
            pass


def cases(dzb: ModuleType, x: zarr.Array, prefix: str, old: bool) -> dict[str, Callable[[], Any]]:
    """The stream kinds on ``x``; ``old``: a library without ``io_concurrency``."""
    buffer = 8 * x.chunks[0]
    chunk: dict[str, Any] = {}
    return {
        f"{prefix}chunk_stream ordered": lambda: drain(dzb.chunk_stream(x, **chunk)),
        f"{prefix}chunk_stream unordered": lambda: drain(
            dzb.chunk_stream(x, ordered=False, **chunk)
        ),
        f"{prefix}map_chunks(np.sum)": lambda: drain(dzb.map_chunks(np.sum, x, **chunk)),
        f"{prefix}reduce_chunks(np.sum, add)": lambda: dzb.reduce_chunks(
            np.sum, operator.add, x, **chunk
        ),
        f"{prefix}batch_stream, batch 256": lambda: drain(dzb.batch_stream(x, 256)),
        f"{prefix}buffered (8 chunks), batch 256": lambda: drain(
            dzb.shuffled_batch_stream(x, 256, seed=0, shuffle_buffer_size=buffer)
        ),
    }


def timed(function: Callable[[], Any]) -> tuple[float, float]:
    """Wall seconds and this process's CPU seconds (all threads) of one call."""
    started, cpu = time.perf_counter(), time.process_time()
    function()
    return time.perf_counter() - started, time.process_time() - cpu


def run(args: argparse.Namespace, baseline: ModuleType | None) -> str:
    path = make_data(args.data, args.rows, args.sharded)
    state = {"now": 0, "peak": 0, "gets": 0}
    local = zarr.storage.LocalStore(path, read_only=True)
    # no latency: the local store itself (a wrapper store is not known to be local)
    store = local if args.latency == 0 else LatencyStore(local, args.latency, state)
    x = zarr.open_array(store=store, mode="r")
    table: dict[str, Callable[[], Any]] = {"zarr x[:]": lambda: x[:]}
    if args.sweep:
        for io in (2, 4, 8, 16, 32):
            table[f"chunk_stream, io_concurrency={io}"] = lambda io=io: drain(
                current.chunk_stream(x, io_concurrency=io)
            )
            table[f"map_chunks(np.sum), io_concurrency={io}"] = lambda io=io: drain(
                current.map_chunks(np.sum, x, io_concurrency=io)
            )
    else:
        table.update(cases(current, x, "", old=False))
    if baseline is not None:
        table.update(cases(baseline, x, "old: ", old=True))
    seconds: dict[str, list[float]] = {name: [] for name in table}
    cpu: dict[str, list[float]] = {name: [] for name in table}
    peaks: dict[str, int] = {}
    names = list(table)
    for round_number in range(args.rounds):
        order = names if round_number % 2 == 0 else names[:1] + names[:0:-1]
        for name in order:
            state["peak"] = 0
            wall, used = timed(table[name])
            seconds[name].append(wall)
            cpu[name].append(used)
            peaks[name] = max(peaks.get(name, 0), state["peak"])
    reference = statistics.median(seconds["zarr x[:]"])
    mb = x.nbytes / 1e6
    kind = "sharded (8 chunks per shard)" if args.sharded else "unsharded"
    lines = [
        f"{args.rows:,} x 64 float32, 8192-row chunks, {kind}, {args.latency * 1e3:.0f} ms "
        f"before each get, {args.rounds} rounds; zarr x[:] median {reference:.3f} s "
        f"({mb / reference:.0f} MB/s)",
        "",
        "| case | median s | MB/s | vs x[:] | CPU s (median) | peak gets in flight |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name in names:
        median = statistics.median(seconds[name])
        lines.append(
            f"| {name} | {median:.3f} | {mb / median:.0f} | {reference / median:.2f}x "
            f"| {statistics.median(cpu[name]):.2f} | {peaks[name] if args.latency else '-'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.02, help="seconds before each get")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rows", type=int, default=600_000)
    parser.add_argument("--sharded", action="store_true", help="8 chunks per shard")
    parser.add_argument("--old", help="also run the library as of this git ref")
    parser.add_argument(
        "--sweep", action="store_true", help="chunk_stream and map_chunks per io_concurrency"
    )
    parser.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "dzb-latency")
    args = parser.parse_args(argv)
    args.data.mkdir(parents=True, exist_ok=True)
    if args.old is None:
        print(run(args, None))
        return
    with tempfile.TemporaryDirectory() as tmp:
        print(run(args, load_baseline(args.old, Path(tmp))))


if __name__ == "__main__":
    main()
