"""Big samples (issue 16): fields of many KB, one or a few per stored chunk, and a
shuffle buffer sized in bytes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

import daskzarr_batches as dzb
from daskzarr_batches.streams.spec import buffer_samples, byte_size

FIELD = (9, 20)  # a small field; 720 bytes of float32
ROW_BYTES = 9 * 20 * 4


def fields(path: Path, n: int, per_chunk: int) -> tuple[zarr.Array, np.ndarray]:
    data = np.arange(n * 180, dtype="f4").reshape(n, *FIELD)
    x = zarr.create_array(path, shape=data.shape, chunks=(per_chunk, *FIELD), dtype="f4")
    x[:] = data
    return x, data


@pytest.mark.parametrize(
    ("value", "samples"),
    [
        (7, 7),  # a plain int stays samples
        (np.int64(3), 3),
        ("7200B", 10),  # bytes // row bytes
        ("7.9KB", 10),  # 7900 bytes: whole samples only
        ("1MiB", 2**20 // ROW_BYTES),
        ("100B", 1),  # less than a sample is 1 sample
    ],
)
def test_buffer_size_in_bytes_becomes_samples(value: object, samples: int) -> None:
    assert buffer_samples(value, ROW_BYTES) == samples


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        ("12 parsecs", dzb.ArgumentValueError, "shuffle_buffer_size='12 parsecs' is not a size"),
        ("0MiB", dzb.ArgumentValueError, "shuffle_buffer_size='0MiB' must be at least 1 byte"),
        (0, dzb.ArgumentValueError, "shuffle_buffer_size must be a positive integer, got 0"),
        (2.5, dzb.ArgumentTypeError, "got 2.5 of type float"),
        ("8", dzb.ArgumentTypeError, "shuffle_buffer_size='8' has no unit: give samples as an"),
        (True, dzb.ArgumentTypeError, "got True of type bool"),
    ],
)
def test_bad_buffer_sizes_are_named(value: object, error: type[Exception], match: str) -> None:
    x = np.zeros((10, *FIELD), "f4")
    for make in (
        lambda: dzb.shuffled_batch_stream(x, 2, seed=0, shuffle_buffer_size=value),
        lambda: dzb.plan_epoch(x, 2, shuffle=True, seed=0, shuffle_buffer_size=value),
        lambda: dzb.Loader(x, 2, shuffle=True, shuffle_buffer_size=value),
    ):
        with pytest.raises(error, match=match):
            make()


def test_byte_size_is_the_shared_parser() -> None:
    assert byte_size("cache", "2GiB") == 2 * 2**30
    assert byte_size("cache", "1GB") == 10**9
    assert byte_size("cache", 4096) == 4096
    with pytest.raises(dzb.ArgumentTypeError, match="cache must be a number of bytes"):
        byte_size("cache", 1.5)


def test_a_byte_sized_buffer_bounds_the_windows(tmp_path: Path) -> None:
    x, _ = fields(tmp_path / "x.zarr", 64, 1)
    labels = np.zeros(64, "i8")
    budget = 10 * ROW_BYTES + ROW_BYTES // 2  # 10.5 samples of features
    with dzb.shuffled_batch_stream(x, 4, seed=0, shuffle_buffer_size=f"{budget}B") as stream:
        assert stream.spec.shuffle_buffer_size == 10
        summary = stream.summary()
        assert max(w.samples for w in summary.windows) <= 10
        assert max(w.bytes_held for w in summary.windows) <= budget
    # paired: the bytes of a sample are the features' and the labels'
    with dzb.paired_shuffled_batch_stream(
        x, labels, 4, seed=0, shuffle_buffer_size=f"{budget}B"
    ) as paired:
        assert paired.spec.shuffle_buffer_size == budget // (ROW_BYTES + 8) == 10
    loader = dzb.Loader(x, 4, shuffle=True, shuffle_buffer_size="5KiB")
    assert loader.state_dict()["shuffle_buffer_size"] == 5 * 1024 // ROW_BYTES


MODES: dict[str, dict[str, Any]] = {
    "sequential": {},
    "buffered, samples": {"shuffle_buffer_size": 8},
    "buffered, bytes": {"shuffle_buffer_size": f"{6 * ROW_BYTES}B"},
    "exact, one window": {"shuffle_buffer_size": None},
    "exact, several windows": {"shuffle_buffer_size": None, "memory_budget": 2**14},
}


@pytest.mark.parametrize("per_chunk", [1, 3, 8])
@pytest.mark.parametrize("mode", MODES)
def test_big_samples_each_once_equal_to_numpy(tmp_path: Path, per_chunk: int, mode: str) -> None:
    x, data = fields(tmp_path / "x.zarr", 37, per_chunk)
    if mode == "sequential":
        stream = dzb.batch_stream(x, 5)
    else:
        stream = dzb.shuffled_batch_stream(x, 5, seed=3, **MODES[mode])
    with stream:
        if mode == "exact, several windows":
            assert len(stream.summary().windows) > 1
        batches = list(stream)
    got = np.concatenate(batches)
    assert got.shape == data.shape and got.dtype == data.dtype
    ids = (got[:, 0, 0] // 180).astype(int)  # each field starts at its index * 180
    assert sorted(ids.tolist()) == list(range(37))  # every sample exactly once
    np.testing.assert_array_equal(got, data[ids])  # each equal to numpy
    if mode != "sequential":
        assert ids.tolist() != list(range(37))


def test_bench_takes_a_buffer_in_bytes() -> None:
    from daskzarr_batches.tools.cli import _buffer_size

    assert _buffer_size("300") == 300
    assert _buffer_size("256MiB") == "256MiB"
    with pytest.raises(Exception, match="--shuffle-buffer='256 parsecs' is not a size"):
        _buffer_size("256 parsecs")
