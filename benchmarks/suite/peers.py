"""The peers beside this library (issue 27): insitubatch and annbatch on the same data.

``python -m benchmarks --only peers [--rows N] [--steps N] [--rounds N]`` needs the
``peers`` extra (Python >= 3.12: insitubatch 0.2, annbatch 0.3, zarr >= 3.3).  It writes,
once under ``--data``:

- **rows**: an AnnData store written by annbatch's own writer (``annbatch.write_sharded``:
  Zarr v3, blosc lz4, its default compressor) whose ``X`` is ``ROWS`` x ``COLS`` float32
  in ``CHUNK_ROWS``-row chunks inside ``SHARD_ROWS``-row shards;
- **field**: a ``(steps, 361, 720)`` float32 field (issue 16's moving pattern plus noise,
  zstd), one time step per chunk.

and measures, in interleaved rounds (each case once per round, the order rotated):

- **L0** of each store: zarr-python reading every stored chunk (shard) once, in order,
  on one thread -- the reference every case is divided by (medians of the same rounds);
- **rows, sequential**: ``batch_stream(x, 256)``; insitubatch's ``all`` view
  (``shuffle=False``); annbatch's ``Loader(shuffle=False)``;
- **rows, shuffled**: ``shuffled_batch_stream(x, 256, shuffle_buffer_size=...)`` (a
  buffer of ``SHUFFLE_ROWS`` rows); insitubatch's ``train`` view (its defaults:
  ``block_chunks=16`` stored chunks, the shards); annbatch's ``Loader(shuffle=True)``
  holding the same ``SHUFFLE_ROWS`` rows (``preload_nchunks`` chunks of ``chunk_size``
  rows);
- **forecast pairs** (x at t, y at t + 1, batches of 4): ``patch_stream(z, {0: 1}, 4,
  target_offset={0: 1})`` sequential and buffered (``BLOCK`` steps), insitubatch with the
  target declared as ``geometry.shift(1)`` (``all`` and the shuffled ``train`` view,
  ``block_chunks=BLOCK``); annbatch has no N-D windows;
- **epoch two from each cache**: the shuffled rows and the buffered pairs again, from this
  library's ``ChunkCache`` holding the array and from insitubatch's pool (its cache across
  epochs, ``cache_budget_bytes`` holding the array), each filled by one epoch before the
  rounds; annbatch keeps no chunks between epochs;
- a diagnostic without a target: the pairs' inputs alone (``batch_stream(z, 4)``,
  insitubatch with the one variable), what pairing costs each reader.

Each peer is used as its documentation says it is fastest: annbatch through
``zarrs.ZarrsCodecPipeline`` ("necessary for local filesystem performance") with
``chunk_size`` the stored chunk, insitubatch over ``obstore_store("file://...")`` with
one dataset per epoch (a new pool; epoch two reuses one), and this library through
``open_array`` (zarrs' pipeline when it is installed, as documented; a bare
``zarr.Array`` is decoded by zarr-python's, about half as fast here).  L0 is
zarr-python's pipeline, as in every suite case.  Results: ``<out>/peers.md`` and
``peers.json``; the targets: ahead of each peer (a higher ratio to L0, i.e. a shorter
median epoch) in every shape both support.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib.metadata import version
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.codecs import ZstdCodec

import daskzarr_batches as dzb

from .patch_cases import field_step, l0_chunks

ROWS = 131_072
COLS = 256
CHUNK_ROWS = 512
SHARD_ROWS = 8_192
BATCH = 256
#: rows a shuffled epoch holds to mix (this library's buffer, annbatch's preload)
SHUFFLE_ROWS = 16 * CHUNK_ROWS
#: time steps of the field by default (``--steps``): 64 x 1.04 MB decoded
STEPS = 64
GRID = (361, 720)
PAIR_BATCH = 4
#: the time steps a shuffled pair epoch mixes (insitubatch's default ``block_chunks``)
BLOCK = 16
ROUNDS = 5

ROWS_STORE, FIELD_STORE = "rows", "pairs"
THIS, INSITU, ANN = "daskzarr_batches", "insitubatch", "annbatch"
PEERS = (INSITU, ANN)
L0 = "L0: zarr, every chunk once, 1 thread"
#: the shapes of each store, in report order
SHAPE_NAMES = ("sequential", "shuffled", "shuffled, epoch two from the cache")
#: no target: the inputs of the pairs alone (one field per sample, no ``t + 1``), so that
#: the table shows what pairing costs each reader on top of reading the same chunks
INPUTS_ALONE = "inputs alone, sequential (diagnostic)"


def shapes(tag: str = "") -> tuple[tuple[str, str], ...]:
    """``(store, shape)`` of the stores named with ``tag`` (``""``: local), report order."""
    return tuple((store + tag, shape) for store in (ROWS_STORE, FIELD_STORE)
                 for shape in SHAPE_NAMES)  # fmt: skip


#: the local stores' shapes, and the diagnostic
SHAPES = shapes()
DIAGNOSTICS = ((FIELD_STORE, INPUTS_ALONE),)


def tags_of(results: dict[str, Any]) -> list[str]:
    """The settings a run measured: ``""`` (local) and the S3 one's tag (older runs: local)."""
    return list(results.get("tags", [""]))


#: the peers' warnings about each other, not about this benchmark (as in
#: tests/integration/test_peers.py):
#: anndata reads pandas' deprecated option, annbatch consolidates Zarr v3 metadata
PEER_WARNINGS = (
    "The 'future.infer_string' option is deprecated",
    "Consolidated metadata is currently not part",
)


def case_name(store: str, shape: str, who: str) -> str:
    """``[rows] shuffled: annbatch``."""
    return f"[{store}] {shape}: {who}"


# --------------------------------------------------------------------------
# The data


def make_rows(data_dir: Path, rows: int) -> Path:
    """annbatch's AnnData store of ``rows`` x ``COLS`` standard normals (written once)."""
    import annbatch
    import anndata as ad
    import pandas as pd

    path = data_dir / f"peers_rows_{rows}_c{COLS}_r{CHUNK_ROWS}_s{SHARD_ROWS}.zarr"
    done = path / "complete"
    if not done.exists():
        values = np.random.default_rng(0).standard_normal((rows, COLS), dtype=np.float32)
        adata = ad.AnnData(
            X=values,
            obs=pd.DataFrame(index=[f"cell{i}" for i in range(rows)]),
            var=pd.DataFrame(index=[f"gene{j}" for j in range(COLS)]),
        )
        group = zarr.open_group(path, mode="w", zarr_format=3)
        annbatch.write_sharded(
            group, adata, n_obs_per_chunk=min(CHUNK_ROWS, rows), shard_size=min(SHARD_ROWS, rows)
        )
        done.write_text("ok")
    return path


def make_field(data_dir: Path, steps: int) -> Path:
    """A group holding ``field``: ``(steps, *GRID)`` float32, one step per chunk, zstd."""
    path = data_dir / f"peers_field_{steps}_{GRID[0]}x{GRID[1]}.zarr"
    done = path / "complete"
    if not done.exists():
        group = zarr.open_group(path, mode="w", zarr_format=3)
        z = group.create_array(
            "field", shape=(steps, *GRID), chunks=(1, *GRID), dtype="f4",
            compressors=ZstdCodec(level=3),
        )  # fmt: skip
        for t in range(steps):
            z[t] = field_step(t, GRID)
        done.write_text("ok")
    return path


# --------------------------------------------------------------------------
# One epoch of each reader: (stored bytes, samples)


#: one epoch: (stored bytes, samples, what it read: chunk reads, amplification, cache hits)
Epoch = Callable[[], tuple[int, int, dict[str, float]]]


def l0_shards(x: zarr.Array) -> tuple[int, int, dict[str, float]]:
    """Every shard of ``x`` read once, in order: each stored chunk decoded once."""
    rows = (x.shards or x.chunks)[0]
    for lo in range(0, x.shape[0], rows):
        x[lo : lo + rows]
    return x.nbytes, x.shape[0], {}


def this_epoch(make: Callable[[], Any], nbytes: int) -> Epoch:
    """An epoch of a stream of this library (batches, or (inputs, targets) pairs)."""

    def run() -> tuple[int, int, dict[str, float]]:
        samples = 0
        with make() as stream:
            for item in stream:
                samples += len(item[0] if isinstance(item, tuple) else item)
        stats = stream.stats
        return nbytes, samples, {
            "chunk reads": stats.chunks_read, "read amplification": stats.read_amplification,
            "cache hits": stats.cache_hits,
        }  # fmt: skip

    return run


def insitu_pass(view: Iterable[Any], label: str) -> int:
    """Samples of one pass over an insitubatch split view."""
    return sum(len(batch.arrays[label]) for batch in view)


def pool_counts(ds: Any) -> dict[str, float]:
    """An insitubatch dataset's last epoch: chunks fetched and decoded, and pool hits."""
    return {"chunk reads": ds.cache_misses, "cache hits": ds.cache_hits}


@dataclass
class Insitu:
    """insitubatch over one store: its store, geometries and split, opened once."""

    url: str
    variables: dict[str, tuple[str, int]]  # label -> (array, offset)
    batch: int
    block_chunks: int | None = None
    #: obstore's ``from_url`` keywords (an S3 endpoint's)
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        import insitubatch

        self.store = insitubatch.obstore_store(self.url, **self.options)
        arrays = {name for name, _ in self.variables.values()}
        opened = insitubatch.open_geometries(self.store, variables=sorted(arrays))
        self.geometries = {
            label: opened[name].shift(offset) if offset else opened[name]
            for label, (name, offset) in self.variables.items()
        }
        first = next(iter(self.geometries.values()))
        offsets = [offset for _, offset in self.variables.values()]
        lo, hi = insitubatch.valid_anchor_range(offsets, first.n_samples)
        self.manifest = insitubatch.split_by_chunk(
            first, fractions=(1.0, 0.0, 0.0), sample_range=(lo, hi)
        )
        self.label = next(iter(self.geometries))

    def dataset(self, shuffle: bool, cache_budget_bytes: int | None = None) -> Any:
        import insitubatch

        kwargs: dict[str, Any] = {}
        if self.block_chunks is not None:
            kwargs["block_chunks"] = self.block_chunks
        if cache_budget_bytes is not None:
            kwargs["cache_budget_bytes"] = cache_budget_bytes
        return insitubatch.InSituDataset(
            self.store, self.manifest, geometries=self.geometries, batch_size=self.batch,
            shuffle=shuffle, seed=0, **kwargs,
        )  # fmt: skip

    def epoch(self, shuffle: bool, nbytes: int) -> Epoch:
        """A new dataset (an empty pool) and one pass: ``train`` shuffled, else ``all``."""

        def run() -> tuple[int, int, dict[str, float]]:
            ds = self.dataset(shuffle)
            try:
                samples = insitu_pass(ds.train if shuffle else ds.all, self.label)
                return nbytes, samples, pool_counts(ds)
            finally:
                ds.close()

        return run

    def warm(self, cache_budget_bytes: int, nbytes: int) -> tuple[Any, Epoch]:
        """One dataset whose pool holds the array (one epoch run now), and its next epochs."""
        ds = self.dataset(True)  # its automatic budget: the working-set floor
        if ds.cache_budget_bytes < cache_budget_bytes:
            ds.close()
            ds = self.dataset(True, cache_budget_bytes)
        insitu_pass(ds.train, self.label)
        epochs = iter(range(1, 1_000_000))

        def run() -> tuple[int, int, dict[str, float]]:
            ds.set_epoch(next(epochs))
            return nbytes, insitu_pass(ds.train, self.label), pool_counts(ds)

        return ds, run


def annbatch_epoch(path: Path, shuffle: bool, nbytes: int) -> Epoch:
    """A new annbatch ``Loader`` over ``X`` read through zarrs' pipeline, one epoch."""
    import annbatch
    import anndata as ad

    zarrs = {"codec_pipeline.path": "zarrs.ZarrsCodecPipeline"} if find_spec("zarrs") else {}
    with zarr.config.set(zarrs):  # annbatch: "necessary for local filesystem performance"
        x = zarr.open_group(path, mode="r")["X"]
    assert isinstance(x, zarr.Array)
    chunk = x.chunks[0]
    rng = np.random.default_rng(0)

    def run() -> tuple[int, int, dict[str, float]]:
        loader = annbatch.Loader(
            chunk_size=chunk, preload_nchunks=max(SHUFFLE_ROWS // chunk, 1), batch_size=BATCH,
            shuffle=shuffle, rng=rng, preload_to_gpu=False,
        ).add_adata(ad.AnnData(X=x))  # fmt: skip
        return nbytes, sum(len(batch["X"]) for batch in loader), {}

    return run


# --------------------------------------------------------------------------
# Measuring


@dataclass
class Where:
    """The two stores as one setting's readers open them: local directories or S3."""

    #: ``""`` locally, ``", S3 20 ms"`` on S3: the stores are named ``rows`` + tag, ...
    tag: str
    x: zarr.Array  # L0's, zarr-python on the store
    z: zarr.Array
    xd: Any  # this library's (``open_array``)
    zd: Any
    rows_url: str  # insitubatch's
    field_url: str
    insitu_options: dict[str, Any]
    rows_path: Path | None = None  # annbatch's (local files only)

    @property
    def rows(self) -> str:
        return ROWS_STORE + self.tag

    @property
    def field(self) -> str:
        return FIELD_STORE + self.tag


def local(rows_path: Path, field_path: Path) -> Where:
    """The local stores; this library as its documentation opens an array (``open_array``,
    zarrs when installed)."""
    x = zarr.open_group(rows_path, mode="r")["X"]
    z = zarr.open_group(field_path, mode="r")["field"]
    assert isinstance(x, zarr.Array) and isinstance(z, zarr.Array)
    return Where("", x, z, dzb.open_array(x), dzb.open_array(z), rows_path.as_uri(),
                 field_path.as_uri(), {}, rows_path)  # fmt: skip


def cases(where: Where) -> tuple[dict[str, Epoch], list[Any], dict[str, int]]:
    """Every case's epoch, the warm insitubatch datasets (to close) and each store's bytes."""
    x, z, xd, zd = where.x, where.z, where.xd, where.zd
    rows_store, field_store = where.rows, where.field
    nbytes = {rows_store: int(x.nbytes), field_store: int(z.nbytes)}
    xb, zb = nbytes[rows_store], nbytes[field_store]
    url, more = where.field_url, where.insitu_options
    rows_insitu = Insitu(where.rows_url, {"X": ("X", 0)}, BATCH, options=more)
    pairs_insitu = Insitu(url, {"x": ("field", 0), "y": ("field", 1)}, PAIR_BATCH, BLOCK, more)
    inputs_insitu = Insitu(url, {"x": ("field", 0)}, PAIR_BATCH, BLOCK, more)
    budget = 2 * max(xb, zb) + (1 << 26)
    rows_warm, rows_warm_epoch = rows_insitu.warm(budget, xb)
    pairs_warm, pairs_warm_epoch = pairs_insitu.warm(budget, zb)
    rows_cache, pairs_cache = dzb.ChunkCache(budget), dzb.ChunkCache(budget)
    epoch_two = iter(range(1, 1_000_000)), iter(range(1, 1_000_000))

    def rows_shuffled(**kwargs: Any) -> Any:
        return dzb.shuffled_batch_stream(xd, BATCH, seed=0, shuffle_buffer_size=SHUFFLE_ROWS,
                                         **kwargs)  # fmt: skip

    def pairs(**kwargs: Any) -> Any:
        return dzb.patch_stream(zd, {0: 1}, PAIR_BATCH, target_offset={0: 1}, **kwargs)

    def pairs_shuffled(**kwargs: Any) -> Any:
        return pairs(shuffle=True, shuffle_buffer_size=BLOCK, **kwargs)

    this_epoch(lambda: rows_shuffled(cache=rows_cache), xb)()  # the caches filled once
    this_epoch(lambda: pairs_shuffled(cache=pairs_cache), zb)()
    seq, shuf, two = SHAPE_NAMES
    rows, field = rows_store, field_store
    epochs: dict[str, Epoch] = {
        l0_name(rows): lambda: l0_shards(x),
        case_name(rows, seq, THIS): this_epoch(lambda: dzb.batch_stream(xd, BATCH), xb),
        case_name(rows, seq, INSITU): rows_insitu.epoch(False, xb),
        case_name(rows, shuf, THIS): this_epoch(rows_shuffled, xb),
        case_name(rows, shuf, INSITU): rows_insitu.epoch(True, xb),
        case_name(rows, two, THIS): this_epoch(
            lambda: rows_shuffled(cache=rows_cache, epoch=next(epoch_two[0])), xb),
        case_name(rows, two, INSITU): rows_warm_epoch,
        l0_name(field): lambda: (l0_chunks(z)[0], z.shape[0], {}),
        case_name(field, seq, THIS): this_epoch(pairs, zb),
        case_name(field, seq, INSITU): pairs_insitu.epoch(False, zb),
        case_name(field, shuf, THIS): this_epoch(pairs_shuffled, zb),
        case_name(field, shuf, INSITU): pairs_insitu.epoch(True, zb),
        case_name(field, two, THIS): this_epoch(
            lambda: pairs_shuffled(cache=pairs_cache, epoch=next(epoch_two[1])), zb),
        case_name(field, two, INSITU): pairs_warm_epoch,
        case_name(field, INPUTS_ALONE, THIS): this_epoch(
            lambda: dzb.batch_stream(zd, PAIR_BATCH), zb),
        case_name(field, INPUTS_ALONE, INSITU): inputs_insitu.epoch(False, zb),
    }  # fmt: skip
    if where.rows_path is not None:  # annbatch reads local files
        epochs[case_name(rows, seq, ANN)] = annbatch_epoch(where.rows_path, False, xb)
        epochs[case_name(rows, shuf, ANN)] = annbatch_epoch(where.rows_path, True, xb)
    return epochs, [rows_warm, pairs_warm], nbytes


def l0_name(store: str) -> str:
    return f"[{store}] {L0}"


def measure(
    data_dir: Path, rows: int, steps: int, repeats: int, stores: tuple[str, ...] = ("local",),
    latency: float | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Seconds of every case in ``repeats`` interleaved rounds, and its samples.

    ``stores``: ``"local"`` (the directories), ``"s3"`` (copies on moto's S3 on loopback,
    ``latency`` s added to each request, :mod:`.peers_s3`), each setting its own rounds.
    """
    from . import peers_s3  # its server and uploads; it imports nothing of this module

    delay = peers_s3.LATENCY if latency is None else latency
    results: dict[str, Any] = {
        "rows": rows, "cols": COLS, "chunk_rows": CHUNK_ROWS, "shard_rows": SHARD_ROWS,
        "steps": steps, "grid": list(GRID), "bytes": {}, "repeats": repeats, "tags": [],
        "seconds": {}, "samples": {}, "read": {},
    }  # fmt: skip
    with warnings.catch_warnings():
        for message in PEER_WARNINGS:
            warnings.filterwarnings("ignore", message)
        if "local" in stores:
            where = local(make_rows(data_dir, rows), make_field(data_dir, steps))
            merge(results, where.tag, _measure(where, repeats))
        if "s3" in stores:
            s3_rows, s3_steps = peers_s3.sizes(rows, steps)
            paths = make_rows(data_dir, s3_rows), make_field(data_dir, s3_steps)
            with peers_s3.served(delay) as server:
                where = Where(peers_s3.tag(delay), *peers_s3.on_s3(*paths, server))
                merge(results, where.tag, _measure(where, repeats))
            results["s3"] = {"rows": s3_rows, "steps": s3_steps, "latency": delay}
    return results


def merge(results: dict[str, Any], tag: str, measured: dict[str, Any]) -> None:
    """One setting's rounds into the run's results."""
    results["tags"].append(tag)
    for key in ("bytes", "seconds", "samples", "read"):
        results[key].update(measured[key])


def _measure(where: Where, repeats: int) -> dict[str, Any]:
    epochs, warm, nbytes = cases(where)
    names = list(epochs)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    samples: dict[str, int] = {}
    read: dict[str, dict[str, float]] = {}
    try:
        for round_number in range(repeats):
            shift = round_number % len(names)
            for name in names[shift:] + names[:shift]:
                started = time.perf_counter()
                _, samples[name], read[name] = epochs[name]()
                seconds[name].append(time.perf_counter() - started)
    finally:
        for ds in warm:
            ds.close()
    for store in (where.rows, where.field):  # every reader yields every sample (pair) once
        counts = {
            samples[case_name(store, shape, who)]
            for shape in SHAPE_NAMES
            for who in (THIS, *PEERS) if case_name(store, shape, who) in samples
        }  # fmt: skip
        assert len(counts) == 1, (store, counts)
    return {"bytes": nbytes, "seconds": seconds, "samples": samples, "read": read}


def ratios(results: dict[str, Any]) -> dict[str, float]:
    """Every case's median epoch against its store's L0 median (> 1: faster than L0)."""
    median = {name: statistics.median(s) for name, s in results["seconds"].items()}
    return {
        name: median[l0_name(name[1 : name.index("]")])] / value for name, value in median.items()
    }


def evaluate(results: dict[str, Any]) -> list[dict[str, str]]:
    """Ahead of each peer in every shape both support: a higher ratio to L0."""
    ratio = ratios(results)
    checks = []
    for store, shape in (pair for tag in tags_of(results) for pair in shapes(tag)):
        ours = ratio[case_name(store, shape, THIS)]
        for peer in PEERS:
            theirs = ratio.get(case_name(store, shape, peer))
            if theirs is None:
                continue
            checks.append({
                "what": f"[{store}] {shape}: ahead of {peer}",
                "measured": f"{ours:.2f}x L0 vs {theirs:.2f}x ({ours / theirs:.2f}x)",
                "status": "PASS" if ours > theirs else "MISS",
            })  # fmt: skip
    return checks


def versions() -> str:
    names = ("insitubatch", "annbatch", "zarr", "zarrs", "numpy", "dask")
    return ", ".join(f"{name} {version(name)}" for name in names if find_spec(name))


def report(results: dict[str, Any], checks: list[dict[str, str]], command: str, now: str,
           load: tuple[float, float]) -> str:  # fmt: skip
    """``peers.md``: the setting, one row per case (ratio to its L0) and the targets."""
    ratio = ratios(results)
    median = {name: statistics.median(s) for name, s in results["seconds"].items()}
    rows_mb = results["rows"] * results["cols"] * 4 / 1e6
    field_mb = results["steps"] * results["grid"][0] * results["grid"][1] * 4 / 1e6
    lines = [
        "# Peers: insitubatch and annbatch beside this library (issue 27)",
        "",
        f"`{command}` on {now}, Python {platform.python_version()}, {os.cpu_count()} CPUs "
        f"(shared), {versions()}; load average (1 min) {load[0]:.1f} at the start, "
        f"{load[1]:.1f} at the end.  **rows**: annbatch's `write_sharded` store, `X` "
        f"{results['rows']:,} x {results['cols']} float32 ({rows_mb:.0f} MB), "
        f"{results['chunk_rows']}-row chunks in {results['shard_rows']:,}-row shards, blosc "
        f"lz4; batches of {BATCH}; shuffled: this library's buffer and annbatch's preload "
        f"hold {SHUFFLE_ROWS:,} rows, insitubatch its default 16 shards.  **pairs**: a "
        f"({results['steps']}, {results['grid'][0]}, {results['grid'][1]}) float32 field "
        f"({field_mb:.0f} MB), one step per chunk, zstd; (x at t, y at t+1) "
        f"in batches of {PAIR_BATCH}, shuffled over {BLOCK} steps.  Each case's median "
        f"epoch over {results['repeats']} interleaved rounds, divided into its store's L0 "
        "median of the same rounds (> 1: faster than L0); L0 decodes with zarr-python's "
        "pipeline, annbatch and this library (`open_array`) with zarrs', as their "
        "documentation asks; epoch two: this library's `ChunkCache`, "
        "insitubatch's pool, each holding the array (annbatch keeps no chunks).",
        *s3_setting(results),
        "",
        "| store | shape | L0 s | this library | insitubatch | annbatch |",
        "|---|---|---:|---:|---:|---:|",
    ]
    rows = [(store, shape) for tag in tags_of(results)
            for store, shape in (*shapes(tag), (FIELD_STORE + tag, INPUTS_ALONE))]  # fmt: skip
    for store, shape in rows:
        cells = []
        for who in (THIS, *PEERS):
            name = case_name(store, shape, who)
            cells.append(f"{ratio[name]:.2f}x ({median[name]:.3f} s)" if name in ratio else "-")
        lines.append(f"| {store} | {shape} | {median[l0_name(store)]:.3f} | {' | '.join(cells)} |")
    lines += [
        "",
        "| target | measured (this vs peer, ratios to L0) | result |",
        "|---|---|---|",
        *(f"| {c['what']} | {c['measured']} | {c['status']} |" for c in checks),
        "",
        "What each case read in its last round (this library: `stream.stats`, chunk reads "
        "counting cache hits; insitubatch: its pool's misses, each a stored chunk (a shard) "
        "fetched and decoded, and hits):",
        "",
        "| case | chunk reads | read amplification | cache hits |",
        "|---|---:|---:|---:|",
    ]
    for name, read in results["read"].items():
        if read:
            amplification = read.get("read amplification")
            lines.append(
                f"| {name} | {read['chunk reads']:.0f} "
                f"| {'-' if amplification is None else format(amplification, '.2f')} "
                f"| {read['cache hits']:.0f} |"
            )
    return "\n".join(lines) + "\n"


def s3_setting(results: dict[str, Any]) -> list[str]:
    """The S3 stores' sentence of the report, if they were measured."""
    s3 = results.get("s3")
    if s3 is None:
        return []
    return [
        "",
        f"**S3** (the stores named `, S3 {s3['latency'] * 1000:.0f} ms`): copies of "
        f"{s3['rows']:,} rows and {s3['steps']} steps uploaded to moto's S3 server on "
        f"loopback (its own process) answering each request after {s3['latency'] * 1000:.0f} "
        "ms, in rounds of their own; every reader through obstore: L0 zarr-python over "
        '`zarr.storage.ObjectStore`, this library `open_array(url, backend="obstore")` '
        "(zarr's pipeline: zarrs does not read obstore stores), insitubatch its "
        "`obstore_store(url)`; annbatch reads local files only.",
    ]


def run(options: Any) -> None:
    """``--only peers``: measure, evaluate, write ``peers.md`` and ``peers.json``."""
    data_dir, out = Path(options.data), Path(options.out)
    data_dir.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    repeats = options.rounds or ROUNDS
    rows = options.rows or ROWS
    steps = options.steps or STEPS
    store = options.store or "all"
    stores = ("local", "s3") if store == "all" else (store,)
    load = os.getloadavg()
    results = measure(data_dir, rows, steps, repeats, stores, options.latency)
    load_after = os.getloadavg()
    checks = evaluate(results)
    command = (
        "python -m benchmarks --only peers"
        + (f" --rounds {repeats}" if repeats != ROUNDS else "")
        + (f" --rows {rows}" if rows != ROWS else "")
        + (f" --steps {steps}" if steps != STEPS else "")
        + (f" --store {store}" if store != "all" else "")
        + (f" --latency {options.latency}" if options.latency is not None else "")
    )
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    text = report(results, checks, command, now, (load[0], load_after[0]))
    (out / "peers.md").write_text(text)
    payload = {"command": command, "date": now, "python": platform.python_version(),
               "versions": versions(), "load": [load, load_after], **results,
               "ratios_to_l0": ratios(results), "targets": checks}  # fmt: skip
    (out / "peers.json").write_text(json.dumps(payload, indent=1) + "\n")
    print("\n" + text)
