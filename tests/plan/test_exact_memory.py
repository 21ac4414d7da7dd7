"""The exact shuffle within its ``memory_budget``: the arithmetic, and RSS in a fresh process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st

import daskzarr_batches as dzb
from daskzarr_batches.plan.budget import DECODE_COPIES, INDEX_BYTES_PER_SAMPLE, exact_budget
from daskzarr_batches.plan.epoch import EpochPlan, permutation
from daskzarr_batches.plan.index_shuffle import IndexShuffle
from daskzarr_batches.plan.windows import chunk_offsets

MiB = 2**20


@given(
    budget=st.integers(1, 2**34),
    row_bytes=st.integers(1, 2**16),
    prefetch=st.integers(0, 8),
)
@settings(max_examples=300, deadline=None)
def test_windows_indices_and_decoding_fit_the_budget(
    budget: int, row_bytes: int, prefetch: int
) -> None:
    split = exact_budget(budget, row_bytes, prefetch)
    windows = split.window_rows * (row_bytes + INDEX_BYTES_PER_SAMPLE)
    held = (prefetch + 1) * (windows + DECODE_COPIES * split.decode_bytes)
    if budget // (prefetch + 1) >= 2 * (row_bytes + INDEX_BYTES_PER_SAMPLE):
        assert held <= budget
        # and the budget is used: one more sample per window would not fit
        bigger = (split.window_rows + 1) * (row_bytes + INDEX_BYTES_PER_SAMPLE)
        assert (prefetch + 1) * (bigger + DECODE_COPIES * split.decode_bytes) > budget
    else:  # a share smaller than two samples: windows of one sample
        assert split.window_rows >= 1
    assert split.decode_bytes <= budget // (prefetch + 1)


@given(n=st.integers(0, 5000), seed=st.integers(0, 2**32))
@settings(max_examples=60, deadline=None)
def test_permutation_is_numpys_in_half_the_bytes(n: int, seed: int) -> None:
    ids = permutation(np.random.default_rng(seed), n)
    assert ids.dtype == np.int32
    assert np.array_equal(ids, np.random.default_rng(seed).permutation(n))


def test_the_epoch_order_of_a_seed_is_its_keyed_bijection() -> None:
    plan = EpochPlan(1000, (chunk_offsets([100] * 10),), 7, False, "exact", 97, seed=3, epoch=2)
    order = np.concatenate([w.samples for w in plan.windows()])
    assert np.array_equal(order, IndexShuffle.of(1000, 3, 2)(np.arange(1000)))
    assert not np.array_equal(order, plan.rng().permutation(1000))  # the old order is gone


CHILD = """
import json, sys, psutil, zarr
sys.path.insert(0, sys.argv[3])
from benchmarks.suite.measure import PeakRSS
import daskzarr_batches as dzb
x = zarr.open_array(sys.argv[1], mode="r")
baseline = psutil.Process().memory_info().rss
with PeakRSS(0.002) as rss:
    stream = dzb.shuffled_batch_stream(x, 256, seed=0, memory_budget=int(sys.argv[2]))
    samples = sum(len(batch) for batch in stream)
print(json.dumps({"over": rss.peak - baseline, "samples": samples,
                  "windows": stream.stats.windows_read}))
"""


def test_peak_rss_stays_within_the_budget_in_a_fresh_process(tmp_path: Path) -> None:
    """16 MiB budget, 40 MiB array: RSS over the baseline <= budget + 16 MiB."""
    rows, cols = 163_840, 64  # 40 MiB of float32, 20 chunks of 2 MiB
    x = zarr.create_array(tmp_path / "x.zarr", shape=(rows, cols), chunks=(8192, cols), dtype="f4")
    x[:] = np.random.default_rng(0).standard_normal((rows, cols), dtype=np.float32)
    budget = 16 * MiB
    root = str(Path(__file__).resolve().parents[2])
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / "x.zarr"), str(budget), root],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["samples"] == rows
    assert result["windows"] == dzb.plan_epoch(x, 256, shuffle=True, memory_budget=budget).n_windows
    assert result["over"] <= budget + 16 * MiB, f"{result['over'] / MiB:.1f} MiB over the baseline"
