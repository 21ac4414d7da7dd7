"""Every bad input of issue 2 gets a clear error naming the value, never wrong data."""

from __future__ import annotations

import pathlib
import time
from collections.abc import Callable
from typing import Any

import dask.array as da
import numpy as np
import pytest
import zarr
import zarr.storage
from stores import LatencyStore, open_wrapped
from strategies import make_data, to_zarr

import daskzarr_batches as dzb

DATA = make_data((10, 4), "float32")
LABELS = np.arange(10)


def batchers() -> dict[str, Callable[..., Any]]:
    """Every public function taking a batch size, as f(array, batch_size, **kw)."""
    return {
        "batch_stream": dzb.batch_stream,
        "shuffled": lambda a, b, **kw: dzb.shuffled_batch_stream(a, b, seed=0, **kw),
        "buffered": lambda a, b, **kw: dzb.shuffled_batch_stream(
            a, b, seed=0, shuffle_buffer_size=4, **kw
        ),
        "paired": lambda a, b, **kw: dzb.paired_batch_stream(a, a[:, 0], b, **kw),
        "paired_shuffled": lambda a, b, **kw: dzb.paired_shuffled_batch_stream(
            a, a[:, 0], b, seed=0, **kw
        ),
        "count_batches": dzb.count_batches,
    }


BATCHERS = list(batchers())


def call(name: str, *args: Any, **kwargs: Any) -> Any:
    result = batchers()[name](*args, **kwargs)
    if isinstance(result, dzb.Stream):
        result.close()
    return result


def check_library_error(error: BaseException) -> None:
    assert isinstance(error, dzb.DaskZarrBatchesError)


# --------------------------------------------------------------------------
# batch_size


@pytest.mark.parametrize("name", BATCHERS)
@pytest.mark.parametrize("bad", [0, -1, np.int64(0), np.int32(-7)])
def test_batch_size_not_positive(name: str, bad: Any) -> None:
    with pytest.raises(ValueError, match=f"batch_size.*{int(bad)}") as info:
        call(name, DATA, bad)
    check_library_error(info.value)


@pytest.mark.parametrize("name", BATCHERS)
@pytest.mark.parametrize("bad", [2.5, True, False, "4", None, 4.0, [4], np.float64(4)])
def test_batch_size_wrong_type(name: str, bad: Any) -> None:
    with pytest.raises(TypeError, match="batch_size") as info:
        call(name, DATA, bad)
    assert repr(bad) in str(info.value)
    check_library_error(info.value)


@pytest.mark.parametrize("name", BATCHERS)
@pytest.mark.parametrize("good", [np.int64(4), np.int32(4), np.uint8(4), 4])
def test_numpy_integer_batch_sizes_are_accepted(name: str, good: Any) -> None:
    assert dzb.count_batches(DATA, good) == 3
    result = call(name, DATA, good)
    if name == "count_batches":
        assert result == 3
    else:
        stream = batchers()[name](DATA, good)
        items = list(stream)
        assert len(items) == len(stream) == 3
        first = items[0][0] if isinstance(items[0], tuple) else items[0]
        assert len(first) == 4 and type(stream.plan.batch_size) is int


# --------------------------------------------------------------------------
# Array shapes


@pytest.mark.parametrize("shuffled", [False, True])
@pytest.mark.parametrize("labels_len", [9, 11, 0])
def test_paired_lengths_differ(shuffled: bool, labels_len: int) -> None:
    labels = np.arange(labels_len)
    make = dzb.paired_shuffled_batch_stream if shuffled else dzb.paired_batch_stream
    with pytest.raises(ValueError, match=rf"\b10\b.*\b{labels_len}\b") as info:
        make(DATA, labels, 2)
    assert isinstance(info.value, dzb.LengthMismatchError)
    assert "features" in str(info.value) and "labels" in str(info.value)
    check_library_error(info.value)


def zero_d_inputs() -> list[Any]:
    z = zarr.create_array(zarr.storage.MemoryStore(), shape=(), dtype="float32")
    return [np.array(1.0, dtype=np.float32), z, da.from_array(np.array(3.0))]


@pytest.mark.parametrize("index", range(3))
@pytest.mark.parametrize("name", [*BATCHERS, "chunk_stream", "paired_labels"])
def test_zero_d_array(index: int, name: str) -> None:
    array = zero_d_inputs()[index]
    with pytest.raises(ValueError, match="0-d") as info:
        if name == "chunk_stream":
            dzb.chunk_stream(array)
        elif name == "paired_labels":
            dzb.paired_batch_stream(DATA, array, 2)
        elif name.startswith("paired"):
            dzb.paired_batch_stream(array, array, 2)
        else:
            call(name, array, 2)
    check_library_error(info.value)


@pytest.mark.parametrize("name", BATCHERS)
@pytest.mark.parametrize("kind", ["numpy", "zarr", "dask"])
def test_empty_array_yields_nothing_and_counts_zero(name: str, kind: str) -> None:
    empty = make_data((0, 4), "float32")
    array = {
        "numpy": empty,
        "zarr": to_zarr(empty, (3, 4)),
        "dask": da.from_array(empty, chunks=(3, 2)),
    }[kind]
    result = batchers()[name](array, 3)
    if name == "count_batches":
        assert result == 0
        assert dzb.count_batches(array, 3, drop_remainder=True) == 0
        return
    assert len(result) == 0
    assert list(result) == []


@pytest.mark.parametrize("bad", [[1, 2, 3], {"a": 1}, 5])
def test_not_an_array(bad: Any) -> None:
    with pytest.raises(TypeError, match=type(bad).__name__) as info:
        dzb.batch_stream(bad, 2)
    check_library_error(info.value)


def test_a_string_is_a_path_and_a_missing_one_is_named() -> None:
    """Every entry point takes a path or URL (open_array): a string is never "not an array"."""
    with pytest.raises(dzb.ArrayNotFoundError, match="no Zarr array or group at 'abc'") as info:
        dzb.batch_stream("abc", 2)
    check_library_error(info.value)


# --------------------------------------------------------------------------
# Other parameters


@pytest.mark.parametrize("paired", [False, True])
@pytest.mark.parametrize("bad", [0, -1, -100])
def test_shuffle_buffer_size_not_positive(paired: bool, bad: int) -> None:
    with pytest.raises(ValueError, match=f"shuffle_buffer_size.*{bad}") as info:
        if paired:
            dzb.paired_shuffled_batch_stream(DATA, LABELS, 2, shuffle_buffer_size=bad)
        else:
            dzb.shuffled_batch_stream(DATA, 2, shuffle_buffer_size=bad)
    check_library_error(info.value)


@pytest.mark.parametrize("bad", [2.5, "8", True])
def test_shuffle_buffer_size_wrong_type(bad: Any) -> None:
    with pytest.raises(TypeError, match="shuffle_buffer_size") as info:
        dzb.shuffled_batch_stream(DATA, 2, shuffle_buffer_size=bad)
    check_library_error(info.value)


@pytest.mark.parametrize("name", [n for n in BATCHERS if n != "count_batches"])
@pytest.mark.parametrize("bad", [-1, -5])
def test_prefetch_negative(name: str, bad: int) -> None:
    with pytest.raises(ValueError, match=f"prefetch.*{bad}") as info:
        call(name, DATA, 2, prefetch=bad)
    check_library_error(info.value)


def test_prefetch_zero_is_fine() -> None:
    batches = list(dzb.batch_stream(DATA, 3, prefetch=0))
    np.testing.assert_array_equal(np.concatenate(batches), DATA)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"seed": -1}, ValueError),
        ({"seed": 1.5}, TypeError),
        ({"seed": "1"}, TypeError),
        ({"epoch": -1}, ValueError),
        ({"drop_remainder": "yes"}, TypeError),
        ({"drop_remainder": 1}, TypeError),
        ({"timeout": 0}, ValueError),
        ({"timeout": "1"}, TypeError),
        ({"memory_budget": 0}, ValueError),
    ],
)
def test_other_shuffle_parameters(kwargs: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error, match=next(iter(kwargs))) as info:
        dzb.shuffled_batch_stream(DATA, 2, **kwargs)
    check_library_error(info.value)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"concurrency": 0}, ValueError),
        ({"concurrency": -2}, ValueError),
        ({"concurrency": 1.5}, TypeError),
        ({"ordered": "no"}, TypeError),
        ({"with_index": 1}, TypeError),
    ],
)
def test_chunk_stream_parameters(kwargs: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error, match=next(iter(kwargs))) as info:
        dzb.chunk_stream(DATA, **kwargs)
    check_library_error(info.value)


# --------------------------------------------------------------------------
# An undecodable chunk in a real store


def corrupt_store(
    tmp_path: pathlib.Path, zarr_format: int, chunk: int = 2
) -> tuple[pathlib.Path, np.ndarray]:
    """A local (10, 4) array with chunks (3, 4) whose axis-0 chunk ``chunk`` is garbage."""
    where = tmp_path / f"broken-v{zarr_format}.zarr"
    data = make_data((10, 4), "float32") + 1
    to_zarr(data, (3, 4), zarr_format=zarr_format, store=zarr.storage.LocalStore(where))
    key = f"c/{chunk}/0" if zarr_format == 3 else f"{chunk}.0"
    target = where / key
    assert target.is_file(), sorted(p.name for p in where.rglob("*"))
    target.write_bytes(b"this is not a compressed chunk" * 3)
    return where, data


def stream_over(name: str, source: Any) -> Any:
    window = 4 * 4 * 3  # one chunk a window, so earlier batches arrive first
    if name == "sequential":
        return dzb.batch_stream(source, 2, window_bytes=window, prefetch=0)
    if name == "buffered":
        return dzb.shuffled_batch_stream(source, 2, seed=0, shuffle_buffer_size=3)
    if name == "exact":
        return dzb.shuffled_batch_stream(source, 2, seed=0)
    if name == "paired":
        return dzb.paired_batch_stream(source, np.arange(10), 2, window_bytes=window)
    return dzb.chunk_stream(source, concurrency=1)


OPENERS = {
    "zarr.Array": lambda where: zarr.open_array(where, mode="r"),
    "open_array": lambda where: dzb.open_array(where),
    "open_array(str)": lambda where: dzb.open_array(str(where)),
}


@pytest.mark.parametrize("zarr_format", [2, 3])
@pytest.mark.parametrize("opener", list(OPENERS))
@pytest.mark.parametrize("name", ["sequential", "buffered", "exact", "paired", "chunk_stream"])
def test_undecodable_chunk_raises_from_next(
    tmp_path: pathlib.Path, zarr_format: int, opener: str, name: str
) -> None:
    where, data = corrupt_store(tmp_path, zarr_format)
    stream = stream_over(name, OPENERS[opener](where))
    good = []
    with pytest.raises(dzb.ChunkReadError) as info:
        for item in stream:
            good.append(item)
    message = str(info.value)
    assert where.name in message, message
    if name == "chunk_stream":
        assert "chunk (2, 0)" in message
        assert len(good) == 2  # chunks (0, 0) and (1, 0) came first, in order
    else:
        assert "chunk 2" in message and "6:9" in message
    if name == "sequential":
        assert len(good) == 3 and np.array_equal(np.concatenate(good), data[:6])
    assert isinstance(info.value, OSError)
    check_library_error(info.value)
    assert info.value.__cause__ is not None
    # the stream stops after the error, and says so: never a StopIteration that reads
    # as a finished epoch with the rest of the data gone
    with pytest.raises(dzb.StreamFailedError, match=type(info.value).__name__) as again:
        next(stream)
    assert again.value.__cause__ is info.value


def test_undecodable_chunk_behind_a_dask_computation(tmp_path: pathlib.Path) -> None:
    """A general dask graph over a broken store still fails loudly, not with wrong data."""
    where, _ = corrupt_store(tmp_path, 3)
    array = dzb.open_array(where) * 2
    with pytest.raises(dzb.DaskZarrBatchesError) as info:
        list(dzb.batch_stream(array, 2, window_bytes=48))
    assert "chunk" in str(info.value)


# --------------------------------------------------------------------------
# A store that does not answer in time


@pytest.mark.parametrize("name", ["sequential", "buffered", "chunk_stream", "unordered"])
def test_timeout_raises_from_next(name: str) -> None:
    memory = zarr.storage.MemoryStore()
    to_zarr(make_data((8, 2)) + 1, (4, 2), store=memory)
    array = open_wrapped(LatencyStore(memory, delay=1.5))
    stream: dzb.Stream[Any]
    if name == "sequential":
        stream = dzb.batch_stream(array, 2, timeout=0.2)
    elif name == "buffered":
        stream = dzb.shuffled_batch_stream(array, 2, seed=0, shuffle_buffer_size=4, timeout=0.2)
    else:
        stream = dzb.chunk_stream(array, timeout=0.2, ordered=name == "chunk_stream")
    started = time.perf_counter()
    with pytest.raises(TimeoutError, match=r"timeout=0\.2") as info:
        next(stream)
    assert time.perf_counter() - started < 1.2
    assert isinstance(info.value, dzb.WindowTimeoutError)
    check_library_error(info.value)
    with pytest.raises(dzb.StreamFailedError, match="WindowTimeoutError"):
        next(stream)
