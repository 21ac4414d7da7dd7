"""Chunk readers: one way of reading an array's chunks each, chosen once per array.

A read task (``read.window``, ``read.tasks``) asks :func:`reader_for` which
:class:`ReadEngine` reads an array under a read policy, then has it read: a
window's pieces into their output (:meth:`ReadEngine.read_rows`) or one
stored block (:meth:`ReadEngine.read_block`).  A reader raises what failed;
the task's one fallback (``read.failures``) reads the pieces again one by one
and names the chunk.  ``None`` from a reader: not its read, the fallback
reads it (numpy arrays run by run, a block through the policy view).

=====================  ===================================================
:class:`ZarrReader`     Zarr's own pipeline: a sequential window as one slice,
                        else one read per chunk, concurrently on Zarr's loop
:class:`ZarrsReader`    the same through zarrs, the store read natively
:class:`DirectReader`   plain zstd chunks decoded straight into their rows
                        (``store.direct``), else its Zarr or zarrs reader
:class:`ShardReader`    one request per shard, its inner chunks decoded
                        concurrently (``store.shards``)
:class:`NumpyReader`    an in-memory array, one slice per run
:class:`DaskReader`     a dask array, one slice per run, computed
=====================  ===================================================
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
import zarr

from ..plan.windows import ChunkPiece
from .direct import DirectLayout
from .layout import object_shape
from .pipelines import codec_pipeline_of
from .policy import CancelScope, Ledger, ReadPolicy, native_view, policy_view, read_array, read_into
from .rows import (
    Placer,
    direct_at_once,
    direct_items,
    direct_targets,
    keeps_all,
    one_slice,
    owned,
    starts,
)
from .shards import read_sharded, reads_by_shard
from .zarr_adapter import async_array, codec_pipeline, is_zarr_pipeline, nd_buffer, sync

__all__ = [
    "Access",
    "DaskReader",
    "DirectReader",
    "NumpyReader",
    "ReadEngine",
    "RowsWindow",
    "ShardReader",
    "ZarrReader",
    "ZarrsReader",
    "read_runs_concurrently",
    "reader_for",
    "run_on_loop",
]


def run_on_loop(coro: Any, scope: CancelScope | None) -> Any:
    """Run ``coro`` on Zarr's event loop: through ``scope`` (cancellable) if given."""
    return sync(coro) if scope is None else scope.run(coro)


@dataclasses.dataclass(eq=False)
class Access:
    """How one read task reaches its array: through the policy view, and first natively.

    ``view`` is the policy view (:func:`~.policy.policy_view`: missing
    chunks, retries, the cache, counted in ``ledger``); :meth:`fast` is what
    a zarrs reader reads first (the array itself, its missing keys ``keys()``
    looked up first), made at its first use only.
    """

    array: Any
    name: str
    policy: ReadPolicy
    ledger: Ledger
    scope: CancelScope | None
    keys: Callable[[], list[str]]
    native: bool = False
    _fast: Any = None

    @functools.cached_property
    def view(self) -> Any:
        """The policy view, made at its first use."""
        return policy_view(self.array, self.name, self.policy, self.ledger)

    def fast(self) -> Any:
        """The array a zarrs reader reads first (else the policy view)."""
        if self._fast is None:
            native = None
            if self.native:
                native = native_view(
                    self.array, self.name, self.policy, self.ledger, self.keys, self.scope
                )
            self._fast = self.view if native is None else native
        return self._fast


@dataclasses.dataclass(eq=False)
class RowsWindow:
    """A window's pieces as a reader reads them into an output.

    ``runs``: runs of consecutive chunks (ascending); ``size`` rows of
    ``shape``/``dtype``; ``plan_order``: each chunk's rows to its pieces'
    ``dest``; at most ``limit_rows`` decoded rows in flight, each chunk placed
    as it arrives when ``streaming``; ``keep``: the direct decode may keep
    its buffers (not an exact window's budgeted ones).  ``out``: the output
    when the caller made it, else made by :meth:`output` (``make``).
    """

    runs: list[list[ChunkPiece]]
    size: int
    plan_order: bool
    limit_rows: int
    streaming: bool
    keep: bool
    make: Callable[[], np.ndarray]
    out: np.ndarray | None = None

    def output(self) -> np.ndarray:
        """The window's output, made at its first use."""
        if self.out is None:
            self.out = self.make()
        return self.out

    def ordered(self) -> list[ChunkPiece]:
        """The pieces in ascending chunk order, as placed."""
        return [piece for run in self.runs for piece in run]


class ReadEngine(Protocol):
    """One way of reading an array's chunks (see the module's table)."""

    #: ``"zarr"``, ``"zarrs"``, ``"direct"``, ``"shards"``, ``"numpy"`` or ``"dask"``
    kind: str
    #: whether the store is read natively (zarrs), beside the policy view
    native: bool

    def read_rows(self, access: Access, window: RowsWindow) -> np.ndarray | None:
        """Read ``window``'s pieces into its output and return it (``None``: not read here)."""

    def read_block(self, access: Access, slices: tuple[slice, ...]) -> np.ndarray | None:
        """One stored block (``slices`` of the array) as an array the caller owns, or ``None``."""


class ZarrReader:
    """Zarr's own pipeline: a sequential window as one slice, else each chunk concurrently."""

    kind = "zarr"
    native = False

    def read_rows(self, access: Access, window: RowsWindow) -> np.ndarray | None:
        """See :meth:`ReadEngine.read_rows`."""
        view, scope = access.view, access.scope
        fast = access.fast()
        if one_slice(window.runs, window.size, window.plan_order):
            with contextlib.suppress(Exception):  # read again below, chunk by chunk
                return self._slice(access, window, fast)
        out = window.output()
        inner = async_array(fast)
        if inner is None or (len(window.runs) == 1 and fast is view):
            return None  # one run of a failed slice: read again by the fallback
        chunks = [[piece] for piece in window.ordered()]
        read_runs_concurrently(
            inner, chunks, starts(chunks), Placer(out, window.plan_order), window.limit_rows,
            window.streaming, scope=scope,
            kept_rows=fast is view,  # zarrs reads an orthogonal selection through Zarr
            direct=True,  # zarrs too decodes a whole chunk straight into out= (Rust)
        )  # fmt: skip
        return out

    def _slice(self, access: Access, window: RowsWindow, fast: Any) -> np.ndarray:
        """The window read as one slice (decoded straight into a pooled output)."""
        runs, out, scope = window.runs, window.out, access.scope
        whole = (slice(runs[0][0].start, runs[0][-1].stop),)
        if out is not None and poolable(access.view):  # decoded straight into it
            read_into(fast, whole, out, scope)
            return out
        rows = np.asarray(read_array(fast, whole, scope))
        if out is not None:
            out[...] = rows
            return out
        return owned(rows)

    def read_block(self, access: Access, slices: tuple[slice, ...]) -> np.ndarray | None:
        """See :meth:`ReadEngine.read_block`: zarrs' native read first, else ``None``."""
        fast = access.fast()
        if fast is access.view:
            return None
        with contextlib.suppress(Exception):  # read again through the policy
            return owned(np.asarray(read_array(fast, slices, access.scope)))
        return None


class ZarrsReader(ZarrReader):
    """zarrs' Rust pipeline, the store read natively (missing chunks looked up first)."""

    kind = "zarrs"
    native = True


class DirectReader:
    """Plain zstd chunks (``store.direct``) decompressed straight into their rows.

    A window in ascending order whose pieces each keep rows of their chunk,
    chunks concurrently through the policy view (a chunk kept in part through
    a scratch chunk); any other window (plan order, a sequential one zarrs
    reads in one call) by ``other``, its Zarr or zarrs reader.
    """

    kind = "direct"

    def __init__(self, layout: DirectLayout, other: ZarrReader) -> None:
        self.layout = layout
        self.other = other
        self.native = other.native

    def read_rows(self, access: Access, window: RowsWindow) -> np.ndarray | None:
        """See :meth:`ReadEngine.read_rows`."""
        sequential = one_slice(window.runs, window.size, window.plan_order)
        if window.plan_order or (sequential and self.native):
            return self.other.read_rows(access, window)
        view = access.view  # through its policy store, if Zarr's own pipeline reads it
        exact = is_zarr_pipeline(codec_pipeline(view), exactly=True)
        direct = self.layout.reader(view.store_path.store) if exact else None
        ordered = window.ordered()
        items = None if direct is None else direct_items(ordered)
        if direct is None or items is None:
            return self.other.read_rows(access, window)
        out = window.output()
        spans, takes, targets = direct_targets(ordered, items, out, 0)
        at_once = direct_at_once(window.limit_rows, ordered)
        run_on_loop(direct.read(spans, targets, at_once, takes, window.keep), access.scope)
        return out

    def read_block(self, access: Access, slices: tuple[slice, ...]) -> np.ndarray | None:
        """One block of a local directory store decoded into its own array, else ``other``'s.

        No Zarr selection machinery per block, which costs about what
        decoding a small chunk does (docs/benchmarks.md, *Collections*; on an
        object store through obstore the read through Zarr measured faster).
        Not with a cache (consulted by Zarr's pipeline only), nor for a
        block cut across a trailing axis.
        """
        array = access.array
        if access.policy.cache is not None or not isinstance(array, zarr.Array):
            return self.other.read_block(access, slices)
        if type(array.store_path.store) is not zarr.storage.LocalStore:
            return self.other.read_block(access, slices)
        if any(
            (s.start, s.stop) != (0, n) for s, n in zip(slices[1:], array.shape[1:], strict=True)
        ):
            return self.other.read_block(access, slices)
        reader = self.layout.policy_reader(array, access.name, access.policy, access.ledger)
        first = slices[0]
        out = np.empty((first.stop - first.start, *array.shape[1:]), dtype=reader.dtype)
        run_on_loop(reader.read([(first.start, first.stop)], [out]), access.scope)
        return out


class ShardReader(ZarrReader):
    """A sharded array read by Zarr's own pipeline: one request per shard (``store.shards``).

    A window's shard rows are read several at a time, each shard's inner
    chunks decoded concurrently; a block is read through Zarr (a chunk
    stream reads whole shards with ``store.shards.read_shard_blocks``).
    """

    kind = "shards"

    def read_rows(self, access: Access, window: RowsWindow) -> np.ndarray | None:
        """See :meth:`ReadEngine.read_rows`."""
        view, out = access.view, window.output()
        ordered = window.ordered()
        shard_rows = max(object_shape(view)[0], 1)
        place = Placer(out, window.plan_order)
        coro = read_sharded(
            view, ordered, starts([[p] for p in ordered]), out, keeps_all,
            shards_in_flight=max(2, window.limit_rows // shard_rows),
            scatter=(lambda p, rows: place.piece(p, rows, 0)) if window.plan_order else None,
        )  # fmt: skip
        run_on_loop(coro, access.scope)
        return out


class NumpyReader:
    """An array in memory (numpy, or any array-like): one slice per run, copied into place."""

    kind = "numpy"
    native = False

    def read_rows(self, access: Access, window: RowsWindow) -> np.ndarray | None:
        """See :meth:`ReadEngine.read_rows`."""
        runs, scope = window.runs, access.scope
        if window.out is None and one_slice(runs, window.size, window.plan_order):
            whole = (slice(runs[0][0].start, runs[0][-1].stop),)
            return owned(self._rows(read_array(access.view, whole, scope)))
        place = Placer(window.output(), window.plan_order)
        for run, at in zip(runs, starts(runs), strict=True):
            span = (slice(run[0].start, run[-1].stop),)
            place(run, self._rows(read_array(access.view, span, scope)), at)
        return place.out

    def _rows(self, rows: Any) -> np.ndarray:
        return np.asarray(rows)

    def read_block(self, access: Access, slices: tuple[slice, ...]) -> np.ndarray | None:
        """See :meth:`ReadEngine.read_block`: read by the fallback (``None``)."""
        return None


class DaskReader(NumpyReader):
    """A dask array: one slice per run, computed on the calling thread."""

    kind = "dask"

    def _rows(self, rows: Any) -> np.ndarray:
        compute = getattr(rows, "compute", None)
        return np.asarray(rows if compute is None else compute(scheduler="sync"))


def reader_for(array: Any, policy: ReadPolicy) -> ReadEngine:
    """The :class:`ReadEngine` that reads ``array`` under ``policy``, chosen once.

    The shard reader where it reads the array (``store.shards.reads_by_shard``,
    the one shard decision), else zarrs when it reads the array natively (no
    cache: a cache is consulted by Zarr's pipeline only), the direct decode for plain zstd chunks
    (falling back on Zarr's or zarrs' reader), Zarr's pipeline, numpy or dask.
    Chosen once per array object and whether the policy has a cache (kept
    while the array lives), so that a task's choice costs a lookup.
    """
    if not isinstance(array, zarr.Array):
        return _DASK if hasattr(array, "dask") else _NUMPY
    uncached = policy.cache is None
    key = id(array)
    entry = _CHOSEN.get(key)
    if entry is None or entry[0]() is not array:
        entry = (weakref.ref(array, functools.partial(_forget, key)), {})
        _CHOSEN[key] = entry
    reader = entry[1].get(uncached)
    if reader is None:
        reader = entry[1][uncached] = _choose(array, uncached)
    return reader


def _forget(key: int, _: Any) -> None:
    _CHOSEN.pop(key, None)


def _choose(array: zarr.Array, uncached: bool) -> ReadEngine:
    if reads_by_shard(array, cached=not uncached):
        return ShardReader()
    native = uncached and codec_pipeline_of(array) == "zarrs"
    base = ZarrsReader() if native else ZarrReader()
    layout = DirectLayout.of(array)
    return base if layout is None else DirectReader(layout, base)


#: :func:`reader_for`'s choice per Zarr array object (``id``): while it lives, by cache or not
_CHOSEN: dict[int, tuple[weakref.ref[Any], dict[bool, ReadEngine]]] = {}
_NUMPY, _DASK = NumpyReader(), DaskReader()


def poolable(view: Any) -> bool:
    """Whether a window of ``view`` may go into a pooled buffer: a Zarr array of plain values."""
    dtype = np.dtype(view.dtype)
    return isinstance(view, zarr.Array) and not dtype.hasobject and dtype.kind in "biufcmMSUV"


def read_runs_concurrently(
    inner: Any,
    runs: Sequence[Sequence[ChunkPiece]],
    at_rows: Sequence[int],
    place: Any,
    limit_rows: int,
    streaming: bool,
    scope: CancelScope | None = None,
    kept_rows: bool = False,
    direct: bool = False,
) -> None:
    """Read runs on Zarr's event loop, at most ``limit_rows`` rows in flight.

    With ``direct``, a run that keeps every row of its chunks is decoded
    straight into its rows of the output (``place.target``: Zarr's ``out=``),
    which saves a slab allocated per run and a copy of every row (measured in
    docs/benchmarks.md, *Big samples*).

    When one run fails, the others are cancelled (a task group) before the
    error propagates.  Zarr does not cancel the other chunks of a failed
    multi-chunk slice, so callers pass runs of one chunk each: then no read
    of the window is left running.
    ``streaming``: place each run's rows as it arrives (on the event loop) to
    free its decoded chunks at once; else place them all afterwards on this
    thread, which measured faster when every row is kept (a full copy per run
    would otherwise hold up the loop).  When streaming, with ``kept_rows``
    a one-chunk run that keeps some rows asks Zarr for
    those rows only (``take``, an orthogonal selection), so Zarr allocates no
    copy of the whole chunk (not with zarrs, which would hand such a
    selection back to Zarr's own pipeline).
    """

    arrived: list[tuple[Sequence[ChunkPiece], np.ndarray, int]] = []

    async def read_all() -> None:
        ready = asyncio.Condition()
        in_flight = 0

        async def one(run: Sequence[ChunkPiece], at: int) -> None:
            nonlocal in_flight
            rows = run[-1].stop - run[0].start
            async with ready:
                await ready.wait_for(lambda: in_flight == 0 or in_flight + rows <= limit_rows)
                in_flight += rows
            try:
                target = place.target(run, at) if direct else None
                if target is not None:  # decoded straight into the window's rows
                    selection = (slice(run[0].start, run[-1].stop),)
                    await inner.get_orthogonal_selection(selection, out=nd_buffer(target))
                    return
                if kept_rows and streaming and len(run) == 1 and not isinstance(run[0].take, slice):
                    kept = (run[0].start + run[0].take,)
                    place(run, np.asarray(await inner.get_orthogonal_selection(kept)), at, True)
                    return
                slab = await inner.getitem((slice(run[0].start, run[-1].stop),))
                if streaming:
                    place(run, np.asarray(slab), at)
                    del slab
                else:
                    arrived.append((run, np.asarray(slab), at))
            finally:
                async with ready:
                    in_flight -= rows
                    ready.notify_all()

        async with asyncio.TaskGroup() as group:  # a failure cancels the siblings
            for run, at in zip(runs, at_rows, strict=True):
                group.create_task(one(run, at))

    run_on_loop(read_all(), scope)
    for run, slab, at in arrived:
        place(run, slab, at)
