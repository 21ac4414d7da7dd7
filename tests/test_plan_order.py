"""Windows read in plan order (what a cluster's workers return) hold the plan's samples.

On a cluster the read tasks write each chunk's rows straight to their place in
the window's plan order (``plan_order=True``), so the client cuts batches by
slicing.  These properties check the read layer directly, without a cluster:
every window of any plan, read in plan order, is exactly the plan's samples in
the plan's order, and the same rows as the ascending read gathered by
``Window.gather_index()`` (the local path).  ``tests/test_cluster.py`` checks
the streams end to end against the local scheduler.
"""

from __future__ import annotations

import numpy as np
import zarr
import zarr.storage
from hypothesis import given
from hypothesis import strategies as st
from strategies import make_data, property_settings, seeds, to_zarr
from test_plan import plans

from daskzarr_batches.plan.epoch import EpochPlan
from daskzarr_batches.plan.windows import Window, chunk_offsets
from daskzarr_batches.read.context import ReadContext
from daskzarr_batches.read.tasks import join_pieces
from daskzarr_batches.read.window import read_window

FAST = property_settings(40)


def windows_and_parts(plan: EpochPlan) -> list[Window]:
    """Every window, and its second half cut out as a window (a rank's share ends inside)."""
    out = []
    for window in plan.windows():
        out.append(window)
        if window.size > 1:
            out.append(plan.part(window, window.size // 2, window.size))
    return out


def check(array: object, data: np.ndarray, window: Window, position: int = 0) -> None:
    pieces = window.pieces[position]
    row_bytes = data[:1].nbytes
    expected = data[np.asarray(window.samples, dtype=np.int64)]
    ordered, _ = read_window(
        array, "x", window.size, row_bytes, pieces, ReadContext(plan_order=True)
    )
    np.testing.assert_array_equal(ordered, expected, strict=True)
    ascending, _ = read_window(array, "x", window.size, row_bytes, pieces)
    index = window.gather_index()
    np.testing.assert_array_equal(
        ascending if index is None else ascending[index], expected, strict=True
    )
    parts = [data[p.start : p.stop][p.take] for p in pieces]
    joined, _ = join_pieces(parts, [p.dest for p in pieces])
    np.testing.assert_array_equal(joined, expected, strict=True)


@FAST
@given(plans())
def test_numpy_windows_in_plan_order_hold_the_plans_samples(plan: EpochPlan) -> None:
    data = make_data((plan.n_samples, 3), "int64")
    for window in windows_and_parts(plan):
        for position in range(len(plan.offsets)):
            check(data, data, window, position)


@FAST
@given(
    n=st.integers(1, 80),
    chunk=st.integers(1, 20),
    mode=st.sampled_from(["none", "buffer", "exact"]),
    window_rows=st.integers(1, 50),
    seed=seeds,
    per_shard=st.sampled_from([None, 1, 3]),
)
def test_zarr_windows_in_plan_order_hold_the_plans_samples(
    n: int, chunk: int, mode: str, window_rows: int, seed: int, per_shard: int | None
) -> None:
    """Unsharded, and sharded (read by ``_shards``, which scatters to the plan order too)."""
    data = make_data((n, 2), "float32")
    if per_shard is None:
        array = to_zarr(data, (chunk, 2))
    else:
        array = zarr.create_array(
            zarr.storage.MemoryStore(), shape=data.shape, chunks=(chunk, 2),
            shards=(chunk * per_shard, 2), dtype=data.dtype,
        )  # fmt: skip
        array[:] = data
    offsets = chunk_offsets((chunk,) * (n // chunk) + ((n % chunk,) if n % chunk else ()))
    plan = EpochPlan(
        n_samples=n,
        offsets=(offsets,),
        batch_size=7,
        drop_remainder=False,
        shuffle=mode,
        window_rows=window_rows,
        seed=seed,
        epoch=0,
    )
    for window in windows_and_parts(plan):
        check(array, data, window)
