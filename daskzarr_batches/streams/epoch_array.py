"""An epoch as lazy dask arrays: each window's graph one block (``BatchStream.to_dask``).

The windows a stream would read become the blocks of a dask array along axis
0, each block the output of the window's own graph (``read.graphs.
window_graph``), as the stream reads it locally: rows in ascending sample
order (a plain zstd array's chunks decoded straight into them), put in
delivery order by the block's task.  A collection's window is the graph a
cluster reads instead (``plan_order``: each member's rows placed by the join),
since locally its member reads fill one shared output, which only threads of
one process can share, and a dask array may be computed anywhere.  The reads
of all the stream's outputs share one layer, so a paired stream's arrays
computed together read each window once.  Building the arrays reads nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from typing import Any

import dask.array as da
import numpy as np
from dask.highlevelgraph import HighLevelGraph

from ..plan.windows import Window
from ..read.context import ReadContext
from ..read.graphs import window_graph
from ..read.tasks import Key, cache_tokens, fresh_tokens, window_block
from ..store.policy import ReadPolicy
from ..store.sources import Source
from .base import stored_arrays
from .patch import Coords

__all__ = ["epoch_arrays", "pack_arrays"]


def epoch_arrays(
    sources: Sequence[Source],
    windows: Iterable[Window],
    policy: ReadPolicy,
    decode_bytes: int | None = None,
) -> tuple[da.Array, ...]:
    """One dask array per source: the samples of ``windows``, one block per window.

    Parameters
    ----------
    sources : sequence of Source
        The stream's sources (its outputs, in order).
    windows : iterable of Window
        The windows, in delivery order.
    policy : ReadPolicy
        The stream's read policy (request limit and cache included).
    decode_bytes : int, optional
        The decode limit of an exact window (``StreamSpec.decode_bytes``).

    Returns
    -------
    tuple of dask.array.Array
        Chunked along axis 0 by the windows (a single empty block when there
        are none), whole along every other axis.
    """
    token = uuid.uuid4().hex[:12]
    plan_order = any(_joins_members(source) for source in sources)
    reads_name = f"dzb-epoch-reads-{token}"
    reads: dict[Key, Any] = {}
    windows_read: list[tuple[Key, np.ndarray | None, int]] = []
    tokens = None  # a cache's tokens, looked up when the arrays are computed
    if policy.cache is not None:
        tokens = f"dzb-epoch-tokens-{token}"
        reads[tokens] = (cache_tokens, policy, stored_arrays(sources))
    for window in windows:
        ctx = ReadContext(policy, None, plan_order, decode_bytes)
        dsk, key = window_graph(sources, window, f"epoch-{token}", ctx)
        reads.update(dsk if tokens is None else _tokened(dsk, tokens))
        order = None if plan_order else window.gather_index()
        windows_read.append((key, order, window.size))
    arrays = []
    for output, source in enumerate(sources):
        name = f"dzb-epoch-{token}-{output}"
        tail = (0,) * (len(source.shape) - 1)
        rest = tuple((n,) for n in source.shape[1:])
        meta = source.meta
        blocks: dict[Key, Any] = {
            (name, i, *tail): (window_block, key, output, order, size, policy.missing)
            for i, (key, order, size) in enumerate(windows_read)
        }
        if not windows_read:  # an empty epoch: one empty block
            blocks[(name, 0, *tail)] = source.empty_rows()
        sizes = tuple(size for _, _, size in windows_read) or (0,)
        graph = HighLevelGraph(
            {reads_name: reads, name: blocks}, {reads_name: set(), name: {reads_name}}
        )
        arrays.append(da.Array(graph, name, (sizes, *rest), meta=meta))
    return tuple(arrays)


def _tokened(dsk: dict[Key, Any], tokens: str) -> dict[Key, Any]:
    """``dsk`` with each task that reads through a cache taking its tokens from task ``tokens``.

    The stream looked its arrays' stored versions up when it was made; a dask
    array may be computed later and again, after the arrays were written in
    place, so its reads take the versions of the moment (``fresh_tokens``),
    and a rewritten array's chunks are read again instead of served stale.
    """
    out: dict[Key, Any] = {}
    for key, task in dsk.items():
        if (
            isinstance(task, tuple)
            and task
            and callable(task[0])
            and any(
                isinstance(arg, ReadContext) and arg.policy.cache is not None for arg in task[1:]
            )
        ):
            task = (fresh_tokens, tokens, *task)
        out[key] = task
    return out


def _joins_members(source: Source) -> bool:
    """Whether ``source`` reads through a collection (its members' reads joined)."""
    return source.joins_members  # a collection, or a subset or patches of one


def pack_arrays(template: Any, flat: Sequence[da.Array]) -> Any:
    """The arrays in a patch stream's layout (``Layout.template``), as its batches are packed.

    An origins leaf with xarray coordinates is a dict of the origins and
    each coordinate's values at them (one ``map_blocks`` per coordinate).
    """
    if isinstance(template, int):
        return flat[template]
    if isinstance(template, Coords):
        index = flat[template.index]
        found: dict[str, da.Array] = {"index": index}
        for name, axis, values in template.dims:
            found[name] = index[:, axis].map_blocks(_take, values, dtype=values.dtype)
        return found
    if isinstance(template, dict):
        return {key: pack_arrays(value, flat) for key, value in template.items()}
    return tuple(pack_arrays(value, flat) for value in template)


def _take(index: np.ndarray, values: np.ndarray) -> np.ndarray:
    return values[index]
