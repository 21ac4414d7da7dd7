"""Where the data really lives (issue 10): sharded arrays, per-request latency, S3, codecs.

Every case here is compared with zarr's own ``x[:]`` on the same store (or with the
raw decode limit), measured in the same interleaved rounds:

- **sharding**: the full dataset and its sharded copy (8 inner chunks per Zarr v3
  shard, same chunks and codec), no latency;
- **latency**: a :class:`~benchmarks.latency_store.LatencyStore` sleeping 20 ms or
  100 ms before each request, metadata reads included (as an object store answers),
  over a smaller dataset of :data:`SUBSET_CHUNKS` chunks (the whole dataset when it
  is smaller), unsharded and (20 ms) sharded;
- **S3**: that smaller dataset uploaded to moto's S3 server on ``127.0.0.1``
  (``benchmarks/s3_server.py``), read through both backends of ``open_array``, s3fs
  (zarr's ``FsspecStore``) and obstore (zarr's ``ObjectStore``), every kind on each, in
  the same rounds; the server is stopped at the end;
- **codec pipelines**: the full dataset read with zarrs' codec pipeline (Rust) beside the
  raw decode limit, in the rounds of the no-latency cases; every other case names zarr's
  default pipeline when it opens its arrays, whatever the global configuration.

The stream kinds take their defaults except the shuffle buffer (8 chunks, as in the
main cases); the exact shuffle runs with the default ``memory_budget``, which holds
these arrays in one window (read amplification 1).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zarr
import zarr.storage

import daskzarr_batches as dzb

from ..latency_store import LatencyStore
from .cases import RAW_DECODE, installed, raw_decode, raw_decoder
from .dataset import Dataset, make_dataset, make_sharded
from .measure import Case, Measured, Result, drain, rounds

#: the latencies per request of the latency cases, seconds
LATENCIES = (0.020, 0.100)
#: chunks of the smaller dataset the latency and S3 cases read
SUBSET_CHUNKS = 64
#: rounds of these cases at most (each keeps its best)
STORE_REPEATS = 3

# Stream kinds (the second part of a case name; the first names the store).
ZARR_ALL = "zarr x[:]"
SEQUENTIAL = "sequential, batch 256"
BUFFERED = "buffered shuffle (8 chunks), batch 256"
EXACT = "exact shuffle (default budget), batch 256"
PAIRED = "paired features+labels, buffered (8 chunks)"
CHUNKS = "chunk_stream"
KINDS = (ZARR_ALL, SEQUENTIAL, BUFFERED, EXACT, PAIRED, CHUNKS)

# Stores (the first part of a case name).
UNSHARDED = "unsharded"
SHARDED = "sharded (8 chunks/shard)"
S3 = f"S3 loopback, {SUBSET_CHUNKS} chunks"  # through s3fs (fsspec)
S3_OBSTORE = f"S3 loopback via obstore, {SUBSET_CHUNKS} chunks"
ZARR_PIPELINE = "zarr codec pipeline"
ZARRS_PIPELINE = "zarrs codec pipeline"
#: the codec pipelines: label -> ``codec_pipeline.path`` of ``zarr.config``
PIPELINES = {
    ZARR_PIPELINE: "zarr.core.codec_pipeline.BatchedCodecPipeline",
    ZARRS_PIPELINE: "zarrs.ZarrsCodecPipeline",
}
#: the keys of ``skipped`` that the targets of these cases read (skip all: ``--no-stores``)
SKIP_KEYS = ("stores", "S3", "obstore", "zarrs")
#: the raw decode limit measured beside the codec pipelines
PIPELINE_LIMIT = f"[codec pipelines] {RAW_DECODE} (limit)"


@contextlib.contextmanager
def pipeline(path: str) -> Iterator[None]:
    """Arrays opened inside decode with the codec pipeline at ``path`` (``zarr.config``)."""
    with zarr.config.set({"codec_pipeline.path": path}):
        yield


def latency_label(sharded: bool, delay: float) -> str:
    """The store part of a latency case's name, e.g. ``unsharded, 20 ms, 24 chunks``."""
    return f"{SHARDED if sharded else UNSHARDED}, {delay * 1000:.0f} ms, {SUBSET_CHUNKS} chunks"


def name(store: str, kind: str) -> str:
    """A case's name: ``[store] kind``."""
    return f"[{store}] {kind}"


def is_store_case(case: str) -> bool:
    """Whether ``case`` names one of these cases (the chart leaves them to their table)."""
    return case.startswith("[")


@dataclass(frozen=True)
class Opened:
    """The features and labels of one store, as the cases read them."""

    label: str
    x: zarr.Array
    y: zarr.Array
    buffer_rows: int
    #: the latency store the arrays are read through, if any (it counts the requests)
    latency: LatencyStore | None = None


def open_group(label: str, store: Any, chunk_rows: int, codecs: str = ZARR_PIPELINE) -> Opened:
    """The arrays of ``store``, decoded by the codec pipeline ``PIPELINES[codecs]``.

    The pipeline is fixed when an array is opened; naming it keeps every case but
    the zarrs ones on zarr's default pipeline whatever the global configuration.
    """
    with pipeline(PIPELINES[codecs]):
        group = zarr.open_group(store=store, mode="r")
        x, y = group["features"], group["labels"]
    assert isinstance(x, zarr.Array) and isinstance(y, zarr.Array)
    for array in (x, y):
        used = type(array._async_array.codec_pipeline).__name__
        assert used == PIPELINES[codecs].rsplit(".", 1)[-1], used
    latency = store if isinstance(store, LatencyStore) else None
    return Opened(label, x, y, 8 * chunk_rows, latency)


def open_local(label: str, ds: Dataset, delay: float = 0.0, codecs: str = ZARR_PIPELINE) -> Opened:
    """``ds`` on a read-only local store, behind a :class:`LatencyStore` when ``delay``."""
    store: Any = zarr.storage.LocalStore(ds.path, read_only=True)
    if delay:
        store = LatencyStore(store, delay, metadata=True)
    return open_group(label, store, ds.chunk_rows, codecs)


def zarr_all(x: zarr.Array) -> Measured:
    """zarr's own read of the whole array (its concurrent chunk reads)."""
    x[:]
    return x.nbytes, x.shape[0], 1.0


def kind_run(o: Opened, kind: str) -> Callable[[], Measured]:
    """One epoch of stream kind ``kind`` over ``o``."""
    x, y, buffer_rows = o.x, o.y, o.buffer_rows
    runs: dict[str, Callable[[], Measured]] = {
        ZARR_ALL: lambda: zarr_all(x),
        SEQUENTIAL: lambda: drain(dzb.batch_stream(x, 256)),
        BUFFERED: lambda: drain(
            dzb.shuffled_batch_stream(x, 256, seed=0, shuffle_buffer_size=buffer_rows)
        ),
        EXACT: lambda: drain(dzb.shuffled_batch_stream(x, 256, seed=0)),
        PAIRED: lambda: drain(
            dzb.paired_shuffled_batch_stream(x, y, 256, seed=0, shuffle_buffer_size=buffer_rows)
        ),
        CHUNKS: lambda: drain(dzb.chunk_stream(x)),
    }
    return runs[kind]


def counted(o: Opened, case: str, run: Callable[[], Measured]) -> Callable[[], Measured]:
    """``run``, recording its requests in ``REQUESTS[case]`` (cases on a latency store)."""
    store = o.latency
    if store is None:
        return run

    def run_counted() -> Measured:
        before = store.requests
        store.state["peak"] = store.state["now"]
        measured = run()
        REQUESTS[case] = (store.requests - before, store.state["peak"])
        return measured

    return run_counted


#: (requests, most in flight at once) of one epoch of each case read through a
#: :class:`LatencyStore` (its last round)
REQUESTS: dict[str, tuple[int, int]] = {}


def kind_cases(o: Opened, kinds: tuple[str, ...] = KINDS) -> list[Case]:
    group = {ZARR_ALL: "reference"}
    return [
        Case(name(o.label, k), group.get(k, "this"), counted(o, name(o.label, k), kind_run(o, k)))
        for k in kinds
    ]


def subset(ds: Dataset, data_dir: Path) -> Dataset:
    """The smaller dataset of the latency and S3 cases: :data:`SUBSET_CHUNKS` chunks."""
    rows = min(ds.rows, SUBSET_CHUNKS * ds.chunk_rows)
    return ds if rows == ds.rows else make_dataset(data_dir, rows, ds.cols, ds.chunk_rows)


# --------------------------------------------------------------------------
# The groups


def sharding_cases(ds: Dataset) -> list[Case]:
    """Every kind on the full dataset and on its sharded copy, no latency."""
    return kind_cases(open_local(UNSHARDED, ds)) + kind_cases(open_local(SHARDED, make_sharded(ds)))


def latency_cases(small: Dataset) -> list[Case]:
    """Every kind at each latency (unsharded), and sharded at the first one."""
    cases: list[Case] = []
    for delay in LATENCIES:
        cases += kind_cases(open_local(latency_label(False, delay), small, delay))
    sharded = make_sharded(small)
    cases += kind_cases(open_local(latency_label(True, LATENCIES[0]), sharded, LATENCIES[0]))
    return cases


def s3_available(skipped: dict[str, str]) -> bool:
    """Whether s3fs and moto import; if not, the reason goes to ``skipped["S3"]``.

    Without obstore the s3fs cases still run; the reason goes to ``skipped["obstore"]``.
    """
    try:
        import moto.server  # noqa: F401
        import s3fs  # noqa: F401
    except ImportError as exc:
        skipped["S3"] = f"not installed ({exc}); pip install .[s3] moto[server]"
        skipped["obstore"] = "no S3 cases"
        print(f"  skipping S3: {skipped['S3']}")
        return False
    installed("obstore", skipped)
    return True


@contextlib.contextmanager
def s3_copy(small: Dataset, obstore: bool = True) -> Iterator[list[Opened]]:
    """``small`` uploaded to moto's S3 on loopback, opened through s3fs and (if
    ``obstore``) obstore, with the same ``storage_options``; the server stops on exit.

    Every connection or name lookup that is not loopback is refused and fails the run
    (obstore connects from Rust, which the guard does not see: it is only ever given
    the server's endpoint).
    """
    import s3fs

    from ..internals import zarr_behind
    from ..s3_server import S3Server, loopback_only

    def store_of(url: str, options: dict[str, Any], backend: str) -> Any:
        """The store ``open_array`` reads ``url`` through on ``backend`` (same options)."""
        x = dzb.open_array(url, "features", storage_options=options, backend=backend)
        return zarr_behind(x).store_path.store

    with loopback_only() as attempts:
        server = S3Server().start()
        try:
            bucket = server.new_bucket("bench")
            options = server.storage_options()
            fs = s3fs.S3FileSystem(**options)
            fs.put(str(small.path), f"{bucket}/data.zarr", recursive=True)
            url = f"s3://{bucket}/data.zarr"
            opened = [open_group(S3, store_of(url, options, "fsspec"), small.chunk_rows)]
            if obstore:
                store = store_of(url, options, "obstore")
                opened.append(open_group(S3_OBSTORE, store, small.chunk_rows))
            yield opened
        finally:
            server.stop()
    if attempts:
        raise RuntimeError(f"S3 cases tried to reach beyond loopback: {attempts}")


def pipeline_cases(ds: Dataset, threads: int, skipped: dict[str, str]) -> list[Case]:
    """The raw decode limit, and sequential and ``x[:]`` with zarrs' pipeline.

    Zarr's own pipeline is the one of the :data:`UNSHARDED` cases (same rounds).
    """
    cases: list[Case] = []
    x = ds.features
    if raw_decoder(x) is not None:
        root = ds.path / "features"
        cases.append(Case(PIPELINE_LIMIT, "reference", lambda: raw_decode(x, root, threads)))
    if installed("zarrs", skipped):
        zarrs = open_local(ZARRS_PIPELINE, ds, codecs=ZARRS_PIPELINE)
        cases += kind_cases(zarrs, (ZARR_ALL, SEQUENTIAL))
    return cases


def measure_stores(
    ds: Dataset, data_dir: Path, *, repeats: int, threads: int, skipped: dict[str, str]
) -> dict[str, Result]:
    """Every group, each in its own interleaved rounds (at most :data:`STORE_REPEATS`)."""
    repeats = min(repeats, STORE_REPEATS)
    small = subset(ds, data_dir)
    started = time.perf_counter()
    print(f"no latency: sharded vs unsharded, codec pipelines, {repeats} interleaved rounds")
    results = rounds(sharding_cases(ds) + pipeline_cases(ds, threads, skipped), repeats)
    delays = " and ".join(f"{d * 1000:.0f} ms" for d in LATENCIES)
    print(f"{delays} per request, {small.rows:,} rows, {repeats} interleaved rounds")
    REQUESTS.clear()
    results |= rounds(latency_cases(small), repeats)
    print("  requests per epoch / most in flight at once (metadata read at open excluded):")
    for case, (count, peak) in REQUESTS.items():
        results[case].extra |= {"requests": count, "in_flight": peak}
        print(f"  {case:56s} {count:5d} / {peak}")
    if s3_available(skipped):
        print(f"S3 on loopback (moto), {small.rows:,} rows")
        with s3_copy(small, obstore="obstore" not in skipped) as copies:
            results |= rounds([case for o in copies for case in kind_cases(o)], repeats)
    print(f"  store cases took {time.perf_counter() - started:.0f} s")
    return results


# --------------------------------------------------------------------------
# The report's table


def store_labels() -> list[str]:
    """Every store of these cases, in table order."""
    latency = [latency_label(False, d) for d in LATENCIES] + [latency_label(True, LATENCIES[0])]
    return [UNSHARDED, SHARDED, *latency, S3, S3_OBSTORE, ZARRS_PIPELINE]


def stores_section(results: dict[str, Result]) -> list[str]:
    """One row per store: ``x[:]`` MB/s, and each kind's throughput over it (requests).

    Empty when none of these cases ran.
    """
    rows = [label for label in store_labels() if name(label, ZARR_ALL) in results]
    if not rows:
        return []
    lines = [
        "## Stores: sharded, per-request latency, S3, codec pipelines (issue 10)",
        "",
        "Each kind's throughput over zarr's own `x[:]` on the same store, in the same "
        "interleaved rounds; in brackets (latency stores) the requests of one epoch / the "
        f"most in flight at once.  The latency and S3 cases read {SUBSET_CHUNKS} chunks (the whole "
        "array when smaller); the others the whole dataset.  The exact shuffle has the "
        "default `memory_budget` (one window here).",
        "",
        "| store | x[:] MB/s | " + " | ".join(KINDS[1:]) + " |",
        "|---|" + "---:|" * len(KINDS),
    ]
    for label in rows:
        reference = results[name(label, ZARR_ALL)]
        cells = [f"{reference.mb_s:,.1f}{requests(reference)}"]
        for kind in KINDS[1:]:
            result = results.get(name(label, kind))
            cells.append(
                "-" if result is None else f"{result.mb_s / reference.mb_s:.2f}x{requests(result)}"
            )
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    limit = results.get(PIPELINE_LIMIT)
    if limit is not None:
        pipelines = [
            f"sequential with {pipe} {result.mb_s / limit.mb_s:.2f}x"
            for label, pipe in ((UNSHARDED, "zarr's pipeline"), (ZARRS_PIPELINE, "zarrs"))
            if (result := results.get(name(label, SEQUENTIAL))) is not None
        ]
        lines += [
            "",
            f"Raw decode limit {limit.mb_s:,.1f} MB/s (same rounds as the {UNSHARDED} and "
            f"{ZARRS_PIPELINE} rows): " + ", ".join(pipelines) + ".",
        ]
    return lines


def requests(result: Result) -> str:
    """`` (requests/most in flight)`` of an epoch on a latency store, else nothing."""
    if "requests" not in result.extra:
        return ""
    return f" ({result.extra['requests']}/{result.extra['in_flight']})"
