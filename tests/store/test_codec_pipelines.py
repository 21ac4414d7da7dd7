"""Both codec pipelines: zarr-python's own and zarrs' Rust one (``open_array(codec_pipeline=)``).

The core stream property tests run on both through the ``"zarrs"`` input kind of
tests/strategies.py; here: the selection and its errors, that zarrs really reads
the store itself, identical batches across pipelines (threads and a LocalCluster),
and the read policy (missing, corrupt, skip) on the zarrs pipeline.
"""

from __future__ import annotations

import os
import pickle
import sys
import warnings
from typing import Any

import numpy as np
import pytest
import zarr
import zarr.storage
from stores import is_chunk_key
from strategies import local_path, make_data, to_zarr

import daskzarr_batches as dzb
from daskzarr_batches.store.pipelines import CODEC_PIPELINE_ENV, codec_pipeline_of
from daskzarr_batches.store.sources import _zarr_behind

pytest.importorskip("zarrs")

PIPELINES = ("zarr", "zarrs")


def pipeline_of(array: Any) -> str:
    """Which pipeline reads an ``open_array`` result."""
    return codec_pipeline_of(_zarr_behind(array))


def local_array(
    shape: tuple[int, ...] = (203, 3, 2),
    chunks: tuple[int, ...] = (16, 2, 2),
    shards: tuple[int, ...] | None = None,
    dtype: str = "int32",
) -> tuple[str, np.ndarray]:
    """``make_data`` written to a Zarr array in a fresh local directory."""
    data = make_data(shape, dtype)
    path = local_path()
    array = zarr.create_array(
        zarr.storage.LocalStore(path), shape=shape, chunks=chunks, shards=shards, dtype=dtype
    )
    array[...] = data
    return path, data


# --------------------------------------------------------------------------
# Selection


def test_choices_and_their_default(monkeypatch: pytest.MonkeyPatch) -> None:
    path, data = local_array()
    monkeypatch.delenv(CODEC_PIPELINE_ENV, raising=False)
    assert pipeline_of(dzb.open_array(path)) == "zarrs"  # "auto", zarrs installed
    assert pipeline_of(dzb.open_array(path, codec_pipeline="auto")) == "zarrs"
    assert pipeline_of(dzb.open_array(path, codec_pipeline="zarrs")) == "zarrs"
    assert pipeline_of(dzb.open_array(path, codec_pipeline="zarr")) == "zarr"
    for value, expected in [("zarr", "zarr"), (" ZARRS ", "zarrs"), ("", "zarrs")]:
        monkeypatch.setenv(CODEC_PIPELINE_ENV, value)
        assert pipeline_of(dzb.open_array(path)) == expected
    monkeypatch.setenv(CODEC_PIPELINE_ENV, "zarr")
    assert pipeline_of(dzb.open_array(path, codec_pipeline="zarrs")) == "zarrs"  # argument wins
    np.testing.assert_array_equal(dzb.open_array(path).compute(), data)


def test_bad_choices_name_the_value(monkeypatch: pytest.MonkeyPatch) -> None:
    path, _ = local_array()
    with pytest.raises(dzb.ArgumentValueError, match=r"codec_pipeline must be one of .*'rust'"):
        dzb.open_array(path, codec_pipeline="rust")  # type: ignore[arg-type]
    with pytest.raises(dzb.ArgumentTypeError, match=r"codec_pipeline must be .* got bool True"):
        dzb.open_array(path, codec_pipeline=True)  # type: ignore[arg-type]
    monkeypatch.setenv(CODEC_PIPELINE_ENV, "fast")
    with pytest.raises(dzb.ArgumentValueError, match=f"{CODEC_PIPELINE_ENV} must be .*'fast'"):
        dzb.open_array(path)


def test_zarrs_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    path, _ = local_array()
    monkeypatch.delenv(CODEC_PIPELINE_ENV, raising=False)
    monkeypatch.setitem(sys.modules, "zarrs.pipeline", None)  # import zarrs.pipeline fails
    with pytest.raises(dzb.ArgumentValueError, match=r"pip install 'daskzarr-batches\[zarrs\]'"):
        dzb.open_array(path, codec_pipeline="zarrs")
    assert pipeline_of(dzb.open_array(path)) == "zarr"  # "auto" without zarrs


def test_what_zarrs_cannot_read_natively_uses_zarrs_pipeline() -> None:
    """Other stores, byte orders zarrs refuses: zarr's pipeline, without a warning."""
    data = make_data((50, 3))
    memory = to_zarr(data, (8, 3))
    assert pipeline_of(dzb.open_array(memory, codec_pipeline="zarrs")) == "zarr"
    path = local_path()
    big_endian = to_zarr(
        data.astype(">i4"), (8, 3), zarr_format=2, store=zarr.storage.LocalStore(path)
    )
    opened = dzb.open_array(big_endian, codec_pipeline="zarrs")
    assert pipeline_of(opened) == "zarr"
    batches = list(dzb.batch_stream(opened, 7))
    assert batches[0].dtype == np.dtype(">i4")
    np.testing.assert_array_equal(np.concatenate(batches), data)


def test_arrays_opened_by_the_user() -> None:
    """open_array rebinds a zarr.Array to the choice; streams keep an array's own pipeline."""
    path, data = local_array()
    mine = zarr.open_array(path, mode="r")
    assert codec_pipeline_of(mine) == "zarr"
    assert pipeline_of(dzb.open_array(mine)) == "zarrs"
    assert codec_pipeline_of(mine) == "zarr"  # the array passed is left as it was
    with zarr.config.set({"codec_pipeline.path": "zarrs.ZarrsCodecPipeline"}):
        theirs = zarr.open_array(path, mode="r")
    assert codec_pipeline_of(theirs) == "zarrs"
    assert pipeline_of(dzb.open_array(theirs, codec_pipeline="zarr")) == "zarr"
    np.testing.assert_array_equal(np.concatenate(list(dzb.batch_stream(theirs, 50))), data)
    # pickles (to workers) with its pipeline, rebuilt there
    assert codec_pipeline_of(pickle.loads(pickle.dumps(_zarr_behind(dzb.open_array(path))))) == (
        "zarrs"
    )


def test_zarrs_reads_the_store_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    """With zarrs no chunk goes through zarr's store API (so it is really used)."""
    path, data = local_array()
    gets: list[str] = []
    original = zarr.storage.LocalStore.get

    async def counting_get(self: Any, key: str, *args: Any, **kwargs: Any) -> Any:
        gets.append(key)
        return await original(self, key, *args, **kwargs)

    monkeypatch.setattr(zarr.storage.LocalStore, "get", counting_get)
    for pipeline in PIPELINES:
        gets.clear()
        array = dzb.open_array(path, codec_pipeline=pipeline)
        streams = [
            dzb.batch_stream(array, 32, window_bytes=3000),
            dzb.shuffled_batch_stream(array, 32, shuffle_buffer_size=64, seed=1),
            dzb.shuffled_batch_stream(array, 32, memory_budget=9000, seed=1),
        ]
        for stream in streams:
            ids = np.concatenate(list(stream))[:, 0, 0] // 6
            assert sorted(ids) == list(range(len(data)))
        chunk_gets = [key for key in gets if is_chunk_key(key)]
        assert (chunk_gets == []) == (pipeline == "zarrs"), pipeline


# --------------------------------------------------------------------------
# Identical batches


def epoch(array: Any, labels: Any, kind: str, client: Any = None) -> list[Any]:
    """One epoch of stream ``kind`` over ``array`` (and ``labels``)."""
    if kind == "sequential":
        stream: Any = dzb.batch_stream(array, 13, window_bytes=2000, client=client)
    elif kind == "buffer":
        stream = dzb.shuffled_batch_stream(array, 13, shuffle_buffer_size=40, seed=3, client=client)
    elif kind == "exact":
        stream = dzb.shuffled_batch_stream(array, 13, memory_budget=5000, seed=3, client=client)
    elif kind == "paired":
        stream = dzb.paired_shuffled_batch_stream(
            array, labels, 13, shuffle_buffer_size=40, seed=3, client=client
        )
    else:
        stream = dzb.chunk_stream(array, client=client)
    with stream:
        return list(stream)


def assert_same(a: list[Any], b: list[Any]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        xs, ys = (x, y) if isinstance(x, tuple) else ((x,), (y,))
        for u, v in zip(xs, ys, strict=True):
            assert u.dtype == v.dtype
            np.testing.assert_array_equal(u, v)


@pytest.mark.parametrize("shards", [None, (32, 4, 2)], ids=["unsharded", "sharded"])
@pytest.mark.parametrize("kind", ["sequential", "buffer", "exact", "paired", "chunks"])
def test_same_batches_on_both_pipelines(kind: str, shards: Any) -> None:
    path, data = local_array(shards=shards)
    labels_path, _ = local_array(shape=(203,), chunks=(10,), dtype="float64")
    runs = []
    for pipeline in PIPELINES:
        array = dzb.open_array(path, codec_pipeline=pipeline)
        labels = dzb.open_array(labels_path, codec_pipeline=pipeline)
        assert pipeline_of(array) == pipeline_of(labels) == pipeline
        runs.append(epoch(array, labels, kind))
    assert_same(*runs)
    if kind == "sequential":
        np.testing.assert_array_equal(np.concatenate(runs[0]), data)


def test_same_batches_on_a_cluster_of_processes() -> None:
    """The arrays pickle to worker processes with their zarrs pipeline, and read the same."""
    distributed = pytest.importorskip("distributed")
    path, _ = local_array()
    labels_path, _ = local_array(shape=(203,), chunks=(10,), dtype="float64")
    local = epoch(
        dzb.open_array(path, codec_pipeline="zarr"),
        dzb.open_array(labels_path, codec_pipeline="zarr"),
        "paired",
    )
    array = dzb.open_array(path, codec_pipeline="zarrs")
    labels = dzb.open_array(labels_path, codec_pipeline="zarrs")
    with (
        distributed.LocalCluster(
            n_workers=1, threads_per_worker=2, processes=True, dashboard_address=":0"
        ) as cluster,
        distributed.Client(cluster, set_as_default=False) as client,
    ):
        behind = _zarr_behind(array)
        assert client.submit(codec_pipeline_of, behind).result() == "zarrs"
        assert_same(local, epoch(array, labels, "paired", client=client))


# --------------------------------------------------------------------------
# The read policy on the zarrs pipeline


def damaged(shards: Any = None) -> tuple[str, np.ndarray, str, str]:
    """A local array with chunk (3, 0, 0) (or its shard) deleted and (5, 0, 0) corrupted."""
    path, data = local_array(shape=(100, 2, 2), chunks=(10, 2, 2), shards=shards)
    rows = 1 if shards is None else 2
    missing, corrupt = f"c/{3 // rows}/0/0", f"c/{5 // rows}/0/0"
    os.remove(os.path.join(path, missing))
    with open(os.path.join(path, corrupt), "wb") as file:
        file.write(b"not a compressed chunk")
    return path, data, missing, corrupt


def policy_epoch(path: str, pipeline: str, kind: str, **policy: Any) -> tuple[Any, Any, Any]:
    """(batches, stats, warning messages) of one epoch, or the error raised as batches."""
    array = dzb.open_array(path, codec_pipeline=pipeline)
    assert pipeline_of(array) == pipeline
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if kind == "chunks":
            stream: Any = dzb.chunk_stream(array, **policy)
        elif kind == "exact":
            stream = dzb.shuffled_batch_stream(array, 7, memory_budget=900, seed=2, **policy)
        else:
            stream = dzb.batch_stream(array, 7, window_bytes=600, **policy)
        try:
            with stream:
                batches: Any = list(stream)
        except dzb.DaskZarrBatchesError as exc:
            batches = (type(exc), str(exc))
    return batches, stream.stats, sorted(str(w.message) for w in caught)


@pytest.mark.parametrize("shards", [None, (20, 2, 2)], ids=["unsharded", "sharded"])
@pytest.mark.parametrize("kind", ["sequential", "exact", "chunks"])
def test_policy_holds_with_zarrs(kind: str, shards: Any) -> None:
    path, data, missing, corrupt = damaged(shards)
    policies: list[dict[str, str]] = [
        {},
        {"missing": "error"},
        {"on_error": "skip"},  # the default missing="fill"
        {"on_error": "skip", "missing": "warn"},
    ]
    for policy in policies:
        got = {pipeline: policy_epoch(path, pipeline, kind, **policy) for pipeline in PIPELINES}
        batches, stats, caught = got["zarrs"]
        zarr_batches, zarr_stats, zarr_caught = got["zarr"]
        assert caught == zarr_caught, policy
        if isinstance(batches, tuple):  # an error: the same one
            assert batches == zarr_batches, policy
            error, message = batches
            # missing="error" raises at the first bad chunk the order reaches: the missing
            # one, or (an exact order's first window touching it first) the corrupt one
            if policy.get("missing") == "error" and error is dzb.MissingChunkError:
                assert repr(missing) in message
            else:
                assert kind == "exact" or policy.get("missing") != "error", policy
                assert error is dzb.CorruptChunkError and repr(corrupt) in message
                assert "samples 50:60" in message or "samples 40:50" in message
            continue
        assert_same(batches, zarr_batches)
        assert stats.skipped == zarr_stats.skipped != ()
        assert stats.chunks_missing == zarr_stats.chunks_missing > 0
        if kind != "chunks":
            gone, zeroed = (50, 60), (30, 40)
            if shards is not None:
                gone, zeroed = (40, 60), (20, 40)
            expected = data.copy()
            expected[slice(*zeroed)] = 0
            expected = np.delete(expected, np.arange(*gone), axis=0)
            rows = np.concatenate(batches)
            if kind == "sequential":
                np.testing.assert_array_equal(rows, expected)
            assert sorted(rows[:, 0, 0]) == sorted(expected[:, 0, 0])
        else:
            assert len(batches) < len(data) // 10


# --------------------------------------------------------------------------
# Forked processes (torch DataLoader workers)


@pytest.mark.torch
def test_forked_workers_read_with_zarrs_pipeline_after_zarrs_was_used() -> None:
    """zarrs' threads do not survive fork: forked workers fall back to zarr, same batches."""
    import torch

    from daskzarr_batches.torch import ZarrIterableDataset

    path, data = local_array(shape=(64, 2), chunks=(8, 2))
    x = dzb.open_array(path, codec_pipeline="zarrs")
    assert pipeline_of(x) == "zarrs"
    assert len(list(dzb.batch_stream(x, 16))) == 4  # zarrs used in this process
    loader = torch.utils.data.DataLoader(
        ZarrIterableDataset(dzb.Loader({"x": x}, 8)),
        batch_size=None,
        num_workers=2,
        multiprocessing_context="fork",
        timeout=60,  # a zarrs read in a forked worker would wait forever
    )
    rows = torch.cat([batch["x"] for batch in loader]).numpy()
    assert sorted(rows[:, 0]) == sorted(data[:, 0])
