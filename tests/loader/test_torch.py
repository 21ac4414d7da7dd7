"""The PyTorch adapter: tensors, dtypes, worker parts (fork and spawn), epochs, state, pinning.

Worker tests are slow (each DataLoader iteration starts processes): they share
one tiny store and make as few DataLoaders as they can.
"""

from __future__ import annotations

import importlib
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import zarr

import daskzarr_batches as dzb
from daskzarr_batches.plan.batching import positions_between
from daskzarr_batches.plan.batching import worker_part as worker_positions
from daskzarr_batches.torch import DevicePrefetcher, ZarrIterableDataset, to_tensors

N = 50


@pytest.fixture
def arrays(tmp_path: Path) -> dict[str, zarr.Array]:
    """x (N, 2) and y (N,) in a Zarr directory store, chunks of 8: workers read through zarr."""
    y = np.arange(N, dtype="i8")
    x = np.stack([2 * y, 2 * y + 1], axis=1)
    out = {}
    for name, value in {"x": x, "y": y}.items():
        z = zarr.create_array(
            str(tmp_path / f"{name}.zarr"),
            shape=value.shape,
            chunks=(8, *value.shape[1:]),
            dtype=value.dtype,
        )
        z[:] = value
        out[name] = zarr.open_array(str(tmp_path / f"{name}.zarr"), mode="r")
    return out


def make(arrays: dict[str, zarr.Array], **kw: Any) -> dzb.Loader:
    return dzb.Loader(arrays, 4, shuffle=True, seed=5, rank=1, world_size=2, **kw)


def key(batch: dict[str, Any]) -> tuple[int, ...]:
    """A batch as the tuple of its sample ids, checking x belongs to y."""
    y = np.asarray(batch["y"])
    np.testing.assert_array_equal(np.asarray(batch["x"]), np.stack([2 * y, 2 * y + 1], axis=1))
    return tuple(int(i) for i in y)


def test_worker_parts_are_whole_batches_covering_the_share_once() -> None:
    ranges = [(30, 37), (0, 11), (20, 25)]  # 23 positions
    for workers in (1, 2, 3, 7, 30):
        parts = [worker_positions(ranges, 4, w, workers) for w in range(workers)]
        starts = [0]
        for part in parts:
            starts.append(starts[-1] + sum(b - a for a, b in part))
        assert starts[-1] == 23
        assert all(s % 4 == 0 for s in starts[:-1])
        for w, part in enumerate(parts):
            assert part == positions_between(ranges, starts[w], starts[w + 1])


def test_tensors_share_memory_with_numpy() -> None:
    a, b = np.arange(3), np.ones((2, 2), dtype="f4")
    out = to_tensors({"a": a, "pair": (b, "label")})
    assert isinstance(out["a"], torch.Tensor) and out["pair"][1] == "label"
    out["a"][0] = 7
    out["pair"][0][1, 1] = 9
    assert a[0] == 7 and b[1, 1] == 9


def test_no_workers_gives_the_loaders_batches_and_advances_epochs(arrays: Any) -> None:
    expected = [key(b) for b in make(arrays)]
    ds = ZarrIterableDataset(make(arrays))
    loader = torch.utils.data.DataLoader(ds, batch_size=None)
    first = list(loader)
    assert all(isinstance(b["x"], torch.Tensor) and set(b) == {"x", "y"} for b in first)
    assert [key(b) for b in first] == expected
    assert len(ds) == len(first) == 7
    assert ds.loader.epoch == 1  # the loader's bookkeeping ran
    second = [key(b) for b in loader]
    assert second != expected  # epoch 1: another order
    ds.set_epoch(1)
    assert [key(b) for b in loader] == second  # the same epoch, the same order
    ds.set_epoch(0)
    assert [key(b) for b in loader] == expected


@pytest.mark.parametrize(
    ("context", "drop"), [(None, False), ("spawn", True)], ids=["fork", "spawn"]
)
def test_workers_yield_the_rank_share_once(arrays: Any, context: str | None, drop: bool) -> None:
    ds = ZarrIterableDataset(make(arrays, drop_remainder=drop))
    ds.set_epoch(3)
    reference = make(arrays, drop_remainder=drop)
    reference.set_epoch(3)
    expected = [key(b) for b in reference]
    loader = torch.utils.data.DataLoader(
        ds, batch_size=None, num_workers=2, multiprocessing_context=context
    )
    got = list(loader)
    assert all(isinstance(b["y"], torch.Tensor) for b in got)
    assert Counter(key(b) for b in got) == Counter(expected)  # the same batches
    samples = [i for b in got for i in key(b)]
    assert sorted(samples) == sorted(i for b in expected for i in b)
    assert len(samples) == len(set(samples)) == (24 if drop else 25)


def loader_epoch(arrays: Any, epoch: int, **kw: Any) -> list[tuple[int, ...]]:
    """The batches of the Loader's epoch ``epoch``, without torch."""
    reference = make(arrays, **kw)
    reference.set_epoch(epoch)
    return [key(b) for b in reference]


# torchdata 0.11 calls torch.set_vital, which torch 2.13 deprecates
@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")
def test_stateful_dataloader_resumes_mid_epoch_with_workers_exactly(arrays: Any) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    def stateful(dataset: ZarrIterableDataset) -> Any:
        return StatefulDataLoader(dataset, batch_size=None, num_workers=2)

    first = stateful(ZarrIterableDataset(make(arrays)))
    it = iter(first)
    head = [key(next(it)) for _ in range(3)]  # of 7 (worker parts of 3 and 4 batches)
    state = first.state_dict()
    whole = head + [key(b) for b in it]  # the uninterrupted run
    assert Counter(whole) == Counter(loader_epoch(arrays, 0))
    ds = ZarrIterableDataset(make(arrays))  # a new dataset, as in a new process
    resumed = stateful(ds)
    resumed.load_state_dict(state)
    rest = [key(b) for b in resumed]
    assert head + rest == whole  # the same batches in the same order, each sample once
    assert ds.state_dict()["epoch"] == 1 and ds.state_dict()["batches"] == 0
    assert Counter(key(b) for b in resumed) == Counter(loader_epoch(arrays, 1))  # epoch 1


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_main_process_state_and_set_epoch_with_persistent_workers(
    arrays: Any, context: str
) -> None:
    ds = ZarrIterableDataset(make(arrays))
    loader = torch.utils.data.DataLoader(
        ds, batch_size=None, num_workers=2, persistent_workers=True,
        multiprocessing_context=context,
    )  # fmt: skip
    it = iter(loader)
    head = [key(next(it))]
    with pytest.raises(dzb.ArgumentValueError, match=r"mid-epoch.*StatefulDataLoader"):
        ds.state_dict()  # the main process cannot know which batches were consumed
    epoch0 = head + [key(b) for b in it]
    assert Counter(epoch0) == Counter(loader_epoch(arrays, 0))
    state = ds.state_dict()  # at the boundary: the next epoch, from its start
    assert (state["epoch"], state["batches"]) == (1, 0)
    ds.set_epoch(2)  # reaches the persistent workers
    assert Counter(key(b) for b in loader) == Counter(loader_epoch(arrays, 2))
    epoch3 = [key(b) for b in loader]  # as without workers: the next epoch
    assert Counter(epoch3) == Counter(loader_epoch(arrays, 3)) != Counter(epoch0)
    assert ds.state_dict()["epoch"] == 4
    ds.load_state_dict(state)  # too late for these workers: said, not ignored
    with pytest.raises(dzb.ArgumentValueError, match="persistent workers started"):
        list(loader)


def test_workers_finish_an_epoch_resumed_from_a_loader_state(arrays: Any) -> None:
    reference = make(arrays)
    it = iter(reference)
    head = [key(next(it)) for _ in range(3)]
    ds = ZarrIterableDataset(make(arrays))
    ds.load_state_dict(reference.state_dict())
    rest = [key(b) for b in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)]
    assert Counter(head + rest) == Counter(loader_epoch(arrays, 0))
    assert ds.state_dict()["epoch"] == 1


def test_byte_swapped_arrays_become_native_tensors() -> None:
    x = np.arange(12, dtype=">i4").reshape(6, 2)
    y = np.arange(6, dtype=">f8")
    ds = ZarrIterableDataset(dzb.Loader({"x": x, "y": y}, 4))
    batches = list(ds)
    assert batches[0]["x"].dtype == torch.int32 and batches[0]["y"].dtype == torch.float64
    np.testing.assert_array_equal(torch.cat([b["x"] for b in batches]).numpy(), x)
    np.testing.assert_array_equal(torch.cat([b["y"] for b in batches]).numpy(), y)
    assert torch.equal(to_tensors(x), torch.from_numpy(x.astype("<i4")))


@pytest.mark.parametrize("dtype", ["M8[ns]", "m8[s]", [("a", "<i4"), ("b", "<f4")], "V8"])
def test_dtypes_torch_cannot_hold_are_refused_at_construction(dtype: Any) -> None:
    values = np.zeros(6, dtype=dtype)
    loader = dzb.Loader({"x": np.zeros(6, "f4"), "when": values}, 4)
    with pytest.raises(dzb.ArgumentTypeError, match=r"array .*has dtype .*torch") as info:
        ZarrIterableDataset(loader)
    assert str(np.dtype(dtype)) in str(info.value)


def test_a_non_loader_is_a_library_error() -> None:
    with pytest.raises(dzb.ArgumentTypeError, match="Loader"):
        ZarrIterableDataset(np.zeros(3))  # type: ignore[arg-type]


def test_state_dict_forwards_to_the_loader(arrays: Any) -> None:
    ds = ZarrIterableDataset(make(arrays))
    whole = [key(b) for b in make(arrays)]
    it = iter(ds)
    head = [key(next(it)), key(next(it))]
    state = ds.state_dict()
    assert state == ds.loader.state_dict() and state["batches"] == 2
    resumed = ZarrIterableDataset(make(arrays))
    resumed.load_state_dict(state)
    assert head + [key(b) for b in resumed] == whole


@pytest.mark.filterwarnings("ignore:.*pin_memory.*:UserWarning")
def test_pin_memory(arrays: Any) -> None:
    ds = ZarrIterableDataset(make(arrays))
    batches = list(torch.utils.data.DataLoader(ds, batch_size=None, pin_memory=True))
    assert [key(b) for b in batches] == [key(b) for b in make(arrays)]


def test_import_without_torch_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.delitem(sys.modules, "daskzarr_batches.torch")
    with pytest.raises(ImportError, match=r"pip install 'daskzarr-batches\[torch\]'"):
        importlib.import_module("daskzarr_batches.torch")


# ---------------------------------------------------------------- device delivery


def test_device_delivery_on_the_cpu_device_resumes_exactly(arrays: dict[str, Any]) -> None:
    """device="cpu": the CUDA path's steps with no stream; prefetched batches not counted."""
    whole = [key(b) for b in ZarrIterableDataset(make(arrays))]
    dataset = ZarrIterableDataset(make(arrays), device="cpu", prefetch=3)
    assert dataset.device == torch.device("cpu") and dataset.prefetch == 3
    first = []
    for batch in torch.utils.data.DataLoader(dataset, batch_size=None):
        assert isinstance(batch["x"], torch.Tensor) and batch["x"].device.type == "cpu"
        first.append(key(batch))
        if len(first) == 2:
            break
    state = dataset.state_dict()
    assert state["batches"] == 2
    again = ZarrIterableDataset(make(arrays), device="cpu")
    again.load_state_dict(state)
    assert first + [key(b) for b in again] == whole
    assert again.state_dict()["epoch"] == 1


def test_the_loaders_own_state_in_a_device_loop_counts_only_batches_handed_out() -> None:
    """``loader.state_dict()`` taken in a ``device=`` loop is the dataset's (it counted the
    prefetched batches: a checkpoint of it lost them on resume)."""
    loader = dzb.Loader(np.arange(100), 8, shuffle=True, shuffle_buffer_size=20, seed=1)
    seen: list[int] = []
    for step, batch in enumerate(ZarrIterableDataset(loader, device="cpu", prefetch=3)):
        seen += batch.tolist()
        if step == 2:
            state = loader.state_dict()
            assert (state["batches"], state["position"]) == (3, 24)  # was (6, 48)
    again = dzb.Loader(np.arange(100), 8, shuffle=True, shuffle_buffer_size=20, seed=1)
    again.load_state_dict(state)
    assert seen[:24] + [i for batch in again for i in batch.tolist()] == seen
    assert loader.state_dict()["epoch"] == 1


def test_device_prefetcher_around_workers_and_dlpack(arrays: dict[str, Any]) -> None:
    loader = torch.utils.data.DataLoader(
        ZarrIterableDataset(make(arrays)), batch_size=None, num_workers=2
    )
    moved = DevicePrefetcher(loader, "cpu", pin_memory=True, prefetch=1)
    assert moved.pin_memory is False  # pinning serves copies to an accelerator only
    got = sorted(key(b) for b in moved)
    assert got == sorted(key(b) for b in ZarrIterableDataset(make(arrays)))
    capsules = DevicePrefetcher([{"y": torch.arange(3)}], "cpu", dlpack=True)
    (batch,) = list(capsules)
    assert torch.utils.dlpack.from_dlpack(batch["y"]).tolist() == [0, 1, 2]
    with pytest.raises(dzb.ArgumentValueError, match="device must name a torch device"):
        DevicePrefetcher([], "no-such-device")
    with pytest.raises(dzb.ArgumentValueError, match="prefetch must be >= 0"):
        ZarrIterableDataset(make(arrays), device="cpu", prefetch=-1)


def test_device_under_workers_is_refused(arrays: dict[str, Any]) -> None:
    dataset = ZarrIterableDataset(make(arrays), device="cpu")
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=1)
    with pytest.raises(dzb.ArgumentValueError, match="DevicePrefetcher"):
        next(iter(loader))


if torch.cuda.is_available():  # collected only where a CUDA device exists

    def test_device_delivery_on_cuda(arrays: dict[str, Any]) -> None:
        batches = list(ZarrIterableDataset(make(arrays), device="cuda"))
        assert all(b["x"].is_cuda for b in batches)
        assert [key({k: v.cpu() for k, v in b.items()}) for b in batches] == [
            key(b) for b in ZarrIterableDataset(make(arrays))
        ]


@pytest.mark.parametrize(("exit", "at"), [("break", 3), ("body", 3), ("break", 10)])
def test_device_delivery_left_early_goes_on_with_the_batches_put_ahead(exit: str, at: int) -> None:
    """The batches put on the device ahead were lost to the next iteration (issue 35)."""
    data = ZarrIterableDataset(
        dzb.Loader(np.arange(100), 10, shuffle=True, seed=4), device="cpu", prefetch=2
    )
    seen: list[int] = []
    try:
        for batch in data:
            seen += batch.tolist()
            if len(seen) == 10 * at:
                if exit == "break":
                    break
                raise KeyError(at)
    except KeyError:
        pass
    assert data.state_dict()["batches"] == at
    seen += [i for batch in data for i in batch.tolist()]
    assert sorted(seen) == list(range(100))
    assert data.loader.epoch == 1
    assert len([i for batch in data for i in batch.tolist()]) == 100  # the next epoch whole
