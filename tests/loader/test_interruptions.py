"""Every sample exactly once across breaks, exceptions in the loop body and failing
transforms: the Loader and the device feed on the host (``CupyLoader(xp=numpy)``);
``JaxLoader``'s are in test_jax.py (JAX started in-process runs last)."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import Interrupted, interrupted_epoch, interruptions, property_settings

import daskzarr_batches as dzb
from daskzarr_batches.cupy import CupyLoader


def _ids(batch: Any) -> list[int]:
    return [int(i) for i in np.asarray(batch)]


@property_settings(25)
@given(case=interruptions())
def test_a_loader_hands_out_every_sample_once_across_interruptions(case: dict[str, Any]) -> None:
    interrupted_epoch(case, lambda loader: loader, _ids)


@property_settings(15)
@given(case=interruptions(), prefetch=st.sampled_from([0, 1, 3]))
def test_a_host_device_feed_hands_out_every_sample_once_across_interruptions(
    case: dict[str, Any], prefetch: int
) -> None:
    interrupted_epoch(case, lambda loader: CupyLoader(loader, xp=np, prefetch=prefetch), _ids)


@pytest.mark.parametrize("exit", ["break", "body"])
def test_a_device_feed_left_early_goes_on_with_its_prefetched_batches(exit: str) -> None:
    feed = CupyLoader(dzb.Loader(np.arange(1000), 100, shuffle=True, seed=2), xp=np, prefetch=2)
    seen: list[int] = []
    with pytest.raises(Interrupted) if exit == "body" else _nothing():
        for batch in feed:
            seen += _ids(batch)
            if len(seen) == 300:
                if exit == "break":
                    break
                raise Interrupted
    assert feed.state_dict()["batches"] == 3
    seen += [i for batch in feed for i in _ids(batch)]
    assert sorted(seen) == list(range(1000))  # was 900: the 2 batches put ahead were lost
    assert feed.epoch == 1


def test_the_loaders_own_state_inside_a_device_feed_loop_counts_only_batches_handed_out() -> None:
    """A checkpoint of the wrapped ``Loader`` taken in the feed's loop (``loader.state_dict()``,
    not ``feed.state_dict()``) resumes exactly too: it counted the prefetched batches before."""
    loader = dzb.Loader(np.arange(100), 8, shuffle=True, shuffle_buffer_size=20, seed=1)
    feed = CupyLoader(loader, xp=np, prefetch=3)
    seen: list[int] = []
    for step, batch in enumerate(feed):
        seen += _ids(batch)
        if step == 2:
            state = loader.state_dict()
            assert state == feed.state_dict()
            assert (state["batches"], state["position"]) == (3, 24)  # was (6, 48)
            assert pickle.loads(pickle.dumps(loader)).state_dict() == state
    again = dzb.Loader(np.arange(100), 8, shuffle=True, shuffle_buffer_size=20, seed=1)
    again.load_state_dict(state)
    assert seen[:24] + [i for batch in again for i in _ids(batch)] == seen
    assert loader.state_dict()["epoch"] == 1  # the epoch over: the loader's own state again


def test_a_failing_transform_leaves_its_batch_uncounted() -> None:
    calls = [0]

    def transform(batch: Any) -> Any:
        calls[0] += 1
        if calls[0] == 4:
            raise Interrupted("batch 4")
        return batch

    loader = dzb.Loader(np.arange(1000), 32, transform=transform)
    seen: list[int] = []
    with pytest.raises(Interrupted):
        for batch in loader:
            seen += _ids(batch)
    state = loader.state_dict()
    assert (state["batches"], state["position"]) == (3, 96)  # was (4, 128)
    again = dzb.Loader(np.arange(1000), 32)
    again.load_state_dict(state)
    assert seen + [i for batch in again for i in _ids(batch)] == list(range(1000))
    seen += [i for batch in loader for i in _ids(batch)]
    assert seen == list(range(1000))  # was 968 of 1000


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None
