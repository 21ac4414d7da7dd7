"""Mixtures (``mix``): weighted, seeded interleaves of datasets.

The draws per source follow the stop rule and the weights, every prefix of an epoch
holds the shares, each source is drawn in the order its own stream gives (cycled where
the rule says), pairs stay aligned, epochs repeat per (seed, epoch), ranks cover the
epoch with equal steps and resume is exact, also at another world size.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from hypothesis import given
from hypothesis import strategies as st
from strategies import property_settings, seeds, to_zarr

import daskzarr_batches as dzb
from daskzarr_batches.plan.mix import mix_counts, mix_seed
from daskzarr_batches.streams.spec import StreamSpec

WIDTH = 2
STOPS = st.sampled_from(["first_exhausted", "all_exhausted", "never"])


@st.composite
def mixtures(draw: st.DrawFn) -> dict[str, Any]:
    """Sources (numpy or zarr, random lengths and chunks), weights, stop rule, seed."""
    count = draw(st.integers(2, 3))
    lengths = draw(st.lists(st.integers(1, 40), min_size=count, max_size=count))
    weights = draw(st.lists(st.floats(0.1, 5.0), min_size=count, max_size=count))
    stop = draw(STOPS)
    samples = draw(st.integers(1, 120)) if stop == "never" else None
    sources, parts, at = [], [], 0
    for length in lengths:
        data = np.arange(at, at + length, dtype=np.int64)[:, None] * WIDTH + np.arange(WIDTH)
        chunk = draw(st.integers(1, 9))
        sources.append(data if draw(st.booleans()) else to_zarr(data, (chunk, WIDTH)))
        parts.append(data)
        at += length
    return {
        "sources": sources, "full": np.concatenate(parts), "lengths": lengths,
        "weights": weights, "stop": stop, "samples": samples, "seed": draw(seeds),
    }  # fmt: skip


def _mixed(case: dict[str, Any], paired: bool = False) -> Any:
    sources = case["sources"]
    if paired:
        sources = [{"x": s, "y": np.asarray(s[:, 0]) * 10} for s in sources]
    return dzb.mix(
        sources, case["weights"], seed=case["seed"], stop=case["stop"],
        samples_per_epoch=case["samples"],
    )  # fmt: skip


def _stream(data: Any, mode: str, batch: int, seed: int, **kw: Any) -> dzb.BatchStream:
    arrays = data if isinstance(data, tuple) else (data,)
    paired = len(arrays) == 2
    if mode == "none":
        plain = dzb.paired_batch_stream if paired else dzb.batch_stream
        return plain(*arrays, batch, **kw)
    buffer = 6 if mode == "buffer" else None
    shuffled = dzb.paired_shuffled_batch_stream if paired else dzb.shuffled_batch_stream
    return shuffled(*arrays, batch, seed=seed, shuffle_buffer_size=buffer, **kw)


@property_settings(60)
@given(
    st.lists(st.integers(1, 10_000), min_size=1, max_size=5),
    st.lists(st.floats(0.01, 10.0), min_size=5, max_size=5),
    STOPS,
    st.integers(1, 50_000),
    seeds,
)
def test_counts_and_schedule(lengths: list[int], weights: list[float], stop: str,
                             samples: int, seed: int) -> None:  # fmt: skip
    w = np.asarray(weights[: len(lengths)]) / sum(weights[: len(lengths)])
    n = np.asarray(lengths)
    counts = mix_counts(lengths, w, stop, samples if stop == "never" else None)
    total = int(counts.sum())
    if stop == "first_exhausted":
        assert (counts <= n).all() and (counts == n).any()
    elif stop == "all_exhausted":
        assert (counts >= n).all() and (counts == n).any()
    else:
        assert total == samples
    # the realised shares are the weights up to rounding: one sample per source
    assert (np.abs(counts - w * total) <= len(lengths)).all()
    if total >= 100 * len(lengths) ** 2:
        assert (np.abs(counts / total - w) <= 0.01).all()
    # every prefix of the epoch holds each source's share to within K + 1 draws (K sources)
    order = dzb.mix([np.zeros((k, 1)) for k in lengths], w, seed=seed, stop=stop,
                    samples_per_epoch=samples if stop == "never" else None)  # fmt: skip
    source = StreamSpec((order,), 10).plan().mix_order()[1]
    assert np.array_equal(np.bincount(source, minlength=len(lengths)), counts)
    seen = np.cumsum(np.eye(len(lengths), dtype=np.int64)[source], axis=0)
    expected = np.arange(1, total + 1)[:, None] * (counts / total)
    assert (np.abs(seen - expected) <= 1 + len(lengths)).all()


@property_settings(25)
@given(mixtures(), st.sampled_from(["none", "buffer", "exact"]), st.integers(1, 7), seeds)
def test_stream_draws_each_source_in_its_own_order(
    case: dict[str, Any], mode: str, batch: int, seed: int
) -> None:
    data = _mixed(case, paired=True)
    counts = mix_counts(case["lengths"], case["weights"], case["stop"], case["samples"])
    stream = _stream((data["x"], data["y"]), mode, batch, seed, return_sources=True)
    items = list(stream)
    x = np.concatenate([b for b, _, _ in items])
    sources = np.concatenate([s for _, _, s in items])
    ids = x[:, 0] // WIDTH
    starts = np.concatenate([[0], np.cumsum(case["lengths"])])
    assert np.array_equal(x, case["full"][ids])
    assert np.array_equal(starts[sources[:, 0]] + sources[:, 1], ids)  # provenance
    assert np.array_equal(np.concatenate([y for _, y, _ in items]), x[:, 0] * 10)  # pairs
    assert np.array_equal(np.bincount(sources[:, 0], minlength=len(counts)), counts)
    assert stream.stats.samples_per_source == counts.tolist()
    if case["stop"] == "first_exhausted":
        assert len(np.unique(ids)) == len(ids)  # no sample twice
    if case["stop"] == "all_exhausted":
        assert len(np.unique(ids)) == len(case["full"])  # every sample at least once
    for k, source in enumerate(case["sources"]):  # the order its own stream gives
        pair = (source, np.asarray(source[:, 0]) * 10)
        own = _stream(pair, mode, 1, mix_seed(seed, k))
        alone = np.concatenate([f for f, _ in own])[:, 0] // WIDTH
        drawn = ids[sources[:, 0] == k]
        assert np.array_equal(drawn, alone[np.arange(len(drawn)) % len(alone)])
    again = _stream((data["x"], data["y"]), mode, batch, seed)
    assert np.array_equal(np.concatenate([f for f, _ in again]), x)  # per (seed, epoch)


def _within(got: np.ndarray, whole: np.ndarray, spare: int) -> None:
    """``got`` is ``whole`` as a multiset, less at most ``spare`` samples.

    Without ``even_batches`` ranks share the epoch's draws in equal parts (what is
    left over below ``world_size`` samples is not delivered).
    """
    values, wanted = np.unique(whole, return_counts=True)
    have = np.zeros(len(values), dtype=np.int64)
    if len(got):
        where = np.searchsorted(values, got)
        assert (where < len(values)).all() and np.array_equal(values[where], got)
        have = np.bincount(where, minlength=len(values))
    assert (have <= wanted).all() and len(whole) - len(got) < spare


def _loader(data: Any, batch: int, world: int, rank: int, epoch: int, **kw: Any) -> dzb.Loader:
    loader = dzb.Loader(data, batch, shuffle=True, shuffle_buffer_size=5, seed=3, rank=rank,
                        world_size=world, **kw)  # fmt: skip
    loader.set_epoch(epoch)
    return loader


@property_settings(15)
@given(mixtures(), st.integers(1, 3), st.integers(1, 3), st.integers(1, 5), st.integers(0, 6),
       st.integers(0, 2))  # fmt: skip
def test_ranks_and_elastic_resume(
    case: dict[str, Any], world: int, new_world: int, batch: int, stop: int, epoch: int
) -> None:
    data = _mixed(case)
    whole = np.concatenate(list(_loader(data, batch, 1, 0, epoch)))[:, 0]
    # equal steps on every rank (even_batches), and the epoch's draws between them
    lengths = {len(_loader(data, batch, world, r, epoch)) for r in range(world)}
    assert len(lengths) == 1
    split = [_loader(data, batch, world, r, epoch, even_batches=False) for r in range(world)]
    parts = [b[:, 0] for loader in split for b in loader]  # none: fewer draws than ranks
    got = np.concatenate(parts) if parts else whole[:0]
    _within(got, whole, world)
    # stop every rank after `stop` batches, resume at another world size
    old = [_loader(data, batch, world, r, epoch, even_batches=False) for r in range(world)]
    used = []
    for loader in old:
        it = iter(loader)
        for _ in range(min(stop, len(loader))):
            used.append(next(it)[:, 0])
    states = [loader.state_dict() for loader in old]
    rest = []
    for r in range(new_world):
        new = _loader(data, batch, new_world, r, 0, even_batches=False)
        new.load_state_dict(states)
        rest.extend(b[:, 0] for b in new)
    delivered = np.concatenate([*used, *rest]) if used or rest else np.empty(0)
    _within(delivered, whole, world + new_world)
    # same world size: the rest of the epoch exactly
    one = _loader(data, batch, 1, 0, epoch)
    it = iter(one)
    head = [next(it)[:, 0] for _ in range(min(stop, len(one)))]
    again = _loader(data, batch, 1, 0, 0)
    again.load_state_dict(one.state_dict())
    tail = [b[:, 0] for b in again]
    assert np.array_equal(np.concatenate([*head, *tail]), whole)


#: the new process: rebuild the mixture from the stores, load the states, print the rest
RESUME = """
import json, sys
import numpy as np, zarr, daskzarr_batches as dzb

root, states, world = sys.argv[1], json.load(open(sys.argv[2])), int(sys.argv[3])
ranks = [int(r) for r in sys.argv[4].split(",")]
sources = [zarr.open_array(f"{root}/s{k}.zarr", mode="r") for k in range(2)]
data = dzb.mix(sources, [2.0, 1.0], seed=7)
rest = []
for rank in ranks:
    loader = dzb.Loader(data, 8, shuffle=True, shuffle_buffer_size=32, seed=5, rank=rank,
                        world_size=world, even_batches=False)
    loader.set_epoch(1)
    loader.load_state_dict(states)
    rest.append(np.concatenate([b[:, 0] for b in loader]).tolist() if len(loader) else [])
print(json.dumps(rest))
"""


def _resume_elsewhere(tmp_path: Path, states: Any, world: int, ranks: list[int]) -> list[list[int]]:
    """Each of ``ranks``' rest of the epoch, resumed from ``states`` in a new Python process."""
    (tmp_path / "state.json").write_text(json.dumps(states))
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", textwrap.dedent(RESUME), str(tmp_path),
         str(tmp_path / "state.json"), str(world), ",".join(map(str, ranks))],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    rest: list[list[int]] = json.loads(done.stdout)
    return rest


def test_mixture_resumes_in_a_new_process(tmp_path: Path) -> None:
    # Stopped after some batches, the state's JSON is all a new process needs: at the
    # same world size it delivers the rest of the uncut run, at another one the new
    # ranks' rests cover what the old ranks had not used, each sample once.
    sources = []
    for k, (length, chunk) in enumerate([(300, 24), (140, 20)]):
        x = zarr.create_array(tmp_path / f"s{k}.zarr", shape=(length, 2), chunks=(chunk, 2),
                              dtype="i8")  # fmt: skip
        x[:] = np.arange(1000 * k, 1000 * k + length)[:, None] + np.zeros(2, dtype=np.int64)
        sources.append(x)
    data = dzb.mix(sources, [2.0, 1.0], seed=7)

    def loader(rank: int, world: int) -> dzb.Loader:
        one = dzb.Loader(data, 8, shuffle=True, shuffle_buffer_size=32, seed=5, rank=rank,
                         world_size=world, even_batches=False)  # fmt: skip
        one.set_epoch(1)
        return one

    whole = np.concatenate([b[:, 0] for b in loader(0, 1)])
    assert len(np.unique(whole)) == len(whole) == 420  # first_exhausted: 280 + 140, once each
    # exact: rank 1 of 2 stopped after 6 batches resumes where it stopped
    cut = loader(1, 2)
    full = np.concatenate([b[:, 0] for b in loader(1, 2)])
    it = iter(cut)
    head = np.concatenate([next(it)[:, 0] for _ in range(6)])
    (rest,) = _resume_elsewhere(tmp_path, cut.state_dict(), 2, [1])
    assert head.tolist() + rest == full.tolist()
    # elastic: both ranks of 2 stopped after 5 and 9 batches, resumed by 3 ranks
    old = [loader(r, 2) for r in range(2)]
    used = []
    for one, steps in zip(old, (5, 9), strict=True):
        it = iter(one)
        used.extend(next(it)[:, 0] for _ in range(steps))
    rests = _resume_elsewhere(tmp_path, [one.state_dict() for one in old], 3, [0, 1, 2])
    delivered = np.concatenate([*used, *[np.asarray(r, dtype=np.int64) for r in rests]])
    assert len(np.unique(delivered)) == len(delivered)  # each sample once
    _within(delivered, whole, 2 + 3)  # and all of the epoch but what equal shares leave over
    assert {len(r) for r in rests} <= {len(rests[0])}  # equal shares of the rest


def test_buffered_mixture_reads_each_chunk_once(tmp_path: Path) -> None:
    # Windows of whole buffers of each source: every stored chunk decoded once per
    # epoch (planned and delivered), each sample once, each source in its own order.
    sources = [to_zarr(np.arange(n)[:, None] + 10_000 * k, (50, 1)) for k, n in
               enumerate((2000, 1000))]  # fmt: skip
    data = dzb.mix(sources, [2.0, 1.0], seed=3)
    stream = dzb.shuffled_batch_stream(data, 32, seed=9, shuffle_buffer_size=200)
    assert stream.summary().read_amplification == 1.0
    ids = np.concatenate(list(stream))[:, 0]
    assert stream.stats.chunks_read == 60
    assert sorted(ids.tolist()) == [*range(2000), *range(10_000, 11_000)]
    for k, source in enumerate(sources):
        alone = dzb.shuffled_batch_stream(source, 1, seed=mix_seed(9, k), shuffle_buffer_size=200)
        assert np.array_equal(ids[ids // 10_000 == k], np.concatenate(list(alone))[:, 0])


def test_bad_arguments() -> None:
    a, b = np.zeros((4, 2)), np.zeros((6, 2))
    with pytest.raises(dzb.ArgumentValueError, match="weights"):
        dzb.mix([a, b], [1.0])
    with pytest.raises(dzb.ArgumentValueError, match="positive"):
        dzb.mix([a, b], [1.0, 0.0])
    with pytest.raises(dzb.ArgumentValueError, match="samples_per_epoch"):
        dzb.mix([a, b], [1, 1], stop="never")
    with pytest.raises(dzb.ArgumentValueError, match="stop"):
        dzb.mix([a, b], [1, 1], stop="sometimes")
    with pytest.raises(dzb.ArgumentValueError, match="empty"):
        dzb.mix([a, b[:0]], [1, 1])
    with pytest.raises(dzb.ArgumentValueError, match="not a mixture"):
        dzb.paired_batch_stream(dzb.mix([a, b], [1, 1]), dzb.concat([a, b]), 2)
    m = dzb.mix([a, b], [1, 3], stop="all_exhausted")
    assert (
        isinstance(m, dzb.Mixture) and len(m) == sum(m.counts) == 16
    )  # b cycled: 6 of 0.75 against 4 of 0.25
    assert dzb.count_batches(m, 3) == 6
