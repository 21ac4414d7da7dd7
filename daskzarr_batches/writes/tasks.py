"""The tasks of a write job and the driver that runs them: inputs, write units, reports.

A job's inputs as sources (``_Inputs``), the write task (``_write_unit``,
module level so it pickles to workers: one output shard or row of chunks
written from its window's rows, returning the sizes of what it wrote), the
write units and their rows, and the driver (``_run``: each task is
``read.graphs.window_graph`` plus one write task, run locally or on a
client, its report accounted into :class:`WriteStats` and the manifest).  Each unit
is one fused task (``streams.chunk_jobs.fused``), the units sent in batches (one graph
per batch on a cluster), each with its own future: a unit is recorded complete only
from its own report, so a resume redoes exactly the units without one.
"""

from __future__ import annotations

import dataclasses
import math
import os
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import dask
import numpy as np
import zarr
from tqdm import tqdm

from ..errors import (
    ArgumentValueError,
    CacheWarning,
    LengthMismatchError,
    MissingChunksWarning,
    SkippedChunksWarning,
    WindowError,
    WindowTimeoutError,
    warn_caller,
)
from ..execute.runners import make_runner
from ..fingerprints import input_fingerprint
from ..plan.windows import Window, chunk_offsets, pieces_for
from ..read.context import ReadContext
from ..read.graphs import window_graph
from ..read.kept import read_kept_chunk
from ..store.layout import storage_keys
from ..store.sources import Source, as_source
from ..store.zarr_adapter import sync
from ..streams.base import stored_arrays, stored_sources
from ..streams.chunk_jobs import fused
from ..streams.spec import ReadOptions, as_array
from .resume import _listed, _Manifest

__all__ = ["WriteStats"]


@dataclass
class WriteStats:
    """What one ``map_to_zarr`` / ``write_shuffled`` call did (pass one as ``stats=``).

    Attributes
    ----------
    units : int
        Write units of the output (shards, or rows of chunks).
    units_written, units_skipped : int
        Units computed and written by this call; units found complete (a resume).
    units_failed : int
        Units left unwritten because an input chunk did not decode
        (``on_error="skip"``); a later run writes them.
    chunks_written : int
        Stored objects (chunks or shards) written, over every output array.
    bytes_written : int
        Decoded bytes written.
    func_calls : int
        Calls of ``func`` (``map_to_zarr``; the probe call included).
    input_chunks_missing : int
        Stored objects of the input absent from its store, read as the fill
        value (what the Zarr spec says an absent chunk holds; Zarr leaves a
        chunk of only the fill value unwritten by default), each key once:
        counted, and warned of only with ``missing="warn"``.
    cache_hits, cache_misses : int
        Input chunk reads served by ``cache=`` (neither fetched nor decoded),
        and looked up there but read from the store (0 without a cache).
    """

    units: int = 0
    units_written: int = 0
    units_skipped: int = 0
    units_failed: int = 0
    chunks_written: int = 0
    bytes_written: int = 0
    func_calls: int = 0
    input_chunks_missing: int = 0
    cache_hits: int = 0
    cache_misses: int = 0


@dataclass(frozen=True)
class _Inputs:
    kind: str  # "single", "dict" or "tuple"
    names: tuple[str, ...]
    sources: tuple[Source, ...]

    @property
    def rows(self) -> int:
        return self.sources[0].shape[0]

    def pack(self, parts: Sequence[np.ndarray]) -> Any:
        if self.kind == "single":
            return parts[0]
        if self.kind == "dict":
            return dict(zip(self.names, parts, strict=True))
        return tuple(parts)

    def described(self) -> list[tuple[str, Source]]:
        """Each input as messages name it (``data``, ``data['x']``, ``data[0]``), its source."""
        if self.kind == "single":
            return [("data", self.sources[0])]
        keys = self.names if self.kind == "dict" else range(len(self.names))
        return [(f"data[{key!r}]", s) for key, s in zip(keys, self.sources, strict=True)]

    def identity(self) -> list[dict[str, Any]]:
        return [
            {"name": name, "array": s.name, "shape": list(s.shape), "dtype": s.dtype.str}
            for name, s in zip(self.names, self.sources, strict=True)
        ]

    def contents(self) -> list[str]:
        """A fingerprint of each input's contents (:func:`input_fingerprint`)."""
        return [
            input_fingerprint([getattr(t, "array", None) for t in stored_sources(s)], _listed)
            for s in self.sources
        ]


def _inputs(data: Any) -> _Inputs:
    if isinstance(data, Mapping):
        if not data:
            raise ArgumentValueError("data is an empty dict: name at least one array")
        kind, names, arrays = "dict", tuple(str(k) for k in data), list(data.values())
    elif isinstance(data, tuple):
        if not data:
            raise ArgumentValueError("data is an empty tuple: give at least one array")
        kind, names, arrays = "tuple", tuple(str(i) for i in range(len(data))), list(data)
    else:
        kind, names, arrays = "single", ("array",), [data]
    sources = tuple(as_source(as_array(a), n) for n, a in zip(names, arrays, strict=True))
    lengths = {s.shape[0] for s in sources}
    if len(lengths) > 1:
        raise LengthMismatchError(
            "the arrays of data have different lengths: "
            + ", ".join(f"{n}: {s.shape[0]}" for n, s in zip(names, sources, strict=True))
        )
    return _Inputs(kind, names, sources)


@dataclass(frozen=True)
class _WriteJob:
    """What every write task of one job shares (not traversed by dask)."""

    func: Callable[[Any], Any] | None
    inputs: _Inputs
    outs: tuple[zarr.Array, ...]
    #: a shuffle's consecutive units are written together up to this many rows
    write_rows: int = 0
    token: str = field(default_factory=lambda: uuid.uuid4().hex, compare=False)

    def __dask_tokenize__(self) -> Any:
        """One token per job: ``client.get`` tokenizes each unit's graph, and normalising
        the func, arrays and sources field by field cost ~1 ms of the caller's CPU per unit."""
        return ("dzb-write-job", self.token)


def _write_unit(reads: tuple[tuple[np.ndarray, Any], ...], job: _WriteJob, ranges: Any) -> Any:
    """Apply ``job.func`` to the rows read for ``ranges`` and write them; a small report."""
    reports = [report for _, report in reads]
    missing = tuple(k for r in reports for k in r.missing_keys)
    hits = sum(r.cache.hits for r in reports if r.cache is not None)
    misses = sum(r.cache.misses for r in reports if r.cache is not None)
    if any(r.skipped for r in reports):
        return {"written": [], "failed": True, "bytes": 0, "calls": 0, "missing": missing,
                "hits": hits, "misses": misses}  # fmt: skip
    rows = [np.asarray(r) for r, _ in reads]
    offset, nbytes, calls, written = 0, 0, 0, []
    units = ranges.tolist()
    if job.func is None:  # a shuffle's consecutive units: one write per group of them
        units = _runs(units, job.write_rows)
    for start, stop in units:
        n = stop - start
        parts = [r[offset : offset + n] for r in rows]
        offset += n
        if job.func is None:
            results = parts
        else:
            result = np.asarray(job.func(job.inputs.pack(parts)))
            calls += 1
            expected = (n, *job.outs[0].shape[1:])
            if result.shape != expected:
                raise ArgumentValueError(
                    f"func returned shape {result.shape} for samples {start}:{stop}, "
                    f"expected {expected} (the same number of rows, the output's sample shape)"
                )
            results = [result]
        for out, result in zip(job.outs, results, strict=True):
            out[start:stop] = result
            nbytes += result.nbytes
        written.append((start, stop))
    sizes = _object_sizes(job.outs, written)
    return {"written": written, "failed": False, "bytes": nbytes, "calls": calls,
            "missing": missing, "sizes": sizes, "hits": hits, "misses": misses}  # fmt: skip


def _runs(ranges: list[list[int]], max_rows: int) -> list[tuple[int, int]]:
    """Consecutive ranges joined up to ``max_rows`` rows, so Zarr encodes and writes their
    chunks concurrently while the copies it encodes from stay within ``max_rows`` rows."""
    joined: list[tuple[int, int]] = []
    for start, stop in ranges:
        if joined and joined[-1][1] == start and stop - joined[-1][0] <= max_rows:
            joined[-1] = (joined[-1][0], stop)
        else:
            joined.append((start, stop))
    return joined


def _object_sizes(outs: Sequence[zarr.Array], ranges: Sequence[tuple[int, int]]) -> dict[str, int]:
    """``{store key: bytes}`` of the objects holding rows ``ranges`` of every array."""
    keys = [(out, key) for out in outs for a, b in ranges for key in storage_keys(out, a, b)]

    async def sized() -> list[int]:
        import asyncio

        return await asyncio.gather(*(out.store.getsize(key) for out, key in keys))

    return {key: int(size) for (_, key), size in zip(keys, sync(sized()), strict=True)}


@dataclass
class _Task:
    number: int
    samples: range | np.ndarray
    ranges: np.ndarray  # (k, 2) output rows written


def _run(
    tasks: Sequence[_Task],
    inputs: _Inputs,
    job: _WriteJob,
    read: ReadOptions,
    in_flight: int,
    stats: WriteStats,
    progress: bool,
    decode_bytes: int | None,
    what: str,
    readers: Any = None,
) -> None:
    """Submit the tasks, ``in_flight`` at once, and collect their reports.

    ``readers``: the job's reader hook (``ReadPolicy.readers``), when a read
    before the tasks (``map_to_zarr``'s probe) already used it: one factory
    call per array per job; ``None``: a fresh one.
    """
    concurrency = read.io_concurrency or max(os.cpu_count() or 1, in_flight)
    runner = make_runner(read.client, in_flight=in_flight, read_workers=concurrency)
    policy = read.policy.limited(concurrency).tokened(stored_arrays(list(inputs.sources)))
    if readers is not None:
        policy = dataclasses.replace(policy, readers=readers)
    # a cache on a cluster: decoded chunks kept as cluster futures, windows cut from them
    kept = None if policy.cache is None else runner.keeper(policy.cache, read_kept_chunk, policy)
    offsets = [chunk_offsets(s.chunks[0]) for s in inputs.sources]
    token = uuid.uuid4().hex
    chunks_per_row = [math.prod(math.ceil(n / c) for n, c in zip(o.shape[1:], _obj(o)[1:],
                      strict=True)) for o in job.outs]  # fmt: skip
    manifest = _Manifest(job.outs[0])
    manifest.sizes = manifest.read()
    bar = tqdm(total=len(tasks), desc=what, unit="task", disable=not progress)
    absent: set[str] = set()  # input keys found absent (a shuffle's windows share chunks)
    pending = list(reversed(tasks))
    flying: dict[Any, _Task] = {}
    batch = 1 if read.client is None else max(in_flight // 2, 1)
    try:
        sources = runner.place(list(inputs.sources), read.timeout)
        ctx = ReadContext(policy, runner.scope, True, decode_bytes, kept=kept)
        while pending or flying:
            # one task per unit (its reads, the write and its report fused), sent in batches
            # of half the units in flight per graph: one scheduler round trip per batch
            take = min(in_flight - len(flying), len(pending))
            if take > 0 and take >= min(batch, len(pending)):
                sent = [pending.pop() for _ in range(take)]
                graphs = []
                for task in sent:
                    pieces = tuple(tuple(pieces_for(task.samples, off)) for off in offsets)
                    window = Window(task.number, 0, task.samples, pieces)
                    dsk, key = window_graph(sources, window, token, ctx)
                    write_key = (f"dzb-write-{token}", task.number)
                    dsk[write_key] = (_write_unit, key, job, task.ranges)
                    graphs.append((fused(dsk, write_key), write_key))
                futures = runner.submit_many(graphs, -sent[0].number)
                flying.update(zip(futures, sent, strict=True))
            done = runner.wait(list(flying), read.timeout)
            if not done:
                oldest = next(iter(flying.values()))
                raise WindowTimeoutError(
                    f"{what}: {_where(oldest)} was not ready after timeout={read.timeout} s"
                )
            for future in [f for f in flying if f in done]:
                task = flying.pop(future)
                try:
                    report = future.result()
                except Exception as error:
                    raise WindowError(
                        f"{what}: {_where(task)} failed: {type(error).__name__}: {error}"
                    ) from error
                finally:
                    runner.release(future)
                _account(report, task, job, stats, chunks_per_row, read, what, absent)
                if report.get("sizes"):
                    manifest.add(report["sizes"])
                bar.update(1)
    finally:
        bar.close()
        runner.close()
        if tasks:
            manifest.write()


def _obj(array: zarr.Array) -> tuple[int, ...]:
    return tuple(array.shards if array.shards is not None else array.chunks)


def _where(task: _Task) -> str:
    rows = ", ".join(f"{a}:{b}" for a, b in task.ranges.tolist())
    return f"the write of output rows {rows} (unit task {task.number})"


def _account(
    report: dict[str, Any],
    task: _Task,
    job: _WriteJob,
    stats: WriteStats,
    chunks_per_row: list[int],
    read: ReadOptions,
    what: str,
    absent: set[str],
) -> None:
    stats.cache_hits += report.get("hits", 0)
    stats.cache_misses += report.get("misses", 0)
    problem = None if read.cache is None else read.cache.take_write_error()
    if problem is not None:
        warn_caller(CacheWarning(problem))
    new = set(report["missing"]) - absent
    absent |= new
    stats.input_chunks_missing += len(new)
    if report["missing"] and read.missing == "warn":
        keys = report["missing"]
        warn_caller(
            MissingChunksWarning(
                f"{what}: {len(keys)} input chunk(s) absent from the store, written as the fill "
                f"value ({', '.join(keys[:3])}{'...' if len(keys) > 3 else ''})"
            )
        )
    if report["failed"]:
        stats.units_failed += len(task.ranges)
        warn_caller(
            SkippedChunksWarning(
                f"{what}: {_where(task)} left unwritten: an input chunk does not decode "
                "(on_error='skip'); a later run with resume=True writes it"
            )
        )
        return
    stats.func_calls += report["calls"]
    stats.bytes_written += report["bytes"]
    for start, stop in report["written"]:  # a unit, or a run of a shuffle's units
        step = _obj(job.outs[0])[0]
        stats.units_written += math.ceil(stop / step) - start // step
        for out, per_row in zip(job.outs, chunks_per_row, strict=True):
            step = _obj(out)[0]
            stats.chunks_written += per_row * (math.ceil(stop / step) - start // step)


def _chunk_rows(source: Source) -> int:
    """Rows of the input's stored chunks (a Zarr array's chunk shape, else its largest)."""
    array = getattr(source, "array", None)
    if isinstance(array, zarr.Array):
        return max(1, int(array.chunks[0]))
    return max(1, max(source.chunks[0], default=1))


def _units(rows: int, step: int) -> list[tuple[int, int]]:
    return [(start, min(start + step, rows)) for start in range(0, rows, step)]


def _read_rows(
    inputs: _Inputs, stop: int, read: ReadOptions, readers: Any = None
) -> list[np.ndarray]:
    """Samples ``0:stop`` of every input, read here (the probe; through the cache if any).

    ``readers``: the job's reader hook, shared with its tasks (:func:`_run`).
    """
    if stop == 0:
        return [np.empty((0, *s.shape[1:]), dtype=s.dtype) for s in inputs.sources]
    samples = range(stop)
    pieces = tuple(tuple(pieces_for(samples, chunk_offsets(s.chunks[0]))) for s in inputs.sources)
    policy = read.policy.tokened(stored_arrays(list(inputs.sources)))
    if readers is not None:
        policy = dataclasses.replace(policy, readers=readers)
    ctx = ReadContext(policy, plan_order=True)
    dsk, key = window_graph(list(inputs.sources), Window(0, 0, samples, pieces), "probe", ctx)
    return [np.asarray(rows) for rows, _ in dask.get(dsk, key)]
