"""CupyLoader: device batches with numpy as the array module (the CPU path), a CUDA-like
module that records its streams and events (the GPU path's ordering), and cupy itself
where a GPU is present (not collected elsewhere)."""

from __future__ import annotations

import importlib.util
import json
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

import daskzarr_batches as dzb
from daskzarr_batches.cupy import CupyLoader

BATCH = 40


@pytest.fixture(scope="module")
def arrays(tmp_path_factory: pytest.TempPathFactory) -> dict[str, zarr.Array]:
    root = tmp_path_factory.mktemp("cupy") / "data.zarr"
    group = zarr.open_group(root, mode="w")
    x = group.create_array("x", shape=(1000, 3), chunks=(128, 3), dtype="f4")
    x[:] = np.arange(3000, dtype="f4").reshape(1000, 3)
    y = group.create_array("y", shape=(1000,), chunks=(128,), dtype="i8")
    y[:] = np.arange(1000)
    return {"x": zarr.open_array(Path(root) / "x"), "y": zarr.open_array(Path(root) / "y")}


def _loader(arrays: dict[str, zarr.Array]) -> dzb.Loader:
    return dzb.Loader(arrays, BATCH, shuffle=True, seed=5, shuffle_buffer_size=300)


def _plain(batches: Any) -> list[dict[str, list[Any]]]:
    return [{k: np.asarray(v).tolist() for k, v in b.items()} for b in batches]


@pytest.mark.parametrize("prefetch", [0, 2])
def test_numpy_batches_equal_the_loaders(arrays: Any, prefetch: int) -> None:
    expected = _plain(_loader(arrays))
    feed = CupyLoader(_loader(arrays), xp=np, prefetch=prefetch)
    assert len(feed) == len(expected)
    assert _plain(feed) == expected
    assert feed.epoch == 1 == feed.state_dict()["epoch"]  # the epoch ran out: the next one


def test_a_resume_mid_epoch_yields_exactly_the_rest(arrays: Any) -> None:
    whole = _plain(_loader(arrays))
    first = CupyLoader(_loader(arrays), xp=np, prefetch=2)
    seen = []
    for batch in first:
        seen.append(batch)
        if len(seen) == 7:
            break  # two more are prefetched: the state must not count them
    state = json.loads(json.dumps(first.state_dict()))
    again = CupyLoader(_loader(arrays), xp=np)
    again.load_state_dict(state)
    assert _plain(seen) + _plain(again) == whole


class _FakeCuda:
    """What CupyLoader uses of ``cupy.cuda``, recording the order of copies and waits."""

    def __init__(self) -> None:
        self.log: list[tuple[str, int]] = []
        self.current: list[_FakeCuda.Stream] = []
        self.events = 0
        cuda = self

        class Stream:
            def __init__(self, non_blocking: bool = False) -> None:
                assert non_blocking

            def __enter__(self) -> Stream:
                cuda.current.append(self)
                return self

            def __exit__(self, *exc: object) -> None:
                cuda.current.pop()

            def record(self) -> int:
                cuda.events += 1
                cuda.log.append(("record", cuda.events))
                return cuda.events

            def wait_event(self, event: int) -> None:
                cuda.log.append(("wait", event))

        self.Stream = Stream
        self._default = Stream(non_blocking=True)

    def get_current_stream(self) -> Any:
        return self._default

    def alloc_pinned_memory(self, nbytes: int) -> bytearray:
        self.log.append(("pin", nbytes))
        return bytearray(nbytes)


def test_copies_run_on_the_side_stream_and_each_batch_waits_for_its_own(arrays: Any) -> None:
    cuda = _FakeCuda()
    copies: list[bool] = []

    def asarray(value: np.ndarray) -> np.ndarray:
        copies.append(bool(cuda.current))  # inside the side stream's context
        return np.array(value, copy=True)

    xp = types.SimpleNamespace(asarray=asarray, cuda=cuda, __name__="fakecupy")
    feed = CupyLoader(_loader(arrays), xp=xp, prefetch=2)
    got = []
    for batch in feed:
        got.append(batch)
        assert cuda.log[-1] == ("wait", len(got)), "handed out before waiting on its event"
    assert _plain(got) == _plain(_loader(arrays))
    assert copies and all(copies)
    assert [entry for entry in cuda.log if entry[0] == "wait"] == [
        ("wait", n) for n in range(1, len(got) + 1)
    ]
    pinned = [n for kind, n in cuda.log if kind == "pin"]
    assert len(pinned) == 2 * len(got) and pinned[0] == BATCH * 3 * 4  # x then y, per batch


def test_bad_arguments_are_named(arrays: Any) -> None:
    with pytest.raises(dzb.ArgumentTypeError, match="Loader"):
        CupyLoader(np.zeros(3), xp=np)  # type: ignore[arg-type]
    with pytest.raises(dzb.ArgumentTypeError, match="asarray"):
        CupyLoader(_loader(arrays), xp=object())
    with pytest.raises(dzb.ArgumentValueError, match="-1"):
        CupyLoader(_loader(arrays), xp=np, prefetch=-1)
    with pytest.raises(dzb.ArgumentTypeError, match="True"):
        CupyLoader(_loader(arrays), xp=np, prefetch=True)


if importlib.util.find_spec("cupy") is None:

    def test_without_cupy_the_default_names_what_to_install(arrays: Any) -> None:
        with pytest.raises(ImportError, match="cupy-cuda12x"):
            CupyLoader(_loader(arrays))


def _gpu() -> bool:
    if importlib.util.find_spec("cupy") is None:
        return False
    try:
        import cupy

        return bool(cupy.cuda.runtime.getDeviceCount() > 0)
    except Exception:  # no driver, no device
        return False


if _gpu():  # collected only where a GPU is present

    def test_cupy_batches_on_the_gpu_equal_the_loaders(arrays: Any) -> None:
        import cupy

        got = list(CupyLoader(_loader(arrays)))
        assert all(isinstance(b["x"], cupy.ndarray) for b in got)
        cupy.cuda.get_current_stream().synchronize()
        assert [{k: v.get().tolist() for k, v in b.items()} for b in got] == _plain(_loader(arrays))


@pytest.mark.parametrize("prefetch", [0, 1, 3])
def test_prefetch_counts_batches_put_ahead_of_the_one_handed_out(prefetch: int) -> None:
    """A device feed's ``prefetch`` is batches (the Loader's is windows, beneath it)."""
    puts: list[int] = []

    class Counting(CupyLoader):
        def put(self, batch: Any) -> Any:
            puts.append(int(batch[0]))
            return super().put(batch)

    feed = Counting(dzb.Loader(np.arange(100), 10), xp=np, prefetch=prefetch)
    for handed, batch in enumerate(feed, 1):
        assert int(batch[0]) == 10 * (handed - 1)
        assert len(puts) == min(handed + prefetch, 10)  # exactly `prefetch` put ahead
        assert feed.state_dict()["batches"] == handed  # only the handed out are counted
    assert puts == list(range(0, 100, 10))
