"""``streams.chunk_jobs``: the fold's tree, and graphs fused into one task per unit."""

from __future__ import annotations

import operator
from typing import Any

import dask
from hypothesis import given, settings
from hypothesis import strategies as st

from daskzarr_batches.streams.chunk_jobs import PairwiseFold, fused


def pair(left: Any, right: Any) -> Any:
    return (left, right)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 40), st.integers(1, 9))
def test_the_fold_pushed_in_parts_makes_the_same_tree(n: int, part: int) -> None:
    """The cluster path pushes a fold's leaves batch by batch: the tree is the same."""
    whole: PairwiseFold[Any] = PairwiseFold(pair)
    for i in range(n):
        whole.push(i)
    parts: PairwiseFold[Any] = PairwiseFold(pair)
    for start in range(0, n, part):
        for i in range(start, min(start + part, n)):
            parts.push(i)
        assert len(parts.partials) <= n.bit_length()
    assert parts.result() == whole.result()


def test_fused_inlines_tasks_used_once_and_keeps_shared_ones() -> None:
    dsk: dict[Any, Any] = {
        "a": (operator.add, 1, 2),
        ("b", 0): (operator.mul, "a", 10),
        "shared": (operator.neg, 5),
        ("c", 1): (operator.add, "shared", 1),
        "out": (sum, [("b", 0), ("c", 1), "shared", (operator.add, "a", 0)]),
    }
    graph = fused(dsk, "out")
    assert dask.get(graph, "out") == dask.get(dsk, "out")
    # "a" is used twice (by ("b", 0) and the inline task): kept, as is "shared"
    assert set(graph) == {"a", "shared", "out"}
    single = {"r": (operator.add, 1, 1), "w": (pair, "r", ("not", "a key"))}
    assert fused(single, "w") == {"w": (pair, (operator.add, 1, 1), ("not", "a key"))}
