"""The boxes a window of patches is filled through (issue 36): units whose union is a box are
read as one, so a forecast pair's chunks are decoded straight into one box, not copied
into the two boxes of the steps that share them."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from daskzarr_batches import patch_stream
from daskzarr_batches.plan.patches import merge_boxes
from daskzarr_batches.read import patch_boxes as read_patches
from tests.strategies import property_settings

SETTINGS = property_settings(30)

#: a box of a 3-d array: (start, length) per axis, small so that boxes often meet
_SPANS = st.tuples(st.integers(0, 6), st.integers(1, 4))
_BOX = st.tuples(_SPANS, _SPANS, _SPANS).map(lambda b: tuple(slice(a, a + n) for a, n in b))


def cells(box: tuple[slice, ...]) -> set[tuple[int, ...]]:
    return set(itertools.product(*(range(s.start, s.stop) for s in box)))


@SETTINGS
@given(boxes=st.lists(_BOX, max_size=8), limit=st.integers(1, 200))
def test_merged_boxes_are_exactly_the_unions_of_consecutive_boxes(
    boxes: list[tuple[slice, ...]], limit: int
) -> None:
    merged, firsts = merge_boxes(boxes, 1, limit)
    assert firsts[0] == 0 if boxes else firsts == [0]
    assert firsts[-1] == len(boxes) and len(firsts) == len(merged) + 1
    for box, lo, hi in zip(merged, firsts[:-1], firsts[1:], strict=True):
        assert lo < hi
        union = set().union(*(cells(b) for b in boxes[lo:hi]))
        assert cells(box) == union  # nothing read or held beyond what the boxes need
        assert hi - lo == 1 or len(union) <= limit


def test_forecast_pairs_decode_each_chunk_into_one_box(monkeypatch: pytest.MonkeyPatch) -> None:
    """One step per chunk: each pair's box is ``[t, t + 2)``, so before the merge every chunk
    but the ends had two boxes to be copied into; now a window's steps are one box."""
    import zarr

    x = np.random.default_rng(0).random((24, 5, 7), dtype="f4")
    z = zarr.create_array(zarr.storage.MemoryStore(), shape=x.shape, chunks=(1, 5, 7), dtype="f4")
    z[:] = x
    users: list[int] = []
    found = read_patches.box_chunks

    def spy(boxes: Any, bounds: Any) -> Any:
        spans, used_by = found(boxes, bounds)
        users.extend(len(u) for u in used_by.values())
        return spans, used_by

    monkeypatch.setattr(read_patches, "box_chunks", spy)
    stream = patch_stream(z, {0: 1}, 4, target_offset={0: 1}, window_bytes=8 * 5 * 7 * 4)
    got = list(stream)
    np.testing.assert_array_equal(np.concatenate([b[0] for b in got])[:, 0], x[:-1])
    np.testing.assert_array_equal(np.concatenate([b[1] for b in got])[:, 0], x[1:])
    assert users and max(users) == 1
