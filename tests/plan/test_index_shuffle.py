"""The exact order as a keyed bijection (issue 39), over sizes from 1 to 1e9.

Small epochs are checked whole; huge ones through the plan directly, a few windows
each: a window's ids map back (``inverse``) to exactly its positions, so windows of
one epoch never share a sample.  Ranks, resume and processes agree on one order;
the order mixes like a uniform permutation.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import dask.array as da
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import daskzarr_batches as dzb
from daskzarr_batches.plan.batching import share
from daskzarr_batches.plan.epoch import EpochPlan
from daskzarr_batches.plan.index_shuffle import IndexShuffle
from daskzarr_batches.plan.windows import chunk_offsets

ROOT = Path(__file__).resolve().parents[2]
SIZES = st.one_of(st.integers(1, 3000), st.integers(1, 10**9))


def big_plan(n: int, window_rows: int, seed: int, epoch: int, batch: int = 256) -> EpochPlan:
    chunk = 65_536
    sizes = [chunk] * (n // chunk) + ([n % chunk] if n % chunk else [])
    return EpochPlan(n, (chunk_offsets(sizes),), batch, False, "exact", window_rows, seed, epoch)


@given(n=st.integers(1, 3000), seed=st.integers(0, 2**64 - 1), epoch=st.integers(0, 10**6))
@settings(max_examples=60, deadline=None)
def test_every_sample_once_per_epoch_small(n: int, seed: int, epoch: int) -> None:
    plan = EpochPlan(n, (chunk_offsets([7] * (n // 7) + [n % 7] * bool(n % 7)),), 5, False,
                     "exact", 97, seed, epoch)  # fmt: skip
    order = np.concatenate([np.asarray(w.samples) for w in plan.windows()])
    assert sorted(order.tolist()) == list(range(n))
    assert np.array_equal(plan.index_shuffle().inverse(order), np.arange(n))


@given(
    n=SIZES,
    window_rows=st.integers(1, 2**22),
    seed=st.integers(0, 2**32),
    epoch=st.integers(0, 100),
    at=st.floats(0, 1, exclude_max=True),
)
@settings(max_examples=25, deadline=None)
def test_windows_of_a_huge_epoch_are_disjoint_via_the_inverse(
    n: int, window_rows: int, seed: int, epoch: int, at: float
) -> None:
    plan = big_plan(n, min(window_rows, 2**16), seed, epoch)
    order = plan.index_shuffle()
    first = int(at * n)
    for window in plan.windows_between(first, min(n, first + 3 * plan.window_rows)):
        ids = np.asarray(window.samples, dtype=np.int64)
        assert ids.min() >= 0 and ids.max() < n
        # the ids map back to exactly the window's positions: no other window has them
        positions = np.arange(window.position, window.position + window.size)
        assert np.array_equal(order.inverse(ids), positions)
        rows = sum(len(range(*p.take.indices(p.rows))) if isinstance(p.take, slice)
                   else len(p.take) for p in window.pieces[0])  # fmt: skip
        assert rows == window.size  # every id in one chunk piece


@given(n=SIZES, world=st.integers(1, 9), seed=st.integers(0, 2**32), even=st.booleans())
@settings(max_examples=25, deadline=None)
def test_ranks_are_disjoint_and_equal(n: int, world: int, seed: int, even: bool) -> None:
    order = big_plan(n, 2**16, seed, 0).index_shuffle()
    shares = [share([(0, n)], rank, world, even) for rank in range(world)]
    assert len({sum(b - a for a, b in ranges) for ranges in shares}) == 1  # equal
    taken: list[np.ndarray] = []
    for ranges in shares:
        mine = []
        for a, b in ranges:  # each range's first and last samples
            for lo, hi in ((a, min(b, a + 64)), (max(a, b - 64), b)):
                ids = order.window(lo, hi)
                assert np.array_equal(order.inverse(ids), np.arange(lo, hi))
                mine.append(ids)
        taken.append(np.unique(np.concatenate(mine)))
    if not even or n % world == 0:  # no wrap-around: no sample in two ranks
        flat = np.concatenate(taken)
        assert len(np.unique(flat)) == len(flat)
    if n <= 3000:  # small: every rank's samples, whole
        got = [order(np.concatenate([np.arange(a, b) for a, b in r])) for r in shares if r]
        flat = np.concatenate(got) if got else np.zeros(0, dtype=np.int64)
        per_rank = -(-n // world) if even else n // world
        assert len(flat) == world * per_rank
        assert len(np.unique(flat)) == min(len(flat), n)


@given(n=st.integers(1, 600), batches=st.integers(0, 30), world=st.integers(1, 3))
@settings(max_examples=15, deadline=None)
def test_resume_is_exact(n: int, batches: int, world: int) -> None:
    data = np.arange(n, dtype="i8")
    for rank in range(world):
        whole = [
            b.tolist()
            for b in dzb.Loader(data, 8, shuffle=True, seed=5, rank=rank, world_size=world)
        ]  # epoch 0, uninterrupted
        loader = dzb.Loader(data, 8, shuffle=True, seed=5, rank=rank, world_size=world)
        it = iter(loader)
        first = [next(it).tolist() for _ in range(min(batches, len(whole)))]
        state = loader.state_dict()
        fresh = dzb.Loader(data, 8, shuffle=True, seed=5, rank=rank, world_size=world)
        fresh.load_state_dict(state)
        assert first + [b.tolist() for b in fresh] == whole


CHILD = """
import json, sys
import numpy as np
from daskzarr_batches.plan.index_shuffle import IndexShuffle
out = {}
for n in (1, 17, 10**6 + 3, 10**9):
    order = IndexShuffle.of(n, 12345, 3)
    out[str(n)] = order.window(0, 1000).tolist() + order.window(n - 1000, n).tolist()
print(json.dumps(out))
"""


def test_the_same_seed_gives_the_same_order_in_another_process() -> None:
    runs = [
        json.loads(
            subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                           check=True, cwd=ROOT, timeout=120).stdout
        )
        for _ in range(1)
    ]  # fmt: skip
    here = {
        str(n): IndexShuffle.of(n, 12345, 3).window(0, 1000).tolist()
        + IndexShuffle.of(n, 12345, 3).window(n - 1000, n).tolist()
        for n in (1, 17, 10**6 + 3, 10**9)
    }
    assert runs[0] == here
    # and another seed or epoch is another order
    assert IndexShuffle.of(10**6, 1, 0).window(0, 50).tolist() != here["1000003"][:50]
    assert not np.array_equal(IndexShuffle.of(1000, 0, 0).window(0, 1000),
                              IndexShuffle.of(1000, 0, 1).window(0, 1000))  # fmt: skip


def test_the_order_is_uniform_roughly() -> None:
    """Over 4,000 epochs, each of 10 samples lands at position 0 about equally (chi-square)."""
    n, epochs = 10, 4000
    first = np.asarray([IndexShuffle.of(n, 7, e)(np.asarray([0]))[0] for e in range(epochs)])
    counts = np.bincount(first, minlength=n)
    chi2 = float((((counts - epochs / n) ** 2) / (epochs / n)).sum())
    assert chi2 < 27.9  # 9 degrees of freedom, p = 0.001
    # pairs: the sample after a given one is uniform over the others (n = 64, 64 buckets)
    n = 64
    nxt = []
    for e in range(3000):
        order = IndexShuffle.of(n, 3, e)(np.arange(n))
        nxt.append(order[int(np.flatnonzero(order == 0)[0]) + 1] if order[-1] != 0 else -1)
    counts = np.bincount([v for v in nxt if v > 0], minlength=n)[1:]
    expected = counts.sum() / (n - 1)
    chi2 = float((((counts - expected) ** 2) / expected).sum())
    assert chi2 < 105  # 62 degrees of freedom, p = 0.001


@pytest.mark.parametrize("n", [20_000, 200_000])
def test_the_exact_order_mixes_like_an_exact_shuffle(n: int) -> None:
    """Batch mixing >= 0.95, neighbour entropy and displacement near 1 (data in order)."""
    x = da.zeros((n, 2), dtype="f4", chunks=(1000, 2))
    quality = dzb.plan_epoch(x, 64, shuffle=True, seed=3).quality
    assert quality.mixing is not None and quality.mixing >= 0.95
    assert quality.entropy >= 0.99
    assert 0.97 <= quality.displacement <= 1.03
