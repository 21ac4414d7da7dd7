"""Decoded stored chunks handed on between the windows of one patch stream.

:class:`ChunkShare` (each chunk a window claims decoded once for every
window that needs it while it stays: the next window of a sequential
stream, every window that needs it until its last use in a shuffled one)
and :func:`_edges` (which chunks of a sequential window the windows next
to it may need).  The task that reads a window is ``read/patches.py``'s.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..plan.patches import Box, Cut, PatchGrid, box_chunks

Block = tuple[int, ...]


class ChunkShare:
    """Decoded stored chunks that the windows of one sequential patch stream hand on.

    Consecutive windows of a sequential patch stream need the same chunks
    where patches or targets cross a window's edge (a forecast target one
    step ahead needs the first step of the next window's chunks).  Each read
    task *claims* a chunk before decoding it: the first claim decodes the
    whole chunk and publishes it, any later claim (another window's, also one
    in flight at the same time) waits for it, so each chunk is decoded once
    for all the windows that need it while it stays here.  Finished chunks
    stay in a least-recently-used store of ``capacity`` bytes.  Used on this
    process's Zarr event loop only (every access is on that thread); on a
    cluster each task decodes its own chunks.

    A shuffled patch stream (buffered or exact) knows from its plan how many
    of its windows need each chunk (``uses``: a forecast target at ``t + 1``
    is another window's input when ``t + 1`` is not in the window): the
    windows share each such chunk, and it is released at its last claim
    instead of waiting for the least-recently-used order to drop it.

    Parameters
    ----------
    capacity : int
        Bytes of finished chunks kept (at least one chunk stays).
    uses : dict, optional
        Claims each chunk will see in the epoch (``None``: unknown, the
        chunks the windows next to each other share, kept by recency).
    """

    def __init__(self, capacity: int, uses: dict[Any, int] | None = None) -> None:
        self.capacity = capacity
        self.held = 0
        self.uses = uses
        self.entries: collections.OrderedDict[Any, asyncio.Future[np.ndarray]] = (
            collections.OrderedDict()
        )

    def shared(self, key: Any) -> bool:
        """Whether more than one window claims chunk ``key`` (``uses`` known)."""
        return self.uses is not None and self.uses.get(key, 0) > 1

    def _claimed(self, key: Any) -> bool:
        """Count one claim of ``key``; ``True`` when it was the last one (``uses`` known)."""
        if self.uses is None or key not in self.uses:
            return False
        self.uses[key] -= 1
        return self.uses[key] <= 0

    def _release(self, key: Any, future: asyncio.Future[np.ndarray]) -> None:
        """Drop ``key``'s entry at its last claim (its bytes, once it has them)."""
        if self.entries.get(key) is not future:
            return
        del self.entries[key]
        if future.done() and future.exception() is None:
            self.held -= future.result().nbytes

    def __reduce__(self) -> Any:  # a task pickled for a cluster decodes on its own
        return (_no_share, ())

    async def decode(self, key: Any, read: Any) -> np.ndarray:
        """The chunk ``key``: decoded by ``read()`` if first, else awaited from its first claim."""
        future, mine, last = self.claim(key)
        if not mine:
            try:
                return await self.wait(key, future, last)
            except _Abandoned:  # its first claim failed: decode it here
                future, mine, last = self.claim(key, last)
        if not mine:  # another claim took it over meanwhile
            return await self.wait(key, future, last)
        try:
            data = await read()
        except BaseException:
            self.abandon(key, future)
            raise
        self.publish(key, future, data, last)
        return data

    def claim(
        self, key: Any, last: bool | None = None
    ) -> tuple[asyncio.Future[np.ndarray], bool, bool]:
        """Claim chunk ``key`` (on the loop): its future, whether this claim decodes it, and
        whether it was the chunk's last claim.

        The first claim gets a new future (``mine``), which it must
        :meth:`publish` or :meth:`abandon`; a later one gets the first's, to
        :meth:`wait` for.  ``last`` given: the claim was counted already (a
        waiter whose first claim failed claims again).
        """
        if last is None:
            last = self._claimed(key)
        found = self.entries.get(key)
        if found is not None and not (found.done() and found.exception() is not None):
            self.entries.move_to_end(key)
            return found, False, last
        future: asyncio.Future[np.ndarray] = asyncio.get_running_loop().create_future()
        self.entries[key] = future
        return future, True, last

    async def wait(self, key: Any, future: asyncio.Future[np.ndarray], last: bool) -> np.ndarray:
        """The chunk another claim decodes (raises ``_Abandoned`` if that claim failed)."""
        data = await asyncio.shield(future)
        if last:
            self._release(key, future)
        return data

    def publish(
        self, key: Any, future: asyncio.Future[np.ndarray], data: np.ndarray, last: bool
    ) -> None:
        """Hand on chunk ``key``, decoded by the claim that got ``future`` first (on the loop)."""
        future.set_result(data)
        if last:  # no window claims it again
            if self.entries.get(key) is future:
                del self.entries[key]
            return
        if self.entries.get(key) is future:
            self.held += data.nbytes
            self._evict()

    def abandon(self, key: Any, future: asyncio.Future[np.ndarray]) -> None:
        """The first claim of ``key`` did not decode it: its waiters decode it themselves."""
        if self.entries.get(key) is future:
            del self.entries[key]
        if not future.done():
            future.set_exception(_Abandoned())
            future.exception()  # retrieved: no "never retrieved" message

    def _evict(self) -> None:
        while self.held > self.capacity and len(self.entries) > 1:
            key, oldest = next(iter(self.entries.items()))
            if not oldest.done():
                return
            del self.entries[key]
            if oldest.exception() is None:
                self.held -= oldest.result().nbytes


class _Abandoned(Exception):
    """The first claim of a shared chunk failed; a waiter decodes it itself."""


def _no_share() -> None:
    return None


def _edges(
    boxes: Sequence[Box],
    bounds: Sequence[np.ndarray],
    cuts: Sequence[Cut],
    origins: np.ndarray,
    grid: PatchGrid | None = None,
    ids: np.ndarray | None = None,
) -> frozenset[Block]:
    """The chunks of a sequential window that the windows before and after it may need.

    Along the first patched dim (the slowest of the C order) the windows
    before this one hold patches whose origins are at most that of the patch
    just before its first (``ids``: consecutive, ``grid``: their origins),
    and the windows after it patches whose origins are at least that of the
    patch just after its last: a chunk of this window that no cut of those
    reaches is needed by no other window (a patch of one step, sequential:
    none is).  Without ``grid``: along that dim the window owns the rows of
    chunks its patches' origins fall in, the windows next to it may need its
    first and last owned rows and it needs rows it does not own (its own
    halo, which the window after owns): those chunks are shared.  The others
    only this window needs (their boxes go back to the pool).
    """
    lead = cuts[0].axes[0] if cuts[0].axes else 0
    spans, _ = box_chunks(boxes, bounds)
    consecutive = ids is not None and len(ids) and int(ids[-1]) - int(ids[0]) + 1 == len(ids)
    if grid is not None and ids is not None and consecutive:
        edges = bounds[lead]
        reach = low = None
        if int(ids[0]) > 0:  # the furthest any earlier window's patches reach
            before = int(cuts[0].place(grid.origin_of(ids[:1] - 1))[0, lead])
            reach = max(before + c.shift[lead] + c.size[lead] for c in cuts)
        if int(ids[-1]) + 1 < grid.n_patches:  # the nearest any later window's patches start
            after = int(cuts[0].place(grid.origin_of(ids[-1:] + 1))[0, lead])
            low = min(after + c.shift[lead] for c in cuts)
        return frozenset(
            b
            for b in spans
            if (reach is not None and int(edges[b[lead]]) < reach)
            or (low is not None and int(edges[b[lead] + 1]) > low)
        )
    rows = np.searchsorted(bounds[lead], origins[:, lead], side="right") - 1
    owned = set(rows.tolist())
    ends = {min(owned), max(owned)} if owned else set()
    return frozenset(b for b in spans if b[lead] not in owned or b[lead] in ends)
