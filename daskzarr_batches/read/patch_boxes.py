"""Filling a window's patch boxes from a Zarr array: each stored chunk one request to its reader.

``read/patches.py``'s window read cuts its patches from *boxes* (one per unit
of the window, the bounding box of its patches' cuts).  This module fills
them (:func:`read_boxes`): every stored chunk the boxes overlap is one
:class:`~daskzarr_batches.store.requests.ChunkRequest` to the array's reader
(``store.reader_hook.reader_of``), its part going straight into a box that
holds it (else into an array of its own), and then copied into the other
boxes that need it (a halo, a forecast target).  The library's reader runs
the planned read (:func:`_decode_into`: every chunk decoded concurrently on
Zarr's event loop, into its place, with Zarr's ``out=``); a cache above it
serves the chunks it holds, and a user's reader sees the rest.

With a :class:`~.chunk_share.ChunkShare` (a local patch stream's windows
hand chunks on), the chunks other windows may need are *claimed* first: a
chunk another window claimed before is taken from it (not asked of the
reader), one this window claims first is read with the others and then
handed on.  Every window hands on what it claimed before it waits for what
it was handed, so no two windows wait for each other.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import zarr

from ..errors import ReadCancelledError
from ..plan.budget import DECODE_GROUP_BYTES
from ..plan.patches import Box, box_chunks
from ..store.layout import block_key
from ..store.policy import Ledger, is_program_error, program_error
from ..store.reader_hook import Planned, planned, reader_of
from ..store.requests import ChunkRequest, read_each
from ..store.zarr_adapter import async_array, nd_buffer, sync
from .chunk_share import ChunkShare, _Abandoned
from .context import ReadContext
from .tasks import read_block, read_views, run_on_loop

__all__ = ["in_memory_boxes", "read_boxes"]

Block = tuple[int, ...]


@dataclasses.dataclass(eq=False)
class _Claim:
    """A chunk claimed in a :class:`ChunkShare`: its future, whether this window decodes
    it (``mine``: it publishes or abandons the future) and whether it was its last claim."""

    future: asyncio.Future[np.ndarray]
    mine: bool
    last: bool


@dataclasses.dataclass(frozen=True, eq=False)
class _Boxes:
    """One group of a window's boxes: per chunk its span and the boxes using it
    (``box_chunks``), the boxes and their arrays, the chunk bounds and the stream's
    ``coverage`` (the region any of its patches reaches)."""

    spans: dict[Block, Box]
    users: dict[Block, list[int]]
    boxes: Sequence[Box]
    filled: list[np.ndarray]
    bounds: Sequence[np.ndarray]
    coverage: Box

    def extent(self, block: Block) -> Box:
        """Chunk ``block``'s region of the array."""
        return tuple(
            slice(int(e[b]), int(e[b + 1])) for b, e in zip(block, self.bounds, strict=True)
        )

    def needed(self, block: Block) -> Box:
        """The part of chunk ``block`` any patch of the stream reaches (what is handed on)."""
        return _overlap(self.extent(block), self.coverage)

    def spread(self, block: Block, data: np.ndarray, region: Box, skip: int | None) -> None:
        """Copy ``data`` (``region`` of the array) into each box using ``block`` but ``skip``."""
        for number in self.users[block]:
            if number == skip:
                continue
            box = self.boxes[number]
            inner = _overlap(region, box)
            self.filled[number][_local(inner, box)] = data[_local(inner, region)]


def read_boxes(
    array: Any,
    name: str,
    boxes: Sequence[Box],
    bounds: Sequence[np.ndarray],
    ledger: Ledger,
    ctx: ReadContext,
    share: ChunkShare | None = None,
    around: tuple[Box, frozenset[Block]] = ((), frozenset()),
    filled: list[np.ndarray] | None = None,
) -> tuple[list[np.ndarray], set[Block], set[Block]]:
    """Fill each box from the chunks it overlaps, each chunk one request to the reader.

    ``array``: a Zarr array (its stored chunks) or a dask array (its blocks).
    ``filled``: the boxes' arrays (a window's patches in its outputs), else
    made here (from ``ctx.pool``).
    Also returns the chunks that did not decode (``on_error="skip"``) and
    the chunks this task read (not those another window handed on through
    ``share``).  ``around``: the region the stream's patches cover, and the
    chunks the windows next to this one may need (``edges``: claimed in
    ``share``, with any chunk another window claimed).  If the
    read fails, every chunk is read again on its own
    (:func:`~.tasks.read_block`), so that the error names it.
    """
    coverage, edges = around
    spans, users = box_chunks(boxes, bounds)
    dtype = np.dtype(array.dtype)
    pool = ctx.pool
    if filled is None:
        filled = [
            np.empty(shape, dtype=dtype) if pool is None else pool.take(shape, dtype)
            for shape in (tuple(s.stop - s.start for s in box) for box in boxes)
        ]
    job = _Boxes(spans, users, boxes, filled, bounds, coverage or _whole(bounds))

    def keys() -> list[str]:
        return [key for block in spans for key in block_key(array, block)]

    stored = isinstance(array, zarr.Array)
    fast, view = (
        read_views(array, name, ctx.policy, ledger, keys, ctx.scope) if stored else (array, array)
    )
    claims = _claim(share, spans, edges) if share is not None else {}
    bad: set[Block] = set()
    decoded: set[Block] = set()
    try:
        mine = [block for block in spans if block not in claims or claims[block].mine]
        _read_chunks(array, fast, view, job, mine, claims, ledger, ctx, share)
        decoded.update(mine)
        handed = {block: claim for block, claim in claims.items() if not claim.mine}
        if handed and share is not None:
            lost = _take_handed(share, handed, job, ctx.scope)
            if lost:  # their first claims failed: read here
                _read_chunks(array, fast, view, job, lost, {}, ledger, ctx, None)
                decoded.update(lost)
    except BaseException as exc:  # read again chunk by chunk, so that the error names the chunk
        _abandon(share, claims)  # the windows waiting for them read them themselves
        if isinstance(exc, ReadCancelledError) or not isinstance(exc, Exception) or not stored:
            raise  # (a dask array's error is its graph's own)
        if is_program_error(exc):
            error = program_error(exc, f"a window of patches of array {name}")
            raise error from error.__cause__
        for block, span in spans.items():
            data, report = read_block(array, name, block, span, ctx)
            ledger.retries += report.retries
            ledger.missing.extend(report.missing_keys)
            if data is None:  # on_error="skip": its patches leave the window
                bad.add(block)
                continue
            decoded.add(block)
            job.spread(block, data, span, None)
    return filled, bad, decoded


def _whole(bounds: Sequence[np.ndarray]) -> Box:
    return tuple(slice(0, int(e[-1])) for e in bounds)


def _claim(
    share: ChunkShare, spans: dict[Block, Box], edges: frozenset[Block]
) -> dict[Block, _Claim]:
    """Claim (on Zarr's loop) the chunks of ``spans`` other windows may need or claimed."""

    async def claim_all() -> dict[Block, _Claim]:
        return {
            block: _Claim(*share.claim(block))
            for block in spans
            if block in edges or block in share.entries
        }

    return sync(claim_all())


def _abandon(share: ChunkShare | None, claims: dict[Block, _Claim]) -> None:
    """Give up the chunks this window claimed first and did not hand on (its read failed)."""
    open_claims = [(b, c) for b, c in claims.items() if c.mine and not c.future.done()]
    if share is None or not open_claims:
        return

    async def abandon_all() -> None:
        for block, claim in open_claims:
            share.abandon(block, claim.future)

    sync(abandon_all())


def _take_handed(
    share: ChunkShare, handed: dict[Block, _Claim], job: _Boxes, scope: Any
) -> list[Block]:
    """Copy the chunks other windows hand on into the boxes; those whose read failed.

    The wait runs in the stream's cancellation ``scope``: a window whose read
    hangs does not hold up a stream being closed."""

    async def take_all() -> dict[Block, np.ndarray | None]:
        found: dict[Block, np.ndarray | None] = {}
        for block, claim in handed.items():
            try:
                found[block] = await share.wait(block, claim.future, claim.last)
            except _Abandoned:
                found[block] = None
        return found

    lost = []
    for block, data in run_on_loop(take_all(), scope).items():
        if data is None:
            lost.append(block)
        else:
            job.spread(block, data, job.needed(block), None)
    return lost


def _read_chunks(
    array: Any,
    fast: Any,
    view: Any,
    job: _Boxes,
    blocks: Sequence[Block],
    claims: dict[Block, _Claim],
    ledger: Ledger,
    ctx: ReadContext,
    share: ChunkShare | None,
) -> None:
    """Ask the reader for ``blocks`` (one request each), then copy each into its other boxes
    and hand on those claimed first (``claims``)."""
    requests, owners, regions = _requests(job, blocks, claims)
    if not requests:
        return
    largest = max(int(np.prod([s.stop - s.start for s in r])) for r in regions)
    limit = max(4, DECODE_GROUP_BYTES // max(largest * job.filled[0].itemsize, 1))
    scope = ctx.scope
    plan = Planned(
        requests, lambda: _decode_into(fast, requests, limit, scope), view,
        lambda coro: run_on_loop(coro, scope), limit, ledger.cache,
        served={} if claims and share is not None else None,
    )  # fmt: skip
    with planned(plan):
        reader_of(array, ctx.policy).read(requests)
    served = plan.served or {}
    handed = []
    for request, owner, region in zip(requests, owners, regions, strict=True):
        data = request.out[request.where]
        job.spread(request.chunk, data, region, owner)
        claim = claims.get(request.chunk)
        if claim is not None and share is not None:
            kept = served.get(request.chunk)
            if kept is not None:  # the cache's chunk (read-only to the share): no copy
                data = request.part(kept)
            elif owner is not None:  # a box goes back to the pool or out as a batch: a copy
                data = data.copy()
            handed.append((request.chunk, claim, data))
    if handed and share is not None:

        async def publish_all() -> None:
            for block, claim, data in handed:
                share.publish(block, claim.future, data, claim.last)

        sync(publish_all())


def _requests(
    job: _Boxes, blocks: Sequence[Block], claims: dict[Block, _Claim]
) -> tuple[list[ChunkRequest], list[int | None], list[Box]]:
    """One request per chunk of ``blocks``: its part (its span, or what is handed on when
    claimed) into a box holding all of it (that box: the owner), else an array of its own."""
    requests, owners, regions = [], [], []
    for block in blocks:
        region = job.needed(block) if block in claims else job.spans[block]
        extent = job.extent(block)
        owner = next(
            (n for n in job.users[block] if _overlap(region, job.boxes[n]) == region), None
        )
        if owner is None:  # no box holds all of it: an array of its own
            out = np.empty(tuple(s.stop - s.start for s in region), job.filled[0].dtype)
            where = tuple(slice(None) for _ in region)
        else:
            out, where = job.filled[owner], _local(region, job.boxes[owner])
        requests.append(ChunkRequest(block, extent, _local(region, extent), out, where))
        owners.append(owner)
        regions.append(region)
    return requests, owners, regions


def in_memory_boxes(
    array: np.ndarray, boxes: Sequence[Box], bounds: Sequence[np.ndarray], ctx: ReadContext
) -> list[np.ndarray]:
    """A numpy array's boxes: its declared chunks asked of its reader, whose planned read
    gives the boxes as views (nothing copied); a reader of the user's fills them instead."""
    spans, users = box_chunks(boxes, bounds)
    filled = [np.empty(tuple(s.stop - s.start for s in box), array.dtype) for box in boxes]
    job = _Boxes(spans, users, boxes, filled, bounds, _whole(bounds))
    requests, owners, regions = _requests(job, list(spans), {})
    plan = Planned(requests, lambda: [array[box] for box in boxes], array)
    with planned(plan):
        reader_of(array, ctx.policy).read(requests)
    if plan.ran:
        return list(plan.result)
    for request, owner, region in zip(requests, owners, regions, strict=True):
        job.spread(request.chunk, request.out[request.where], region, owner)
    return filled


def _decode_into(fast: Any, requests: Sequence[ChunkRequest], limit: int, scope: Any) -> None:
    """The planned read: each request's part decoded on Zarr's loop straight into its place
    (Zarr's selection with an ``out`` buffer: no copy), at most ``limit`` at once; a dask
    array's parts computed together (each block of its graph once), on this thread."""
    if not isinstance(fast, zarr.Array) and hasattr(fast, "dask"):
        import dask

        parts = dask.compute(*[fast[r.wanted()] for r in requests], scheduler="sync")
        for request, part in zip(requests, parts, strict=True):
            request.out[request.where] = part
        return
    inner = async_array(fast)
    if inner is None:
        read_each(fast, requests, lambda coro: run_on_loop(coro, scope), limit)
        return

    async def read_all() -> None:
        gate = asyncio.Semaphore(limit)

        async def one(request: ChunkRequest) -> None:
            async with gate:
                target = request.out[request.where]
                await inner.get_orthogonal_selection(request.wanted(), out=nd_buffer(target))

        async with asyncio.TaskGroup() as group:  # a failure cancels the siblings
            for request in requests:
                group.create_task(one(request))

    run_on_loop(read_all(), scope)


def _overlap(a: Box, b: Box) -> Box:
    """The intersection of two regions (empty slices where they do not meet)."""
    out = []
    for x, y in zip(a, b, strict=True):
        lo, hi = max(x.start, y.start), min(x.stop, y.stop)
        out.append(slice(lo, max(lo, hi)))
    return tuple(out)


def _local(inner: Box, outer: Box) -> Box:
    """``inner`` relative to the start of ``outer``."""
    return tuple(
        slice(a.start - b.start, a.stop - b.start) for a, b in zip(inner, outer, strict=True)
    )
