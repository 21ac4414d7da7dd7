"""``python -m benchmarks``: every benchmark of this repository, one command line.

::

    python -m benchmarks                         # the suite: results.md, .json, .png
    python -m benchmarks --list                  # every benchmark, its options
    python -m benchmarks --only latency,shards --rounds 3 --latency 0.1
    python -m benchmarks compare main            # = --only compare --old main
    python -m benchmarks report [--check]        # docs/benchmarks.md's current numbers

:data:`BENCHMARKS` names each benchmark, the module and function that run it and
the options it reads.  Every option is shared (``--rows`` means rows in every
benchmark that has a dataset); an option left out takes each benchmark's own
default.  An option that no selected benchmark reads is refused, so a typo or a
forgotten ``--only`` does not run something else than asked.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .suite import ROOT

__all__ = ["BENCHMARKS", "DEFAULT", "Benchmark", "main", "parse"]


@dataclass(frozen=True)
class Benchmark:
    """One benchmark: ``module.function(options)`` runs it."""

    name: str
    module: str
    function: str
    summary: str
    #: the ``dest`` of every option it reads (``data`` is read by all that make data)
    options: tuple[str, ...]

    def run(self, options: argparse.Namespace) -> None:
        getattr(importlib.import_module(self.module), self.function)(options)


BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("suite", "benchmarks.suite.run", "run_suite",
              "every case against L0, zarr, dask and peers; targets; writes --out "
              "(results.md, results.json, throughput.png)",
              ("rows", "cols", "chunk_rows", "quick", "rounds", "out", "data", "no_cluster",
               "no_stores")),
    Benchmark("stores", "benchmarks.suite.run", "run_stores",
              "the suite's store cases alone: sharded, 20/100 ms latency, S3 loopback, "
              "codec pipelines, each against x[:] on the same store",
              ("rows", "cols", "chunk_rows", "rounds", "data")),
    Benchmark("cpu", "benchmarks.suite.run", "run_cpu",
              "issue 20: cpu-s/GB of L0 and every stream kind with zarrs and zarr's pipeline "
              "beside the raw-decode floor, the wall spread, and pinned to one core; medians "
              "of 8 rounds; targets; writes --out/cpu.md, cpu.json",
              ("rows", "cols", "chunk_rows", "rounds", "out", "data")),
    Benchmark("cpu-profile", "benchmarks.profile_cpu", "run",
              "issue 20: where the CPU of the sequential and buffered streams goes (zarrs and "
              "zarr's pipeline): yappi's CPU clock over --rounds epochs, sorted into decode, "
              "copies, reads, zarr, dask, this library; writes --out/cpu-profile.md",
              ("rows", "rounds", "out", "data")),
    Benchmark("big-samples", "benchmarks.suite.run", "run_big_samples",
              "181 x 360 float32 fields, 1/4/32 per chunk: sequential, buffered (64MiB) "
              "and exact vs L0, medians; targets; writes --out/big_samples.md",
              ("fields", "rounds", "out", "data")),
    Benchmark("patches", "benchmarks.suite.run", "run_patches",
              "issue 16: 64 x 64 patches (overlap 16) and forecast pairs over a (T, 721, 1440) "
              "field in two chunkings, against L0 and xbatcher; writes --out/patches.md",
              ("steps", "rounds", "out", "data")),
    Benchmark("cache", "benchmarks.suite.run", "run_cache",
              "the chunk cache: epoch 1 and 2 with a memory cache, a disk cache in a new "
              "process, on the local, 20/100 ms and S3 stores; the exact shuffle's store reads; "
              "writes --out/cache.md, cache.json",
              ("rows", "cols", "chunk_rows", "rounds", "out", "data")),
    Benchmark("collection", "benchmarks.suite.run", "run_collection",
              "50 stores of 20,000 rows (open_collection) vs one of 1,000,000: every "
              "stream kind, medians; opening 1,000 stores; writes --out/collection.md",
              ("rounds", "out", "data")),
    Benchmark("mixture", "benchmarks.suite.run", "run_mixture",
              "issue 18: mix() of two stores (400,000 and 200,000 rows) vs the same stores "
              "streamed alone, each batch stream kind, medians; writes --out/mixture.md",
              ("rounds", "out", "data")),
    Benchmark("todask", "benchmarks.suite.todask", "run",
              "issue 31: the exact shuffle's epoch as stream.to_dask() vs "
              "da.from_zarr(x)[perm] for the same permutation, tasks and medians; targets; "
              "writes --out/todask.md, todask.json",
              ("rows", "rounds", "out", "data")),
    Benchmark("peers", "benchmarks.suite.peers", "run",
              "issue 27: insitubatch and annbatch beside this library on the same stores "
              "(rows sequential and shuffled, forecast pairs, epoch two from each cache), "
              "each against L0 in the same rounds; needs the peers extra (Python >= 3.12); "
              "targets; issue 36: the same cases again from S3 on loopback with --latency "
              "(20 ms) added per request (--store local, s3 or all); writes "
              "--out/peers.md, peers.json",
              ("rows", "steps", "rounds", "store", "latency", "out", "data")),
    Benchmark("peers-cells", "benchmarks.suite.peers_cells", "run",
              "issue 37: sparse single cells (annbatch's write_sharded CSR, 20,000 x 8,000, "
              "300 non-zeros a cell): sequential and shuffled 'auto' beside annbatch's "
              "Loader (defaults, speed settings), each against L0 in the same rounds; needs "
              "the peers extra; targets; writes --out/peers_cells.md, peers_cells.json",
              ("rows", "rounds", "out", "data")),
    Benchmark("quality", "benchmarks.suite.quality", "run",
              "issue 18: planned shuffle quality vs buffer size with the auto choice "
              "(docs/quality_vs_buffer.png), and the first buffered batch beside x[a:b] "
              "over its chunks, local and on a 20 ms store; writes --out/quality.md",
              ("rounds", "out", "data")),
    Benchmark("quality-training", "benchmarks.suite.quality_training", "run",
              "issue 28: sorted digits (scikit-learn), an MLP trained through every shuffle "
              "mode (sequential, buffers, auto, exact, write_shuffled + buffer): held-out "
              "accuracy against batch mixing, label mixing and epoch time "
              "(docs/quality_training.png); writes --out/quality_training.md",
              ("epochs", "out")),
    Benchmark("writes", "benchmarks.suite.run", "run_writes",
              "issue 19: map_to_zarr vs x.map_blocks(f).to_zarr(out), locally and on a "
              "LocalCluster, a resume after an interruption at half, write_shuffled vs the "
              "exact shuffle; writes --out/writes.md",
              ("rows", "rounds", "out", "data", "no_cluster")),
    Benchmark("exact-sweep", "benchmarks.suite.memory", "run_sweep",
              "the exact shuffle's peak RSS per memory budget (4 MiB to 1 GiB), "
              "a fresh process each",
              ("data",)),
    Benchmark("scale", "benchmarks.scale", "run",
              "issue 39: first batch, plan_epoch and peak RSS per mode at 1e7, 1e8, 1e9 "
              "samples (nothing written, a fresh process each) beside numpy's permutation; "
              "writes --out/scale.md, scale.json",
              ("rows", "out")),
    Benchmark("latency", "benchmarks.latency", "run",
              "chunk streams, map/reduce and batch streams on a store sleeping before "
              "each get; --old REF beside an earlier commit; --sweep io_concurrency",
              ("latency", "rounds", "rows", "sharded", "old", "sweep", "data")),
    Benchmark("shards", "benchmarks.shards", "run",
              "sharded vs unsharded arrays, each stream kind, with and without latency",
              ("rows", "cols", "chunk_rows", "per_shard", "latency", "rounds")),
    Benchmark("codec-pipelines", "benchmarks.codec_pipelines", "run",
              "zarr-python's codec pipeline against zarrs' beside the raw decode limit",
              ("rows", "rounds", "data")),
    Benchmark("cluster", "benchmarks.cluster", "run",
              "local threads vs a LocalCluster: a shuffled epoch and feature moments; issue 40: "
              "each per-chunk job vs dask's own graph on the cluster, 1 and 4 MiB chunks",
              ("rows", "workers", "rounds", "match")),
    Benchmark("cluster-profile", "benchmarks.profile_cluster", "run",
              "where a LocalCluster epoch's time goes: worker reads, waiting, batch cutting",
              ("rows", "rounds", "data")),
    Benchmark("ramp-latency", "benchmarks.ramp_latency", "run",
              "sequential and buffered streams with the fast-start ramp on and off, "
              "on a store with latency",
              ("latency", "rounds", "rows", "sharded", "data")),
    Benchmark("torch-workers", "benchmarks.torch_workers", "run",
              "what DataLoader workers cost beside the Loader alone (fork, spawn, persistent)",
              ("epochs", "rounds", "match", "data")),
    Benchmark("jax", "benchmarks.devices", "run",
              "issues 29, 38: JaxLoader over 8 CPU devices and torch's device path against "
              "the hand-written loops they replace; writes --out/jax.md",
              ("rows", "rounds", "out", "data")),
    Benchmark("defaults", "benchmarks.defaults", "run",
              "sequential window size x prefetch against L0; writes --out/defaults.md",
              ("rows", "cols", "chunk_rows", "rounds", "out", "data")),
    Benchmark("report", "benchmarks.suite.summary", "run",
              "docs/benchmarks.md's current numbers, generated from --out's results files "
              "(also: python -m benchmarks report); --check: exit 1 if the page differs",
              ("out", "check")),
    Benchmark("compare", "benchmarks.compare", "run",
              "this checkout's library against --old REF's, side by side in one process "
              "(also: python -m benchmarks compare REF)",
              ("old", "rounds", "rows", "cluster", "first_batch", "data")),
)  # fmt: skip

#: what runs without ``--only``
DEFAULT = ("suite",)

BY_NAME = {benchmark.name: benchmark for benchmark in BENCHMARKS}


def parser() -> argparse.ArgumentParser:
    """The command line; every option defaults to None or False ("the benchmark's own")."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Benchmarks of daskzarr_batches (docs/benchmarks.md).",
        epilog="python -m benchmarks compare REF [...] is --only compare --old REF [...]; "
        "python -m benchmarks report [--check] is --only report [--check].",
    )
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    parser.add_argument("--only", help="comma-separated benchmarks to run (default: suite)")
    parser.add_argument(
        "--data",
        type=Path,
        default=ROOT / "benchmarks" / "data",
        help="where generated datasets are kept (made once; default benchmarks/data)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=ROOT / "benchmarks" / "results",
        help="where result files go (default benchmarks/results)",
    )
    size = parser.add_argument_group("sizes and rounds (each benchmark has its own defaults)")
    size.add_argument("--rows", type=int, help="rows of the dataset")
    size.add_argument("--cols", type=int, help="columns (features) of the dataset")
    size.add_argument("--chunk-rows", type=int, help="rows per chunk")
    size.add_argument("--rounds", "--repeats", type=int, help="interleaved rounds")
    size.add_argument("--steps", type=int, help="patches, peers: time steps of the field (64)")
    size.add_argument("--quick", action="store_true", help="suite: small dataset, 2 rounds")
    cases = parser.add_argument_group("what to measure")
    cases.add_argument("--latency", type=float, help="seconds a store waits before each get")
    cases.add_argument(
        "--store", choices=("local", "s3", "all"),
        help="peers: the local stores, copies on S3 on loopback, or both (all, the default)",
    )  # fmt: skip
    cases.add_argument("--sharded", action="store_true", help="8 chunks per shard")
    cases.add_argument("--per-shard", type=int, help="shards: chunks per shard (8)")
    cases.add_argument("--sweep", action="store_true", help="latency: per io_concurrency")
    cases.add_argument("--old", metavar="REF", help="an earlier commit to run beside this one")
    cases.add_argument("--cluster", action="store_true", help="compare: on a LocalCluster")
    cases.add_argument("--first-batch", action="store_true", help="compare: time to first batch")
    cases.add_argument(
        "--check", action="store_true", help="report: exit 1 if docs/benchmarks.md differs"
    )
    cases.add_argument("--fields", type=int, help="big-samples: fields per array (768)")
    cases.add_argument("--workers", type=int, help="cluster: worker processes (2)")
    cases.add_argument(
        "--epochs", type=int,
        help="torch-workers: epochs per DataLoader (3); quality-training: epochs (8)",
    )  # fmt: skip
    cases.add_argument(
        "--match", help="torch-workers, cluster: only cases whose name contains this"
    )
    cases.add_argument(
        "--no-cluster", action="store_true", help="suite, writes: no LocalCluster cases"
    )
    cases.add_argument(
        "--no-stores", action="store_true", help="suite: no sharded/latency/S3/codec cases"
    )
    return parser


def parse(argv: Sequence[str]) -> tuple[list[Benchmark], argparse.Namespace]:
    """The benchmarks to run and their options; ``compare REF`` is ``--only compare --old REF``."""
    argv = list(argv)
    if argv[:1] == ["report"]:
        argv = ["--only", "report", *argv[1:]]
    if argv[:1] == ["compare"]:
        if len(argv) < 2 or argv[1].startswith("-"):
            parser().error("compare needs the earlier commit: compare REF [options]")
        argv = ["--only", "compare", "--old", argv[1], *argv[2:]]
    command = parser()
    options = command.parse_args(argv)
    names = DEFAULT if options.only is None else tuple(filter(None, options.only.split(",")))
    unknown = [name for name in names if name not in BY_NAME]
    if unknown or not names:
        command.error(
            f"no benchmark {', '.join(unknown)!r}; --list shows them: {', '.join(BY_NAME)}"
        )
    chosen = [BY_NAME[name] for name in names]
    read = {option for benchmark in chosen for option in benchmark.options}
    unread = [
        name
        for name, value in vars(options).items()
        if name not in {"list", "only", "data", "out"}
        and value not in (None, False)
        and name not in read
    ]
    if unread:
        flags = ", ".join("--" + name.replace("_", "-") for name in unread)
        command.error(f"{flags}: not an option of {', '.join(names)} (--list shows which are)")
    if any(b.name == "compare" for b in chosen) and options.old is None:
        command.error("compare needs --old REF (or: python -m benchmarks compare REF)")
    return chosen, options


def listing() -> str:
    """``--list``: each benchmark, what it measures and the options it reads."""
    lines = []
    for benchmark in BENCHMARKS:
        default = " (default)" if benchmark.name in DEFAULT else ""
        flags = " ".join("--" + option.replace("_", "-") for option in benchmark.options)
        lines += [f"{benchmark.name}{default}", f"    {benchmark.summary}", f"    {flags}"]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    chosen, options = parse(sys.argv[1:] if argv is None else argv)
    if options.list:
        print(listing())
        return
    for benchmark in chosen:
        if len(chosen) > 1:
            print(f"\n== {benchmark.name} ==", flush=True)
        benchmark.run(options)
