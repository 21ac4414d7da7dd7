"""An epoch as lazy dask arrays: each window's graph one block (``BatchStream.to_dask``).

The windows a stream would read become the blocks of a dask array along axis
0, each block the output of the window's own graph (``read.graphs.
window_graph``) with its rows in delivery order (``plan_order``: every
chunk's rows written straight to their place, as on a cluster).  The reads
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
from ..read.graphs import window_graph
from ..read.tasks import Key, window_block
from ..store.policy import ReadPolicy
from ..store.sources import Source
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
    reads_name = f"dzb-epoch-reads-{token}"
    reads: dict[Key, Any] = {}
    windows_read: list[tuple[Key, int]] = []
    for window in windows:
        dsk, key = window_graph(sources, window, f"epoch-{token}", policy, None, True, decode_bytes)
        reads.update(dsk)
        windows_read.append((key, window.size))
    arrays = []
    for output, source in enumerate(sources):
        name = f"dzb-epoch-{token}-{output}"
        tail = (0,) * (len(source.shape) - 1)
        rest = tuple((n,) for n in source.shape[1:])
        meta = np.empty((0,) * len(source.shape), source.dtype)
        blocks: dict[Key, Any] = {
            (name, i, *tail): (window_block, key, output, size, policy.missing)
            for i, (key, size) in enumerate(windows_read)
        }
        if not windows_read:  # an empty epoch: one empty block
            blocks[(name, 0, *tail)] = np.empty((0, *source.shape[1:]), source.dtype)
        sizes = tuple(size for _, size in windows_read) or (0,)
        graph = HighLevelGraph(
            {reads_name: reads, name: blocks}, {reads_name: set(), name: {reads_name}}
        )
        arrays.append(da.Array(graph, name, (sizes, *rest), meta=meta))
    return tuple(arrays)


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
