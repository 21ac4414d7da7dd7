"""The training Loader: epochs, structures, rank shares, resume (also elastic)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest
import zarr
from hypothesis import given
from hypothesis import strategies as st
from strategies import property_settings

import daskzarr_batches as dzb

MODES = ["none", "buffer", "exact"]


def data(n: int) -> tuple[np.ndarray, np.ndarray]:
    return np.arange(2 * n, dtype="i8").reshape(n, 2), np.arange(n, dtype="i8")


def loader(x: Any, mode: str, batch: int, **kw: Any) -> dzb.Loader:
    shuffle = {"shuffle": mode != "none", "seed": 7}
    if mode == "buffer":
        shuffle["shuffle_buffer_size"] = 9
    if mode == "exact":
        shuffle["memory_budget"] = 16 * 20  # windows of 20 samples of 16 bytes
    return dzb.Loader(x, batch, **shuffle, **kw)


def ids(batches: list[Any]) -> list[int]:
    return [int(i) for b in batches for i in (b["y"] if isinstance(b, dict) else b)]


@property_settings(40)
@given(
    n=st.integers(0, 120),
    batch=st.integers(1, 9),
    world=st.integers(1, 5),
    even=st.booleans(),
    mode=st.sampled_from(MODES),
)
def test_ranks_share_the_epoch_in_equal_steps(
    n: int, batch: int, world: int, even: bool, mode: str
) -> None:
    _, y = data(n)
    order = ids(list(dzb.Loader(y, 1, shuffle=mode != "none", seed=7, **_extra(mode))))
    shares = [
        ids(list(dzb.Loader(y, batch, shuffle=mode != "none", seed=7, rank=r, world_size=world,
                            even_batches=even, **_extra(mode))))
        for r in range(world)
    ]  # fmt: skip
    lengths = {
        len(dzb.Loader(y, batch, rank=r, world_size=world, even_batches=even)) for r in range(world)
    }
    assert len(lengths) == 1  # every rank takes the same number of steps
    per_rank = -(-n // world) if even else n // world
    assert all(len(s) == per_rank for s in shares)
    together = [i for s in shares for i in s]
    if even:
        assert sorted(set(together)) == list(range(n))  # every sample, some repeated to pad
        assert together[:n] == order  # the shares are the epoch's order, cut in turn
    else:
        assert len(set(together)) == len(together)  # never twice
        assert together == order[: per_rank * world]


def _extra(mode: str) -> dict[str, Any]:
    if mode == "buffer":
        return {"shuffle_buffer_size": 9}
    if mode == "exact":
        return {"memory_budget": 8 * 20}
    return {}


@property_settings(30)
@given(
    n=st.integers(1, 100),
    batch=st.integers(1, 7),
    world=st.integers(1, 3),
    mode=st.sampled_from(MODES),
    data_=st.data(),
)
def test_resume_after_batch_k_yields_exactly_the_rest(
    n: int, batch: int, world: int, mode: str, data_: st.DataObject
) -> None:
    x, y = data(n)
    arrays = {"x": x, "y": y}
    rank = data_.draw(st.integers(0, world - 1))
    full = list(loader(arrays, mode, batch, rank=rank, world_size=world))
    k = data_.draw(st.integers(0, len(full)))
    first = loader(arrays, mode, batch, rank=rank, world_size=world)
    it = iter(first)
    head = [next(it) for _ in range(k)]
    state = json.loads(json.dumps(first.state_dict()))
    again = loader(arrays, mode, batch, rank=rank, world_size=world)
    again.load_state_dict(state)
    rest = list(again)
    assert len(head) + len(rest) == len(full)
    for a, b in zip(head + rest, full, strict=True):
        np.testing.assert_array_equal(a["x"], b["x"])
        np.testing.assert_array_equal(a["y"], b["y"])
    assert (again.epoch == 1 and ids(list(again)) != []) or n == 0  # the next epoch follows


@property_settings(30)
@given(
    n=st.integers(1, 100),
    batch=st.integers(1, 6),
    old=st.integers(1, 4),
    new=st.integers(1, 4),
    mode=st.sampled_from(MODES),
    data_=st.data(),
)
def test_elastic_resume_covers_the_rest_of_the_epoch_exactly_once(
    n: int, batch: int, old: int, new: int, mode: str, data_: st.DataObject
) -> None:
    _, y = data(n)
    olds = [loader(y, mode, batch, rank=r, world_size=old, even_batches=False) for r in range(old)]
    k = data_.draw(st.integers(0, len(olds[0])))
    seen: list[int] = []
    for one in olds:
        it = iter(one)
        seen += ids([next(it) for _ in range(k)])
    state = olds[0].state_dict()
    rest: list[int] = []
    for r in range(new):
        fresh = loader(y, mode, batch, rank=r, world_size=new, even_batches=False)
        fresh.load_state_dict(state)
        rest += ids(list(fresh))
    assert len(set(seen + rest)) == len(seen + rest)  # nothing twice
    per_old = n // old  # the old shares dropped the tail of the epoch (even_batches=False)
    left = old * per_old - old * min(k * batch, per_old)
    assert len(rest) == new * (left // new)  # the rest, shared equally (its tail dropped)
    order = ids(list(loader(y, mode, 1)))  # the epoch's order of samples
    assert set(rest) <= set(order[: old * per_old]) - set(seen)


def test_epochs_follow_the_streams_order_and_set_epoch_chooses() -> None:
    _, y = data(50)
    one = dzb.Loader(y, 5, shuffle=True, seed=3, shuffle_buffer_size=20)
    epochs = [np.concatenate(list(one)).tolist() for _ in range(3)]
    for e, got in enumerate(epochs):
        stream = dzb.shuffled_batch_stream(y, 5, seed=3, epoch=e, shuffle_buffer_size=20)
        assert got == np.concatenate(list(stream)).tolist()
    assert epochs[0] != epochs[1] and one.epoch == 3
    one.set_epoch(1)
    assert np.concatenate(list(one)).tolist() == epochs[1]


def test_structures_come_back_as_given() -> None:
    x, y = data(10)
    w = np.ones(10, dtype="f4")
    assert isinstance(next(iter(dzb.Loader(x, 4))), np.ndarray)
    (only,) = next(iter(dzb.Loader((x,), 4)))
    assert only.shape == (4, 2)
    a, b = next(iter(dzb.Loader([x, y], 4)))
    assert a.shape == (4, 2) and b.shape == (4,)
    batch = next(iter(dzb.Loader({"x": x, "y": y, "w": w}, 4)))
    assert list(batch) == ["x", "y", "w"] and batch["w"].dtype == np.float32
    with pytest.raises(dzb.LengthMismatchError, match=r"x has 10 samples.*w has 9"):
        dzb.Loader({"x": x, "w": w[:9]}, 4)


def test_transform_is_applied_to_every_batch_without_changing_the_order() -> None:
    _, y = data(30)
    plain = dzb.Loader(y, 4, shuffle=True, seed=1)
    doubled = dzb.Loader(y, 4, shuffle=True, seed=1, transform=lambda b: b * 2)
    for a, b in zip(plain, doubled, strict=True):
        np.testing.assert_array_equal(a * 2, b)


def test_bad_arguments_and_foreign_states_are_named() -> None:
    _, y = data(10)
    with pytest.raises(dzb.ArgumentValueError, match="rank"):
        dzb.Loader(y, 2, rank=2, world_size=2)
    with pytest.raises(dzb.ArgumentValueError, match="shuffle=True"):
        dzb.Loader(y, 2, shuffle_buffer_size=4)
    with pytest.raises(dzb.ArgumentTypeError, match="transform"):
        dzb.Loader(y, 2, transform="double")  # type: ignore[arg-type]
    state = dzb.Loader(y, 2, shuffle=True, seed=1).state_dict()
    with pytest.raises(dzb.ArgumentValueError, match=r"seed=1 \(here 2\)"):
        dzb.Loader(y, 2, shuffle=True, seed=2).load_state_dict(state)
    with pytest.raises(dzb.ArgumentValueError, match="batch_size"):
        dzb.Loader(y, 3, shuffle=True, seed=1).load_state_dict(state)


def test_each_rank_reads_mostly_its_own_chunks(tmp_path: Any) -> None:
    x = zarr.create_array(tmp_path / "x.zarr", shape=(4000, 4), chunks=(100, 4), dtype="f4")
    x[:] = 1
    for mode, extra in (("none", {}), ("buffer", {"shuffle_buffer_size": 400})):
        for rank in range(4):
            one = dzb.Loader(x, 32, shuffle=mode != "none", seed=0, rank=rank, world_size=4,
                             window_bytes=400 * 16, **extra)  # fmt: skip
            for _ in one:
                pass
            # a share of 1000 samples, windows of ~400: at most one window read twice
            assert one.stats.read_amplification <= 1.5, (mode, rank, one.stats)


def test_resume_in_a_new_process(tmp_path: Any) -> None:
    x = zarr.create_array(tmp_path / "d.zarr", shape=(200,), chunks=(16,), dtype="i8")
    x[:] = np.arange(200)
    full = np.concatenate(list(dzb.Loader(x, 8, shuffle=True, seed=4, world_size=2, rank=1)))
    first = dzb.Loader(x, 8, shuffle=True, seed=4, world_size=2, rank=1)
    it = iter(first)
    head = [next(it) for _ in range(5)]
    (tmp_path / "state.json").write_text(json.dumps(first.state_dict()))
    code = f"""
        import json, numpy as np, zarr, daskzarr_batches as dzb
        x = zarr.open_array({str(tmp_path / "d.zarr")!r}, mode="r")
        again = dzb.Loader(x, 8, shuffle=True, seed=4, world_size=2, rank=1)
        again.load_state_dict(json.loads(open({str(tmp_path / "state.json")!r}).read()))
        print(json.dumps(np.concatenate(list(again)).tolist()))
    """
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    rest = json.loads(done.stdout)
    assert np.concatenate(head).tolist() + rest == full.tolist()


def test_sequential_rank_shares_and_resumes_start_with_one_chunk(tmp_path: Any) -> None:
    # The ramp restarts where a sequential stream starts (a rank's share, a resumed
    # epoch): with nothing prefetched its first batch reads one chunk, and the
    # batches are still the epoch's own.
    data = np.arange(4000 * 4, dtype="f4").reshape(4000, 4)
    x = zarr.create_array(tmp_path / "x.zarr", shape=data.shape, chunks=(100, 4), dtype="f4")
    x[:] = data
    for rank in range(4):
        one = dzb.Loader(x, 32, rank=rank, world_size=4, prefetch=0, window_bytes=800 * 16)
        batches = iter(one)
        for _ in range(5):
            next(batches)
        assert one.stats.chunks_read == 2  # 5 * 32 = 160 samples: chunks 0 and 1 of the share
        state = one.state_dict()
        again = dzb.Loader(x, 32, rank=rank, world_size=4, prefetch=0, window_bytes=800 * 16)
        again.load_state_dict(state)
        rest = iter(again)
        np.testing.assert_array_equal(next(rest), next(batches))
        assert again.stats.chunks_read == 1  # resumed inside chunk 1: that chunk only
        np.testing.assert_array_equal(np.concatenate([*rest]), np.concatenate([*batches]))


def test_a_later_epochs_shuffle_quality_warning_points_at_the_loop() -> None:
    """Raised in a dataclass's generated __init__ (the epoch's spec), it was attributed
    to '<string>'."""
    x = zarr.create_array(zarr.storage.MemoryStore(), shape=(20_000,), chunks=(200,), dtype="i8")
    x[:] = np.arange(20_000)
    with pytest.warns(dzb.ShuffleQualityWarning) as first:
        line = sys._getframe().f_lineno + 1
        loader = dzb.Loader(x, 64, shuffle=True, shuffle_buffer_size="auto", memory_budget=20_000)
    assert [(w.filename, w.lineno) for w in first] == [(__file__, line)]
    for _ in loader:  # epoch 0: planned when the loader was made
        pass
    with pytest.warns(dzb.ShuffleQualityWarning) as caught:
        line = sys._getframe().f_lineno + 1
        for _ in loader:  # epoch 1: the warning's line
            pass
    assert [(w.filename, w.lineno) for w in caught] == [(__file__, line)]
