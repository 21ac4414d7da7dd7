"""A training loop over chunks that do not decode (``on_error="skip"``) is never silently wrong.

Resume is exact after skips (the state counts positions, skipped samples
included), ranks keep equal steps (the shortfall is filled from the rank's own
share), a state is checked field by field, an iteration that raised says so on
every later ``next()``, and a Loader refuses a second concurrent iteration.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import zarr
import zarr.storage
from hypothesis import given
from hypothesis import strategies as st
from strategies import property_settings
from zarr.core.buffer import default_buffer_prototype

import daskzarr_batches as dzb

MODES = ["none", "buffer", "exact"]

# skipping is what these tests are about (tests/read/test_read_policy.py checks the warning)
pytestmark = pytest.mark.filterwarnings("ignore::daskzarr_batches.SkippedChunksWarning")


def corrupt_arrays(
    n: int, chunk: int, bad: set[int], label_chunk: int | None = None
) -> dict[str, zarr.Array]:
    """``x`` (n, 2) and ``y`` (n,) = sample ids, in memory; chunks ``bad`` of x hold garbage."""
    root = zarr.group(store=zarr.storage.MemoryStore())
    x = root.create_array("x", shape=(n, 2), chunks=(chunk, 2), dtype="i8")
    y = root.create_array("y", shape=(n,), chunks=(label_chunk or chunk,), dtype="i8")
    x[:] = np.arange(2 * n, dtype="i8").reshape(n, 2)
    y[:] = np.arange(n, dtype="i8")
    garbage = default_buffer_prototype().buffer.from_bytes(b"not zstd at all")
    for index in bad:
        root.store._store_dict[f"x/c/{index}/0"] = garbage
    return {"x": x, "y": y}


def make(arrays: dict[str, Any], mode: str, batch: int, **kw: Any) -> dzb.Loader:
    shuffle: dict[str, Any] = {"shuffle": mode != "none", "seed": 5}
    if mode == "buffer":
        shuffle["shuffle_buffer_size"] = 7
    if mode == "exact":
        shuffle["memory_budget"] = 24 * 40  # windows of a few tens of samples
    return dzb.Loader(arrays, batch, on_error="skip", **shuffle, **kw)


def batches(loader: dzb.Loader | Iterator[Any], count: int | None = None) -> list[Any]:
    it = iter(loader)
    return list(it) if count is None else [next(it) for _ in range(count)]


def ids(got: list[Any]) -> list[int]:
    return [int(i) for b in got for i in b["y"]]


@property_settings(30)
@given(
    n=st.integers(1, 90),
    chunk=st.integers(3, 20),
    batch=st.integers(1, 9),
    mode=st.sampled_from(MODES),
    world=st.integers(1, 3),
    data_=st.data(),
)
def test_resume_after_skipped_chunks_is_exact_and_ranks_keep_their_steps(
    n: int, chunk: int, batch: int, mode: str, world: int, data_: st.DataObject
) -> None:
    n_chunks = -(-n // chunk)
    bad = data_.draw(st.sets(st.integers(0, n_chunks - 1), max_size=max(n_chunks - 1, 0)))
    rank = data_.draw(st.integers(0, world - 1))
    label_chunk = data_.draw(st.integers(3, 20))  # paired arrays chunked differently
    arrays = corrupt_arrays(n, chunk, bad, label_chunk)
    good = {i for i in range(n) if i // chunk not in bad}
    kw = {
        "rank": rank,
        "world_size": world,
        "even_batches": data_.draw(st.booleans()),
        "drop_remainder": data_.draw(st.booleans()),
    }

    clean = corrupt_arrays(n, chunk, set(), label_chunk)
    planned = batches(make(clean, mode, batch, **kw))
    mine = set(ids(batches(make(clean, mode, batch, **{**kw, "drop_remainder": False}))))
    if world > 1 and planned and not mine & good:  # nothing in the share to fill steps with
        with pytest.raises(dzb.ChunkReadError, match="every sample of its positions"):
            batches(make(arrays, mode, batch, **kw))
        return
    full = batches(make(arrays, mode, batch, **kw))
    for b in full:  # pairs aligned and true
        np.testing.assert_array_equal(b["x"][:, 0], b["y"] * 2)
    got = ids(full)
    assert set(got) <= good
    if world == 1:  # skips shorten the epoch: every readable sample at most once
        assert len(got) == len(set(got))
        if not kw["drop_remainder"]:
            assert sorted(got) == sorted(good)
    else:  # equal steps: exactly the planned batches and batch sizes, whatever was skipped
        assert [len(b["y"]) for b in full] == [len(b["y"]) for b in planned]
        assert set(got) <= mine  # filled from the rank's own share

    k = data_.draw(st.integers(0, len(full)))
    first = make(arrays, mode, batch, **kw)
    head = batches(first, k)
    state = json.loads(json.dumps(first.state_dict()))
    again = make(arrays, mode, batch, **kw)
    again.load_state_dict(state)
    rest = batches(again)
    assert len(head) + len(rest) == len(full)
    for a, b in zip(head + rest, full, strict=True):  # bit for bit the uninterrupted run
        np.testing.assert_array_equal(a["x"], b["x"], strict=True)
        np.testing.assert_array_equal(a["y"], b["y"], strict=True)


def test_resume_after_a_skipped_chunk_serves_no_sample_twice() -> None:
    """The reported case: 400 rows, one corrupt 20-row chunk, batch 16, three batches."""
    arrays = corrupt_arrays(400, 20, {2})
    for mode in MODES:
        first = make(arrays, mode, 16)
        head = ids(batches(first, 3))
        again = make(arrays, mode, 16)
        again.load_state_dict(json.loads(json.dumps(first.state_dict())))
        rest = ids(batches(again))
        assert len(head + rest) == 380 == len(set(head + rest)), mode


def test_a_state_after_a_short_last_batch_behind_a_skipped_chunk_resumes() -> None:
    """Found by the property above: the epoch's last chunk skipped, then a short last batch.

    The state said position 45 of 46 after 7 batches of up to 7 and was refused as
    "behind" them; a short batch ends the epoch, so the state is at its end.
    """
    arrays = corrupt_arrays(46, 15, {3}, 3)  # samples 45: the 4th chunk of x, one row
    first = make(arrays, "none", 7)
    assert [len(b["y"]) for b in batches(first, 7)] == [7] * 6 + [3]
    state = json.loads(json.dumps(first.state_dict()))
    assert state["position"] == 46
    again = make(arrays, "none", 7)
    again.load_state_dict(state)
    assert batches(again) == []


def test_ranks_stepping_together_all_finish_despite_a_skipped_chunk() -> None:
    """DDP-style: each step waits for every rank (an all-reduce); a missing step would hang."""
    arrays = corrupt_arrays(400, 20, {13})  # samples 260:280, in rank 1's share
    world = 2
    loaders = [make(arrays, "none", 16, rank=r, world_size=world) for r in range(world)]
    step = threading.Barrier(world, timeout=30)
    steps = [0] * world
    errors: list[BaseException] = []

    def train(rank: int) -> None:
        try:
            for _ in loaders[rank]:
                step.wait()  # the all-reduce
                steps[rank] += 1
        except BaseException as exc:
            errors.append(exc)
            step.abort()

    threads = [threading.Thread(target=train, args=(r,)) for r in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == [] and steps == [len(loaders[0])] * world == [13, 13]
    assert loaders[1].stats.samples_filled == 20 and loaders[0].stats.samples_filled == 0
    # the filled samples are the rank's own first samples, not another rank's
    assert loaders[1].stats.skipped[0].samples == range(260, 280)


def test_resumed_in_a_new_process_shape_with_elastic_world_size_needs_every_rank() -> None:
    arrays = corrupt_arrays(120, 10, {1, 8})
    olds = [make(arrays, "buffer", 8, rank=r, world_size=2) for r in range(2)]
    seen: list[int] = []
    for one in olds:
        seen += ids(batches(one, 4))
    states = [json.loads(json.dumps(one.state_dict())) for one in olds]
    fresh = make(arrays, "buffer", 8, rank=0, world_size=3)
    with pytest.raises(dzb.ArgumentValueError, match="states of all 2 old ranks"):
        fresh.load_state_dict(states[0])
    rest: list[int] = []
    for r in range(3):
        new = make(arrays, "buffer", 8, rank=r, world_size=3)
        new.load_state_dict(states)
        rest += ids(batches(new))
    good = {i for i in range(120) if i // 10 not in {1, 8}}
    assert len(set(seen)) == len(seen)
    # nothing an old rank delivered comes again, and no readable sample is lost
    assert not set(seen) & set(rest) and set(seen) | set(rest) == good


# --------------------------------------------------------------------------
# States are validated


def a_state() -> tuple[dzb.Loader, dict[str, Any]]:
    y = np.arange(100, dtype="i8")
    loader = dzb.Loader(y, 10, shuffle=True, seed=1, shuffle_buffer_size=30)
    it = iter(loader)
    next(it)
    return loader, loader.state_dict()


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"batches": 10**9}, r"state\['batches'\]=1000000000 is more than the 10 batches"),
        ({"batches": -1}, r"state\['batches'\] must be >= 0"),
        ({"batches": "3"}, r"state\['batches'\] must be an integer, got '3'"),
        ({"position": 500}, r"state\['position'\]=500 is past the end"),
        ({"position": 3}, r"state\['position'\]=3 is behind the 1 batch"),
        # on_error="raise" skips nothing: a position ahead of the batches is impossible
        (
            {"position": 16},
            r"state\['position'\]=16 does not fit state\['batches'\]=1: with "
            r"state\['on_error'\]='raise'",
        ),
        (
            {"position": 20, "batches": 0},
            r"state\['position'\]=20 does not fit "
            r"state\['batches'\]=0",
        ),
        ({"resumed": "abc"}, r"state\['resumed'\] must be None or a list"),
        ({"resumed": [[50, 150]]}, r"state\['resumed'\] must be None"),
        ({"resumed": [[10, 20], [15, 30]]}, r"state\['resumed'\] must be None"),
        ({"epoch": True}, r"state\['epoch'\] must be an integer, got True"),
        ({"rank": 3}, r"state\['rank'\]=3 is not below state\['world_size'\]=1"),
        ({"seed": 2}, r"seed=2 \(here 1\)"),
        ({"batch_size": 10.0}, r"batch_size=10.0 \(here 10\)"),
        ({"worker": [0, 2, 0]}, r"state\['worker'\]=\[0, 2, 0\] does not fit"),
        ({"on_error": "ignore"}, r"state\['on_error'\]='ignore'"),
        ({"version": 7}, r"state\['version'\]=7: not a Loader state"),
        ({"version": 1}, r"state\['version'\]=1: a Loader state of an older format"),
        ({"extra": 1}, r"unknown field\(s\) \['extra'\]"),
    ],
)
def test_a_garbled_state_is_refused_naming_the_field(change: dict[str, Any], match: str) -> None:
    _, state = a_state()
    fresh = dzb.Loader(np.arange(100, dtype="i8"), 10, shuffle=True, seed=1, shuffle_buffer_size=30)
    with pytest.raises(dzb.DaskZarrBatchesError, match=match):
        fresh.load_state_dict({**state, **change})
    del state["epoch"]
    with pytest.raises(dzb.ArgumentValueError, match=r"lacks the field\(s\) \['epoch'\]"):
        fresh.load_state_dict(state)
    assert (
        fresh.state_dict()
        == dzb.Loader(
            np.arange(100, dtype="i8"), 10, shuffle=True, seed=1, shuffle_buffer_size=30
        ).state_dict()
    )  # a refused state changes nothing


def test_a_state_of_the_old_buffered_order_is_refused_saying_why() -> None:
    # version 3 balanced the buffered windows (issue 35): a buffered state of version 2
    # would resume another order; sequential and exact orders did not change
    data = np.arange(100, dtype="i8")
    for kw in ({"shuffle": False}, {"shuffle": True, "seed": 1}):
        loader = dzb.Loader(data, 10, **kw)  # type: ignore[arg-type]
        it = iter(loader)
        next(it)
        state = loader.state_dict()
        assert state["version"] == 3
        fresh = dzb.Loader(data, 10, **kw)  # type: ignore[arg-type]
        fresh.load_state_dict({**state, "version": 2})
        assert fresh.state_dict()["position"] == 10 and fresh.state_dict()["version"] == 3
    loader, state = a_state()
    assert loader.spec.shuffle == "buffer"
    fresh = dzb.Loader(data, 10, shuffle=True, seed=1, shuffle_buffer_size=30)
    with pytest.raises(dzb.ArgumentValueError, match=r"version 2, which version 3 changed"):
        fresh.load_state_dict({**state, "version": 2})
    fresh.load_state_dict(state)  # its own version resumes


def test_a_state_of_the_old_exact_order_is_refused_saying_why() -> None:
    """Issue 39: the exact order became a keyed bijection; an old state names other samples."""
    data = np.arange(100, dtype="i8")
    loader = dzb.Loader(data, 10, shuffle=True, seed=1)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    assert state["order"] == 2
    old = {k: v for k, v in state.items() if k != "order"}  # what the old version wrote
    fresh = dzb.Loader(data, 10, shuffle=True, seed=1)
    with pytest.raises(dzb.ArgumentValueError, match=r"no 'order' field.*numpy's permutation"):
        fresh.load_state_dict(old)
    with pytest.raises(dzb.ArgumentValueError, match=r"state\['order'\]=1: a state of another"):
        fresh.load_state_dict({**state, "order": 1})
    fresh.load_state_dict(state)  # this version's state resumes
    assert [b.tolist() for b in fresh] == [b.tolist() for b in it]
    # the field is the exact order's: a buffered state without it still applies
    _, buffered_state = a_state()
    del buffered_state["order"]
    again = dzb.Loader(data, 10, shuffle=True, seed=1, shuffle_buffer_size=30)
    again.load_state_dict(buffered_state)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_a_state_of_an_absurd_world_size_is_refused_at_once(on_error: str) -> None:
    """A corrupt checkpoint's world_size=10**9 used to run for minutes (one share per rank)."""
    data = np.arange(100, dtype="i8")
    old = dzb.Loader(data, 10, shuffle=True, seed=1, on_error=on_error)
    state = old.state_dict()
    fresh = dzb.Loader(data, 10, shuffle=True, seed=1, on_error=on_error, world_size=2)
    with pytest.raises(dzb.ArgumentValueError, match=r"state\['world_size'\]=1000000000"):
        fresh.load_state_dict({**state, "world_size": 10**9})
    fresh.load_state_dict(state)  # the state as written resumes (1 rank as 2)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats() | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=6,
)


@property_settings(60)
@given(data_=st.data())
def test_any_state_loads_to_a_valid_continuation_or_raises_a_library_error(
    data_: st.DataObject,
) -> None:
    _, state = a_state()
    keys = sorted(state)
    for _ in range(data_.draw(st.integers(1, 3))):
        key = data_.draw(st.sampled_from([*keys, "junk"]))
        if data_.draw(st.booleans()):
            state.pop(key, None)
        else:
            state[key] = data_.draw(json_values | st.integers(-5, 200))
    fresh = dzb.Loader(np.arange(100, dtype="i8"), 10, shuffle=True, seed=1, shuffle_buffer_size=30)
    try:
        fresh.load_state_dict(state)
    except dzb.DaskZarrBatchesError:
        return
    got = [int(i) for b in fresh for i in b]
    assert len(got) == len(set(got)) <= 100 and set(got) <= set(range(100))


# --------------------------------------------------------------------------
# After an error, and two iterations at once


def test_after_an_error_a_loader_iteration_says_so() -> None:
    arrays = corrupt_arrays(60, 10, {2})
    loader = dzb.Loader(arrays, 8)
    it = iter(loader)
    assert len(next(it)["y"]) == 8
    with pytest.raises(dzb.CorruptChunkError) as first:
        next(it)
        next(it)
    with pytest.raises(dzb.StreamFailedError, match="CorruptChunkError") as again:
        next(it)  # never a StopIteration that reads as the end of the epoch
    assert again.value.__cause__ is first.value
    # the loader itself goes on from where the epoch was (here: fails again at the chunk)
    assert loader.state_dict()["position"] == 16 and loader.epoch == 0


def test_a_loader_iterated_twice_at_once_refuses_the_second() -> None:
    loader = dzb.Loader(np.arange(40), 4)
    first = iter(loader)
    next(first)
    second = iter(loader)
    with pytest.raises(dzb.LoaderBusyError, match=r"already being iterated \(epoch 0, batch 1/10"):
        next(second)
    got: list[Any] = []

    def take() -> None:
        try:
            got.extend(int(i) for b in loader for i in b)
        except dzb.LoaderBusyError as exc:
            got.append(exc)

    thread = threading.Thread(target=take)
    thread.start()
    thread.join(30)
    assert len(got) == 1 and isinstance(got[0], dzb.LoaderBusyError)
    del first  # the first iteration ends (its generator is closed): the loader is free
    assert [int(i) for b in loader for i in b] == list(range(4, 40))


@pytest.mark.filterwarnings("default::daskzarr_batches.SkippedChunksWarning")
def test_the_skip_warning_points_at_the_training_loop_through_a_loader() -> None:
    arrays = corrupt_arrays(60, 10, {2})
    for mode in MODES:
        with pytest.warns(dzb.SkippedChunksWarning, match="samples 20:30") as caught:
            batches(make(arrays, mode, 8))
        assert [w.filename for w in caught] == [__file__], mode
