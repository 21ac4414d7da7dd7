"""How an array's chunks sit in shards, and the one rule for whole or partial shard reads.

Pure arithmetic shared by the plan (units of whole shards, requests per
window) and the store's shard reader."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .windows import (
    IndexArray,
)

__all__ = ["ShardLayout", "reads_whole_shard", "shard_requests", "shard_units"]


@dataclass(frozen=True)
class ShardLayout:
    """How one stored array groups its axis-0 chunks into objects of the store.

    Attributes
    ----------
    chunks : int
        Axis-0 chunks per shard (1: unsharded, each chunk its own object).
    keys : int
        Stored objects per axis-0 shard (or chunk) row: more than one when the
        array is also split along other axes.
    inner : int
        Chunks along the other axes inside one shard (1 when unsharded).
    """

    chunks: int = 1
    keys: int = 1
    inner: int = 1

    @property
    def sharded(self) -> bool:
        """Whether stored objects hold several chunks (and an index)."""
        return self.chunks * self.inner > 1


def reads_whole_shard(needed: int, existing: int) -> bool:
    """Whether a read needing ``needed`` of a shard's ``existing`` axis-0 chunks
    fetches the whole shard in one request (at least half of it is needed),
    rather than its index and the needed chunks' byte ranges.

    The read layer and :meth:`EpochPlan.summary` share this rule.
    """
    return 2 * needed >= existing


def shard_requests(needed: Sequence[int], existing: int, layout: ShardLayout) -> int:
    """Store requests to read axis-0 chunks ``needed`` (ascending, local to the shard)
    of one shard row that holds ``existing`` of them.

    A whole shard is one request per stored object; otherwise the index and
    one request per run of consecutive needed chunks (adjacent byte ranges are
    merged), for each chunk along the other axes (an upper bound when those
    chunks are not stored one after another).
    """
    if not layout.sharded:
        return len(needed) * layout.keys
    if reads_whole_shard(len(needed), existing):
        return layout.keys
    runs = 1 + sum(1 for a, b in itertools.pairwise(needed) if b != a + 1)
    return layout.keys * (1 + runs * layout.inner)


def shard_units(
    offsets: Sequence[IndexArray], shards: Sequence[ShardLayout | None], max_rows: int
) -> IndexArray | None:
    """Units of whole shards: the boundaries shared by every array's shard grid.

    Used when some array is sharded and every such block fits ``max_rows``
    samples (a sequential window then starts and ends on shard boundaries, a
    buffered shuffle permutes whole shards); ``None`` otherwise, and the units
    are chunks (:func:`sample_units`).  An unsharded array's grid is its chunk
    grid, so paired arrays with different shard grids share units too.
    """
    if not any(layout is not None and layout.chunks > 1 for layout in shards):
        return None
    grids = []
    for off, layout in zip(offsets, shards, strict=True):
        step = 1 if layout is None else layout.chunks
        grids.append(np.union1d(off[::step], off[-1:]))
    common = functools.reduce(np.intersect1d, grids)
    if len(common) < 2 or np.diff(common).max() > max_rows:
        return None
    return common
