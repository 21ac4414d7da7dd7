"""Which patches a chunk that does not decode (or is absent) takes out of a window.

With ``on_error="skip"``: the patches a bad chunk touches (:func:`_touching`),
the runs of patch ids each skipped chunk took out (:func:`_runs`) and the
chunks whose store keys were absent (:func:`_missing_blocks`), for
``read/patches.py``'s window read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..plan.patches import Box, Cut, box_chunks
from ..store.layout import block_key

Block = tuple[int, ...]


def _touching(
    origins: np.ndarray, cuts: Sequence[Cut], bad: set[Block], bounds: Sequence[np.ndarray]
) -> np.ndarray:
    """Which patches have a cut overlapping a chunk in ``bad``."""
    drop = np.zeros(len(origins), dtype=bool)
    for block in bad:
        lo = np.array([int(e[b]) for b, e in zip(block, bounds, strict=True)])
        hi = np.array([int(e[b + 1]) for b, e in zip(block, bounds, strict=True)])
        for cut in cuts:
            start = origins + np.asarray(cut.shift)
            stop = start + np.asarray(cut.size)
            drop |= np.all((start < hi) & (stop > lo), axis=1)
    return drop


def _runs(
    ids: np.ndarray,
    drop: np.ndarray,
    origins: np.ndarray,
    cuts: Sequence[Cut],
    bad: set[Block],
    bounds: Sequence[np.ndarray],
) -> tuple[tuple[Block, int, int], ...]:
    """The skipped chunks, each with the runs of patch ids it took out of the window."""
    found = []
    for block in sorted(bad):
        mine = _touching(origins, cuts, {block}, bounds) & drop
        dropped = ids[mine]
        if not len(dropped):
            continue
        cuts_at = np.flatnonzero(np.diff(dropped) != 1) + 1
        for run in np.split(dropped, cuts_at):
            found.append((block, int(run[0]), int(run[-1]) + 1))
    return tuple(found)


def _missing_blocks(
    array: Any, boxes: Sequence[Box], bounds: Sequence[np.ndarray], missing: tuple[str, ...]
) -> tuple[Block, ...]:
    """The chunks whose store keys were absent."""
    if not missing:
        return ()
    absent = set(missing)
    spans, _ = box_chunks(boxes, bounds)
    return tuple(block for block in spans if absent.intersection(block_key(array, block)))
