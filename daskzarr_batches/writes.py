"""Per-chunk jobs that write: ``map_to_zarr`` and ``write_shuffled``.

Both cut the output into *write units* along the sample axis: one output
shard (sharded output) or one row of output chunks (every chunk of those rows,
all trailing axes), so each stored object of the output is written by exactly
one task and workers never write the same object.  A task is the read graph
of the batch streams (:func:`~daskzarr_batches.read.graphs.window_graph`: the
read policy, collections, subsets, dask arrays, a ``distributed`` client)
plus one write task that applies ``func`` (``map_to_zarr``) and writes its
units, returning a small report; only that report travels to the caller.

**Resume.**  A unit is *complete* when every stored object of it exists in
every output array and its rows decode to the right shape; a file truncated
by a killed process does not decode and is written again.  Outputs are
written with ``write_empty_chunks=True``, so a chunk that is entirely fill
value is stored like any other and counts as complete by the same rule (no
manifest to keep in step).  So that a resume does not decode what is known
good, the caller keeps a manifest of the sizes of the objects of every unit a
task reported written (:class:`_Manifest`); a unit whose objects have the
recorded sizes is complete without decoding.  A resumed run computes only the incomplete units;
every unit is a pure function of the input and the fingerprint, so the result
is bit-identical to an uninterrupted run.  The stored objects of a unit that is
not complete are deleted before it is written: Zarr writes a shard by
read-modify-write, and a torn one would fail the write.  The fingerprint (the
job: ``job_id`` or ``func``'s qualified name, the seed of a shuffle; each
input's name, which for a Zarr array is its store and path, shape, dtype and a
fingerprint of its contents; without a ``job_id``, a fingerprint of ``func``:
:mod:`~daskzarr_batches.fingerprints`) is stored in the output's attributes
under ``"daskzarr_batches"``; a resume across a different one is refused with
:class:`ResumeMismatchError` naming what changed.
"""

from __future__ import annotations

import concurrent.futures
import json
import math
import os
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import dask
import numpy as np
import zarr
from tqdm import tqdm

from .errors import (
    ArgumentTypeError,
    ArgumentValueError,
    CacheWarning,
    LengthMismatchError,
    MissingChunksWarning,
    ResumeMismatchError,
    SkippedChunksWarning,
    WindowError,
    WindowTimeoutError,
    warn_caller,
)
from .execute.runners import make_runner
from .fingerprints import Unfingerprintable, func_fingerprint, input_fingerprint
from .plan.budget import exact_budget
from .plan.epoch import permutation
from .plan.windows import Window, chunk_offsets, pieces_for
from .read.graphs import window_graph
from .read.window import read_kept_chunk
from .store.backends import resolve_backend, url_store
from .store.cache import ChunkCache
from .store.layout import storage_keys
from .store.policy import DEFAULT_RETRIES, MissingMode, OnError
from .store.sources import Source, _check_dtype, as_source
from .store.zarr_adapter import buffer_prototype, sync
from .streams.base import stored_arrays, stored_sources
from .streams.spec import ReadOptions, as_array, byte_size, non_negative_int, read_options

__all__ = ["WriteStats", "map_to_zarr", "shuffle_order", "write_shuffled"]

#: the attribute of the output that holds the fingerprint
FINGERPRINT_KEY = "daskzarr_batches"
#: ``write_shuffled``'s default ``memory_budget``
DEFAULT_WRITE_BUDGET = 256 * 2**20
#: the manifest of object sizes beside the output (see :class:`_Manifest`)
MANIFEST_NAME = "daskzarr_batches_manifest.json"
#: the caller rewrites the manifest at most this often (and at the end)
MANIFEST_SECONDS = 1.0
#: windows of ``write_shuffled`` in flight locally: one, as the exact shuffle (two measured
#: 1.4x slower at a quarter-dataset budget: half-size windows read every chunk twice as often)
_SHUFFLE_WINDOWS = 1


@dataclass
class WriteStats:
    """What one ``map_to_zarr`` / ``write_shuffled`` call did (pass one as ``stats=``).

    Attributes
    ----------
    units : int
        Write units of the output (shards, or rows of chunks).
    units_written : int, default 0
        Units computed and written by this call; units found complete (a resume).
    units_skipped : int, default 0
        See ``units_written``.
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
    cache_hits : int, default 0
        Input chunk reads served by ``cache=`` (neither fetched nor decoded),
        and looked up there but read from the store (0 without a cache).
    cache_misses : int, default 0
        See ``cache_hits``.
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


# --------------------------------------------------------------------------
# Inputs


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


# --------------------------------------------------------------------------
# The write task (module level: it pickles to workers)


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


# --------------------------------------------------------------------------
# Output arrays


def _output_dtype(value: Any) -> np.dtype[Any]:
    """``dtype=`` as a numpy dtype of fixed-size numbers, or raise naming it."""
    try:
        dtype = np.dtype(value)
    except (TypeError, ValueError) as exc:
        raise ArgumentTypeError(f"dtype={value!r} is not a numpy dtype: {exc}") from exc
    _check_dtype(f"the output (dtype={value!r})", dtype)
    return dtype


def _sample_shape(value: Any) -> tuple[int, ...]:
    """``sample_shape=`` as a tuple of non-negative ints, or raise naming it."""
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise ArgumentTypeError(
            f"sample_shape must be a tuple of ints (the shape of one output sample), got {value!r}"
        )
    if not all(isinstance(n, int | np.integer) and not isinstance(n, bool) for n in value):
        raise ArgumentTypeError(f"sample_shape must be a tuple of ints, got {value!r}")
    if any(n < 0 for n in value):
        raise ArgumentValueError(f"sample_shape={tuple(value)!r} has a negative size")
    return tuple(int(n) for n in value)


def _check_shards(shards: tuple[int, ...], chunks: tuple[int, ...], given: Any) -> None:
    """Every shard holds whole chunks: each shard size a multiple of the chunk size."""
    for axis, (shard, chunk) in enumerate(zip(shards, chunks, strict=True)):
        if shard % chunk:
            raise ArgumentValueError(
                f"shards={given!r} ({shards}) is not a multiple of the chunks {chunks} along "
                f"axis {axis} ({shard} is not a multiple of {chunk}); a shard holds whole "
                "chunks: pass shards that are multiples of chunks"
            )


def _normal_grid(name: str, value: Any, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    if value is None:
        return None
    if isinstance(value, int | np.integer) and not isinstance(value, bool):
        grid = (int(value), *shape[1:])
    elif isinstance(value, Sequence) and all(isinstance(v, int | np.integer) for v in value):
        grid = tuple(int(v) for v in value)
    else:
        raise ArgumentTypeError(f"{name} must be an int (rows) or a tuple of ints, got {value!r}")
    if len(grid) != len(shape) or any(g < 1 for g in grid):
        raise ArgumentValueError(
            f"{name}={value!r} does not fit the output's shape {shape}: one positive size per axis"
        )
    return grid


def output_store(out: Any, storage_options: dict[str, Any] | None, backend: str) -> Any:
    """``out`` as zarr writes to it: a URL opened writable on its backend, else as given.

    Raises
    ------
    ArgumentTypeError
        ``out`` is not a path, URL or Zarr store (an int, say).
    ArgumentValueError
        ``out`` is an empty path (Zarr would write into the current
        directory), an existing file, or a URL no installed backend writes
        (an unknown protocol, one without a bucket or host).
    """
    if isinstance(out, os.PathLike):
        out = os.fspath(out)
    if isinstance(out, bytes) or not isinstance(
        out, str | zarr.abc.store.Store | zarr.storage.StorePath | Mapping
    ):
        raise ArgumentTypeError(
            "out must be a path, URL or Zarr store (e.g. 'out.zarr', 's3://bucket/out.zarr', "
            f"zarr.storage.MemoryStore()), got {type(out).__name__} {out!r}"
        )
    protocol = out.split("://", 1)[0].lower() if isinstance(out, str) and "://" in out else None
    if protocol in (None, "file"):
        if storage_options:
            raise ArgumentValueError(
                f"storage_options={storage_options!r} apply to an output URL (s3://, gs://, "
                f"...), not to {out!r}"
            )
        if isinstance(out, str):
            _check_out_path(out, out.split("://", 1)[1] if protocol else out)
        return out
    chosen = resolve_backend(backend, protocol)
    assert chosen is not None and isinstance(out, str)
    try:
        return url_store(out, storage_options, chosen, read_only=False)
    except (ArgumentTypeError, ArgumentValueError):
        raise
    except ImportError as exc:  # fsspec has no filesystem installed for the protocol
        raise ArgumentValueError(
            f"out={out!r}: {protocol}:// URLs need a package that is not installed ({exc})"
        ) from exc
    except (ValueError, TypeError) as exc:  # fsspec: "Protocol not known", a bad URL
        raise ArgumentValueError(
            f"out={out!r} is not a URL an output can be written to: {exc}"
        ) from exc


def _check_out_path(out: str, path: str) -> None:
    """A local output path: not empty (the current directory) and not an existing file."""
    if not path.strip():
        raise ArgumentValueError(
            f"out={out!r} is an empty path, which would write the output into the current "
            "directory; name the output's directory, e.g. out='normalised.zarr'"
        )
    if os.path.exists(path) and not os.path.isdir(path):
        raise ArgumentValueError(
            f"out={out!r} is an existing file, not a directory; a Zarr output is a "
            "directory: remove the file or choose another path"
        )


def _open_output(
    out: Any,
    name: str | None,
    shape: tuple[int, ...],
    dtype: np.dtype[Any],
    chunks: tuple[int, ...],
    shards: tuple[int, ...] | None,
    compressors: Any,
    fingerprint: dict[str, Any],
    overwrite: bool,
    resume: bool,
) -> zarr.Array:
    """The output array, created, or opened and checked for a resume."""
    config: Any = {"write_empty_chunks": True}  # zarr's ArrayConfigParams
    where = out if name is None else f"{out}/{name}"
    existing = None if overwrite else _existing(out, name)
    if existing is not None:
        if not resume:
            raise ArgumentValueError(
                f"output {where} exists: pass resume=True to complete it or overwrite=True "
                "to start over"
            )
        _check_fingerprint(existing, where, shape, dtype, chunks, shards, fingerprint)
        return existing.with_config(config)
    array = zarr.create_array(
        store=out,
        name=name,
        shape=shape,
        dtype=dtype,
        chunks=chunks,
        shards=shards,
        compressors=compressors,
        attributes={FINGERPRINT_KEY: fingerprint},
        overwrite=overwrite,
        config=config,
    )
    _Manifest(array).delete()  # sizes of an earlier output must not vouch for this one's
    return array


def _existing(out: Any, name: str | None) -> zarr.Array | None:
    """The array at ``out`` (under ``name``), or ``None`` if there is none."""
    try:
        return zarr.open_array(store=out, path=name or "", mode="r+")
    except (FileNotFoundError, KeyError, zarr.errors.NodeTypeValidationError):
        return None


def _check_fingerprint(
    array: zarr.Array,
    where: Any,
    shape: tuple[int, ...],
    dtype: np.dtype[Any],
    chunks: tuple[int, ...],
    shards: tuple[int, ...] | None,
    fingerprint: dict[str, Any],
) -> None:
    stored: Any = array.attrs.asdict().get(FINGERPRINT_KEY)
    if stored is None:
        raise ResumeMismatchError(
            f"output {where} exists but was not written by this library (no {FINGERPRINT_KEY!r} "
            "fingerprint in its attributes): pass overwrite=True to replace it"
        )
    first = ["job", "kind", "seed", "inputs", "contents", "func"]
    for key in first + sorted((set(stored) | set(fingerprint)) - set(first)):
        if key == "func" and isinstance(fingerprint.get(key), dict):
            raise ResumeMismatchError(
                f"cannot resume output {where}: {fingerprint[key]['unfingerprintable']}, so a "
                "change to func would go unseen and stale output be reused; pass overwrite=True "
                "to recompute it (with job_id=, a name you change whenever func changes, a "
                "later run can resume)"
            )
        if stored.get(key) == fingerprint.get(key):
            continue
        if key == "contents" and isinstance(stored.get(key), list):
            changed = [name for name, old, new in zip(fingerprint["inputs"], stored[key],
                       fingerprint[key], strict=False) if old != new]  # fmt: skip
            names = ", ".join(f"{i['name']!r} ({i['array']})" for i in changed) or "an input"
            raise ResumeMismatchError(
                f"cannot resume output {where}: input {names} changed since the output was "
                "written (another content hash of an in-memory array; for a Zarr array another "
                "listing of its stored objects: keys, sizes, modification times or ETags), so "
                "its written part is stale; pass overwrite=True to recompute it, or write to "
                "a new output"
            )
        if key == "func":
            raise ResumeMismatchError(
                f"cannot resume output {where}: func changed since the output was written (its "
                "code, constants, defaults, closure or the globals it uses, or the Python "
                "version), so its written part is stale; pass overwrite=True to recompute it "
                "with this func, or write to a new output"
            )
        if key == "contents":
            raise ResumeMismatchError(
                f"cannot resume output {where}: it was written without a fingerprint of its "
                "inputs' contents (by an earlier version); pass overwrite=True to recompute it"
            )
        raise ResumeMismatchError(
            f"cannot resume output {where}: its {key} was {stored.get(key)!r}, this job's is "
            f"{fingerprint.get(key)!r}; pass overwrite=True to start over (or the same "
            "job_id / input to resume)"
        )
    found = {
        "shape": tuple(array.shape),
        "dtype": np.dtype(array.dtype),
        "chunks": tuple(array.chunks),
        "shards": None if array.shards is None else tuple(array.shards),
    }
    wanted = {"shape": shape, "dtype": dtype, "chunks": chunks, "shards": shards}
    for key, value in wanted.items():
        if found[key] != value:
            raise ResumeMismatchError(
                f"cannot resume output {where}: its {key} is {found[key]}, this job writes "
                f"{value}; pass overwrite=True to start over"
            )


def _existing_keys(array: zarr.Array) -> set[str]:
    prefix = f"{array.path}/" if array.path else ""

    async def listed() -> set[str]:
        return {key async for key in array.store.list_prefix(prefix)}

    return sync(listed())


def _complete_units(
    outs: Sequence[zarr.Array], units: Sequence[tuple[int, int]], threads: int
) -> set[int]:
    """The units every stored object of which exists and decodes to the right shape.

    The stored objects of every other unit are deleted: a torn shard (or chunk) left by
    a killed writer would otherwise be read back by Zarr's read-modify-write of the shard
    and fail the unit's write (a checksum error) on every later resume.
    """
    present = [_existing_keys(out) for out in outs]
    manifest = _Manifest(outs[0]) if outs else None
    recorded = manifest.read() if manifest is not None else {}
    candidates = [
        number
        for number, (start, stop) in enumerate(units)
        if all(
            set(storage_keys(out, start, stop)) <= keys
            for out, keys in zip(outs, present, strict=True)
        )
    ]

    sizes = _sizes_of(outs[0], [k for n in candidates for k in _keys_of(outs, units[n])
                                if k in recorded]) if candidates and recorded else {}  # fmt: skip

    def decodes(number: int) -> bool:
        start, stop = units[number]
        keys = _keys_of(outs, (start, stop))
        if all(k in recorded and sizes.get(k) == recorded[k] for k in keys):
            return True  # written whole by a task that reported it: no decode
        try:
            return all(np.shape(out[start:stop])[0] == stop - start for out in outs)
        except Exception:  # a truncated or damaged object: written again
            return False

    with concurrent.futures.ThreadPoolExecutor(max(1, threads)) as pool:
        done = {n for n, ok in zip(candidates, pool.map(decodes, candidates), strict=True) if ok}
    for out, keys in zip(outs, present, strict=True):
        stale = [key for n, unit in enumerate(units) if n not in done
                 for key in storage_keys(out, *unit) if key in keys]  # fmt: skip
        if stale:
            _delete(out.store, stale)
    return done


def _keys_of(outs: Sequence[zarr.Array], unit: tuple[int, int]) -> list[str]:
    return [key for out in outs for key in storage_keys(out, *unit)]


def _sizes_of(array: zarr.Array, keys: Sequence[str]) -> dict[str, int]:
    async def sized() -> list[int]:
        import asyncio

        return await asyncio.gather(*(array.store.getsize(key) for key in keys))

    return dict(zip(keys, (int(n) for n in sync(sized())), strict=True))


class _Manifest:
    """The sizes of the objects of the units the tasks reported written, kept by the caller.

    One small JSON object beside the output's first array (``MANIFEST_NAME``
    under its path), rewritten by the caller only (never by a worker) at most
    every ``MANIFEST_SECONDS`` and at the end.  A resume takes a unit whose
    objects have the recorded sizes as complete without decoding it; any
    other unit whose objects exist is decoded.  A manifest that does not
    parse (a kill while it was written) is ignored: every unit is decoded.
    """

    def __init__(self, array: zarr.Array) -> None:
        self.array = array
        self.key = (f"{array.path}/" if array.path else "") + MANIFEST_NAME
        self.sizes: dict[str, int] = {}
        self.saved = time.monotonic()

    def read(self) -> dict[str, int]:
        try:
            found = sync(self.array.store.get(self.key, prototype=buffer_prototype()))
            if found is None:
                return {}
            value = json.loads(found.to_bytes())
            return {str(k): int(v) for k, v in value["sizes"].items()}
        except Exception:  # absent, truncated, not ours: decode every unit
            return {}

    def add(self, sizes: Mapping[str, int], force: bool = False) -> None:
        self.sizes.update(sizes)
        if force or time.monotonic() - self.saved >= MANIFEST_SECONDS:
            self.write()

    def delete(self) -> None:
        _delete(self.array.store, [self.key])

    def write(self) -> None:
        data = json.dumps({"sizes": self.sizes}).encode()
        sync(self.array.store.set(self.key, buffer_prototype().buffer.from_bytes(data)))
        self.saved = time.monotonic()


def _func_fingerprint(func: Any, fresh: bool) -> Any:
    """``func``'s fingerprint, or ``{"unfingerprintable": why}`` (warned of on a fresh output)."""
    try:
        return func_fingerprint(func)
    except Unfingerprintable as error:
        why = f"func cannot be fingerprinted ({error})"
        if fresh:
            warn_caller(UserWarning(
                f"{why}: an interrupted run of this job cannot be resumed unless job_id= names "
                "func's version (change it whenever func changes)"
            ))  # fmt: skip
        return {"unfingerprintable": why}


def _listed(array: zarr.Array, sized: bool) -> list[tuple[str, int]]:
    """``(key, size)`` of the stored objects of ``array`` (size 0 unless ``sized``)."""
    keys = sorted(_existing_keys(array))
    return list(_sizes_of(array, keys).items()) if sized else [(key, 0) for key in keys]


def _delete(store: Any, keys: Sequence[str]) -> None:
    """Delete ``keys`` from ``store`` (an absent key is no error)."""

    async def deleted() -> None:
        import asyncio

        await asyncio.gather(*(store.delete(key) for key in keys))

    sync(deleted())


def _qualname(func: Any) -> str:
    module = getattr(func, "__module__", None) or ""
    name = getattr(func, "__qualname__", None) or type(func).__qualname__
    return f"{module}.{name}" if module else name


# --------------------------------------------------------------------------
# The driver


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
) -> None:
    """Submit the tasks, ``in_flight`` at once, and collect their reports."""
    concurrency = read.io_concurrency or max(os.cpu_count() or 1, in_flight)
    runner = make_runner(read.client, in_flight=in_flight, read_workers=concurrency)
    policy = read.policy.limited(concurrency).tokened(stored_arrays(list(inputs.sources)))
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
    try:
        sources = runner.place(list(inputs.sources), read.timeout)
        while pending or flying:
            while pending and len(flying) < in_flight:
                task = pending.pop()
                pieces = tuple(tuple(pieces_for(task.samples, off)) for off in offsets)
                window = Window(task.number, 0, task.samples, pieces)
                dsk, key = window_graph(sources, window, token, policy, runner.scope,
                                        plan_order=True, decode_bytes=decode_bytes,
                                        kept=kept)  # fmt: skip
                write_key = (f"dzb-write-{token}", task.number)
                dsk[write_key] = (_write_unit, key, job, task.ranges)
                flying[runner.submit(dsk, write_key, -task.number)] = task
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


def _read_rows(inputs: _Inputs, stop: int, read: ReadOptions) -> list[np.ndarray]:
    """Samples ``0:stop`` of every input, read here (the probe; through the cache if any)."""
    if stop == 0:
        return [np.empty((0, *s.shape[1:]), dtype=s.dtype) for s in inputs.sources]
    samples = range(stop)
    pieces = tuple(tuple(pieces_for(samples, chunk_offsets(s.chunks[0]))) for s in inputs.sources)
    policy = read.policy.tokened(stored_arrays(list(inputs.sources)))
    dsk, key = window_graph(list(inputs.sources), Window(0, 0, samples, pieces), "probe",
                            policy, plan_order=True)  # fmt: skip
    return [np.asarray(rows) for rows, _ in dask.get(dsk, key)]


# --------------------------------------------------------------------------
# Public


def map_to_zarr(
    func: Callable[[Any], Any],
    data: Any,
    out: Any,
    *,
    dtype: Any = None,
    sample_shape: Sequence[int] | None = None,
    chunks: int | Sequence[int] | None = None,
    shards: int | Sequence[int] | None = None,
    compressors: Any = "auto",
    overwrite: bool = False,
    resume: bool = True,
    job_id: str | None = None,
    client: Any = None,
    timeout: float | None = None,
    missing: MissingMode = "fill",
    on_error: OnError = "raise",
    retries: int = DEFAULT_RETRIES,
    io_concurrency: int | None = None,
    cache: ChunkCache | None = None,
    read: ReadOptions | None = None,
    progress: bool = False,
    storage_options: dict[str, Any] | None = None,
    backend: str = "auto",
    stats: WriteStats | None = None,
) -> zarr.Array:
    """Write ``func`` of every chunk of samples of ``data`` as a new Zarr array.

    ``func`` maps the samples of one output chunk (or shard), shape
    ``(c, *sample)``, to ``(c, *out_sample)``: the same number of rows.  Each
    output chunk (or shard) is computed and written by one task, where the
    input rows are read (on a ``distributed`` worker with a client), so only a
    small report travels back.  Resumable: see the module docstring.

    Parameters
    ----------
    func : callable
        ``func(rows) -> rows``; with a dict (tuple) of arrays as ``data``, it
        receives a dict (tuple) of the same rows of each.  Picklable on a
        cluster.  Its result is cast to ``dtype``.
    data : array, path, URL, Collection or ChunkSubset, or a dict or tuple of them
        A ``zarr.Array``, ``dask.array.Array`` or ``numpy.ndarray`` (or what
        opens as one).  Samples along axis 0 (the arrays of a dict or tuple of equal length).
    out : path, URL or zarr store
        Where the output array is written (the root of ``out``).
    dtype : Any, optional
        The output's dtype and sample shape; either missing, ``func`` is
        called once on the first two samples to find it.
    sample_shape : Sequence[int], optional
        See ``dtype``.
    chunks : int or tuple of int, optional
        The output's chunk shape (an int: rows per chunk, the whole sample
        per chunk).  Default: the input's chunk rows along axis 0 (of the
        first array of a dict or tuple), whole samples.
    shards : int or tuple of int, optional
        Shard shape (an int: rows per shard); each shard is one task.
    compressors : default "auto"
        As for ``zarr.create_array``.
    overwrite : bool, default False
        Start over: an existing output is replaced.
    resume : bool, default True
        Complete an existing output written by the same job (same fingerprint):
        only chunks not complete are computed.  ``False``: an existing output is
        an error.
    job_id : str, optional
        Names the job in the fingerprint (default: ``func``'s qualified name),
        and ``func``'s version: with a ``job_id``, ``func``'s own fingerprint
        (its code, constants, defaults, closure and globals) is not checked on a
        resume, so change it whenever ``func`` changes.  Without one, a resume
        with a changed ``func`` is refused (and one whose ``func`` cannot be
        fingerprinted, holding a lock say, warns and cannot resume).
    read : ReadOptions, optional
        The read options as one value, to share one set across streams; or
        the flat read keywords ``client``, ``timeout``, ``missing``,
        ``on_error``, ``retries``, ``io_concurrency`` and ``cache``, each a
        field of [`ReadOptions`][daskzarr_batches.ReadOptions] (documented
        there once, with its default).  A flat one given beside ``read``
        must agree with it.
        As for [`map_chunks`][daskzarr_batches.map_chunks]; the read policy applies to the input.
        With
        ``on_error="skip"`` a chunk that touches an undecodable input chunk is
        left unwritten (a later run writes it).
    cache : ChunkCache, optional
        Decoded input chunks served from (and kept in) this cache, as for
        the streams (on a cluster, as cluster futures).
    progress : bool, default False
        A ``tqdm`` progress bar of the tasks.
    storage_options : dict, optional
        For an ``out`` URL (``s3://``, ``gs://``, ...): the options
        [`open_array`][daskzarr_batches.open_array] takes (credentials, endpoint), translated for
        the
        backend as when reading.
    backend : {"auto", "obstore", "fsspec"}, default "auto"
        The store an ``out`` URL is written through, as
        [`open_array`][daskzarr_batches.open_array]'s.
    stats : WriteStats, optional
        Filled with what this call did.

    Returns
    -------
    zarr.Array
        The output array.

    Raises
    ------
    ResumeMismatchError
        ``out`` holds an array of another job, ``func``, input (name, shape,
        dtype or contents), shape, dtype or grid.
    WindowError
        A task failed; ``func``'s exception (or the wrong shape it returned)
        chained, the message naming the output rows.

    Examples
    --------
    >>> import numpy as np, zarr, daskzarr_batches as dzb
    >>> x = zarr.create_array(zarr.storage.MemoryStore(), shape=(6, 2), chunks=(3, 2), dtype="f4")
    >>> x[:] = np.arange(12).reshape(6, 2)
    >>> y = dzb.map_to_zarr(lambda rows: rows * 2, x, zarr.storage.MemoryStore())
    >>> y[:, 0].tolist(), y.chunks
    ([0.0, 4.0, 8.0, 12.0, 16.0, 20.0], (3, 2))
    """
    if not callable(func):
        raise ArgumentTypeError(f"func must be callable, got {func!r}")
    stats = WriteStats() if stats is None else stats
    read = read_options(
        read, client=client, timeout=timeout, missing=missing, on_error=on_error,
        retries=retries, io_concurrency=io_concurrency, cache=cache,
    )  # fmt: skip
    inputs = _inputs(data)
    rows = inputs.rows
    dtype = None if dtype is None else _output_dtype(dtype)
    sample_shape = None if sample_shape is None else _sample_shape(sample_shape)
    out = output_store(out, storage_options, backend)
    existing = None if overwrite else _existing(out, None)
    if existing is not None:  # a resume: its dtype and sample shape, func not called
        dtype = existing.dtype if dtype is None else dtype
        sample_shape = existing.shape[1:] if sample_shape is None else sample_shape
    if dtype is None or sample_shape is None:
        probe = _read_rows(inputs, min(rows, 2), read)
        try:
            result = np.asarray(func(inputs.pack(probe)))
        except Exception as exc:
            raise WindowError(
                f"map_to_zarr({_qualname(func)}): func raised {type(exc).__name__}: {exc} on "
                f"samples 0:{min(rows, 2)}, the call that finds the output's dtype and sample "
                "shape (pass dtype= and sample_shape= to skip it)"
            ) from exc
        stats.func_calls += 1
        if result.ndim == 0 or result.shape[0] != min(rows, 2):
            raise ArgumentValueError(
                f"func returned shape {result.shape} for samples 0:{min(rows, 2)}: it must return "
                "the same number of rows as it is given"
            )
        if dtype is None:
            _check_dtype(f"func's result for samples 0:{min(rows, 2)}", result.dtype)
            dtype = result.dtype
        sample_shape = result.shape[1:] if sample_shape is None else sample_shape
    shape = (rows, *(int(n) for n in sample_shape))
    first = inputs.sources[0]
    grid = _normal_grid("chunks", chunks, shape) or (_chunk_rows(first), *shape[1:])
    grid = tuple(max(1, g) for g in grid)
    shard = _normal_grid("shards", shards, shape)
    if shard is not None:
        _check_shards(shard, grid, shards)
    fingerprint = {"job": job_id or _qualname(func), "kind": "map_to_zarr",
                   "inputs": inputs.identity(), "contents": inputs.contents()}  # fmt: skip
    if job_id is None:  # an explicit job_id names func's version instead
        fingerprint["func"] = _func_fingerprint(func, existing is None)
    array = _open_output(out, None, shape, np.dtype(dtype), grid, shard, compressors,
                         fingerprint, overwrite, resume)  # fmt: skip
    units = _units(rows, (shard or grid)[0])
    done = set() if overwrite else _complete_units([array], units, read.io_concurrency or 4)
    stats.units, stats.units_skipped = len(units), len(done)
    tasks = [
        _Task(n, range(a, b), np.array([[a, b]], dtype=np.int64))
        for n, (a, b) in enumerate(units)
        if n not in done
    ]
    in_flight = _in_flight(read)
    _run(tasks, inputs, _WriteJob(func, inputs, (array,)), read, in_flight, stats, progress,
         None, f"map_to_zarr({_qualname(func)})")  # fmt: skip
    return array


def _in_flight(read: ReadOptions) -> int:
    if read.client is not None:
        return max(2 * sum(read.client.nthreads().values()), 1)
    return read.io_concurrency or (os.cpu_count() or 1)


def write_shuffled(
    data: Any,
    out: Any,
    *,
    seed: int = 0,
    memory_budget: int | str = DEFAULT_WRITE_BUDGET,
    chunks: int | None = None,
    shards: int | None = None,
    compressors: Any = "auto",
    overwrite: bool = False,
    resume: bool = True,
    job_id: str | None = None,
    client: Any = None,
    timeout: float | None = None,
    missing: MissingMode = "fill",
    on_error: OnError = "raise",
    retries: int = DEFAULT_RETRIES,
    io_concurrency: int | None = None,
    cache: ChunkCache | None = None,
    read: ReadOptions | None = None,
    progress: bool = False,
    storage_options: dict[str, Any] | None = None,
    backend: str = "auto",
    stats: WriteStats | None = None,
) -> Any:
    """Write an exact seeded permutation of ``data``'s samples as new Zarr array(s).

    Output row ``i`` is input sample ``order[i]``, ``order`` the permutation
    of ``seed`` ([`shuffle_order`][daskzarr_batches.shuffle_order]); the arrays of a dict or tuple
    are
    permuted together, rows aligned.  Out of core: the permutation is cut
    into windows of whole output chunks (or shards) that fit
    ``memory_budget`` (as for the exact shuffle, whose read amplification
    it has), each read once and written by one task, so every output chunk
    is written exactly once.  Resumable as [`map_to_zarr`][daskzarr_batches.map_to_zarr]; training
    then
    reads the output with a sequential stream (read amplification 1).

    Parameters
    ----------
    data : array, path or URL, Collection, or a dict or tuple of them
        As for [`map_to_zarr`][daskzarr_batches.map_to_zarr].
    out : path, URL or zarr store
        A single array is written at the root of ``out``; a dict's arrays
        under their names, a tuple's under ``"0"``, ``"1"``, ...
    seed : int, default 0
    memory_budget : int or str, default 256 MiB
        Bytes of samples and decoded chunks of the windows in flight (one
        locally; on a cluster, as many as its threads, sharing it).  A
        window holds at least one output chunk (or shard).
    chunks : int, optional
        Rows per output chunk / shard (whole samples).  Default: the first
        array's chunk rows.
    shards : int, optional
        See ``chunks``.
    compressors : Any, default "auto"
        As for [`map_to_zarr`][daskzarr_batches.map_to_zarr] (``out`` may be a URL).
    overwrite : bool, default False
        See ``compressors``.
    resume : bool, default True
        See ``compressors``.
    job_id : str, optional
        See ``compressors``.
    progress : bool, default False
        See ``compressors``.
    stats : WriteStats, optional
        See ``compressors``.
    storage_options : dict[str, Any], optional
        See ``compressors``.
    backend : str, default "auto"
        See ``compressors``.
    read : ReadOptions, optional
        The read options as one value, to share one set across streams; or
        the flat read keywords ``client``, ``timeout``, ``missing``,
        ``on_error``, ``retries``, ``io_concurrency`` and ``cache``, each a
        field of [`ReadOptions`][daskzarr_batches.ReadOptions] (documented
        there once, with its default).  A flat one given beside ``read``
        must agree with it.
        As for [`map_to_zarr`][daskzarr_batches.map_to_zarr] (``job_id`` defaults to
        ``"write_shuffled"``).
    cache : ChunkCache, optional
        Decoded input chunks served from (and kept in) this cache.  Every
        window of a shuffle touches nearly every input chunk, so with a cache
        that holds the input each stored chunk is read from the store once
        over the whole job (read amplification 1) instead of once per window.

    Returns
    -------
    zarr.Array, dict or tuple of zarr.Array
        Shaped as ``data``.

    Examples
    --------
    >>> import numpy as np, zarr, daskzarr_batches as dzb
    >>> y = dzb.write_shuffled(np.arange(6), zarr.storage.MemoryStore(), seed=1)
    >>> sorted(y[:].tolist()), y[:].tolist() == dzb.shuffle_order(6, 1).tolist()
    ([0, 1, 2, 3, 4, 5], True)
    """
    stats = WriteStats() if stats is None else stats
    read = read_options(
        read, client=client, timeout=timeout, missing=missing, on_error=on_error,
        retries=retries, io_concurrency=io_concurrency, cache=cache,
    )  # fmt: skip
    inputs = _inputs(data)
    rows = inputs.rows
    seed = non_negative_int("seed", seed)
    budget = byte_size("memory_budget", memory_budget)
    first = inputs.sources[0]
    step = _rows_arg("chunks", chunks) or _chunk_rows(first)
    shard_rows = _rows_arg("shards", shards)
    if shard_rows is not None and shard_rows % step:
        raise ArgumentValueError(
            f"shards={shards!r} is not a multiple of the {step} rows of an output chunk "
            f"(chunks={chunks!r}{', the input chunk rows' if chunks is None else ''}); a shard "
            "holds whole chunks: pass shards that are a multiple of chunks"
        )
    fingerprint = {"job": job_id or "write_shuffled", "kind": "write_shuffled",
                   "seed": int(seed), "inputs": inputs.identity(),
                   "contents": inputs.contents()}  # fmt: skip
    out = output_store(out, storage_options, backend)
    outs = []
    for name, source in zip(inputs.names, inputs.sources, strict=True):
        sample = tuple(source.shape[1:])
        outs.append(
            _open_output(
                out, None if inputs.kind == "single" else name, tuple(source.shape),
                source.dtype, (step, *sample), None if shard_rows is None else
                (shard_rows, *sample), compressors, fingerprint, overwrite, resume,
            )
        )  # fmt: skip
    unit_rows = shard_rows or step
    units = _units(rows, unit_rows)
    done = set() if overwrite else _complete_units(outs, units, read.io_concurrency or 4)
    stats.units, stats.units_skipped = len(units), len(done)
    in_flight = _SHUFFLE_WINDOWS if read.client is None else _in_flight(read)
    row_bytes = sum(s.dtype.itemsize * math.prod(s.shape[1:]) for s in inputs.sources)
    plan = exact_budget(budget, max(row_bytes, 1), in_flight - 1)
    per_window = max(1, plan.window_rows // unit_rows)
    order = shuffle_order(rows, int(seed))
    tasks = []
    for number, first_unit in enumerate(range(0, len(units), per_window)):
        todo = [u for u in range(first_unit, min(first_unit + per_window, len(units)))
                if u not in done]  # fmt: skip
        if not todo:
            continue
        ranges = np.array([units[u] for u in todo], dtype=np.int64)
        samples = np.concatenate([order[a:b] for a, b in ranges.tolist()])
        tasks.append(_Task(number, samples, ranges))
    # the write reuses the window's decode allowance (its reads are done by then) for the
    # chunk buffers Zarr encodes from
    write_rows = max(unit_rows, plan.decode_bytes // max(row_bytes, 1) // unit_rows * unit_rows)
    job = _WriteJob(None, inputs, tuple(outs), write_rows)
    _run(tasks, inputs, job, read, in_flight, stats, progress, plan.decode_bytes,
         "write_shuffled")  # fmt: skip
    if inputs.kind == "single":
        return outs[0]
    if inputs.kind == "dict":
        return dict(zip(inputs.names, outs, strict=True))
    return tuple(outs)


def shuffle_order(rows: int, seed: int = 0) -> np.ndarray:
    """The permutation ``write_shuffled(..., seed=seed)`` writes: output row i is sample [i].

    Parameters
    ----------
    rows : int
        Samples of the array written.
    seed : int, default 0
        The seed given to ``write_shuffled`` (whose default is 0 too).

    Returns
    -------
    numpy.ndarray
        A permutation of ``range(rows)``.

    Raises
    ------
    ArgumentTypeError, ArgumentValueError
        ``rows`` or ``seed`` is not a non-negative integer.
    """
    rows = non_negative_int("rows", rows)
    seed = non_negative_int("seed", seed)
    return permutation(np.random.default_rng(np.random.SeedSequence(seed)), rows)


def _rows_arg(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int | np.integer) or isinstance(value, bool) or value < 1:
        raise ArgumentValueError(f"{name} must be a positive int (rows), got {value!r}")
    return int(value)
