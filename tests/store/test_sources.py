"""``open_array``: every kind of source, both Zarr formats, and wrong paths."""

from __future__ import annotations

import pathlib
import uuid
from typing import Any, Literal

import dask.array as da
import numpy as np
import pytest
import zarr
import zarr.storage
from hypothesis import given
from hypothesis import strategies as st
from strategies import make_data, property_settings, regular_chunks, shapes, to_zarr

import daskzarr_batches as dzb

FORMATS = [2, 3]


def as_format(zarr_format: int) -> Literal[2, 3]:
    assert zarr_format in (2, 3)
    return 3 if zarr_format == 3 else 2


def check_opened(result: Any, data: np.ndarray, chunks: tuple[int, ...]) -> None:
    assert isinstance(result, da.Array)
    assert result.dtype == data.dtype
    assert result.shape == data.shape
    assert result.chunks == da.core.normalize_chunks(chunks, data.shape)
    np.testing.assert_array_equal(result.compute(), data)


@property_settings(30)
@given(
    shape=shapes(max_rows=30),
    data=st.data(),
    zarr_format=st.sampled_from(FORMATS),
    dtype=st.sampled_from(["int16", "float32", "uint8", "float64"]),
)
def test_chunks_are_the_zarr_grid_with_cropped_edges(
    shape: tuple[int, ...], data: st.DataObject, zarr_format: int, dtype: str
) -> None:
    chunks = data.draw(regular_chunks(shape))
    values = (make_data(shape) % 200).astype(dtype)
    array = to_zarr(values, chunks, zarr_format=as_format(zarr_format))
    result = dzb.open_array(array)
    check_opened(result, values, chunks)
    for sizes, size, chunk in zip(result.chunks, shape, chunks, strict=True):
        assert all(s <= chunk for s in sizes)
        assert sum(sizes) == size


@pytest.fixture
def values() -> np.ndarray:
    return make_data((10, 4), "float32")


@pytest.mark.parametrize("zarr_format", FORMATS)
def test_group_and_path(values: np.ndarray, zarr_format: int) -> None:
    group = zarr.open_group(
        zarr.storage.MemoryStore(), mode="w", zarr_format=as_format(zarr_format)
    )
    group.create_array("features", data=values, chunks=(4, 4))
    group.create_group("sub").create_array("labels", data=np.arange(10), chunks=(3,))
    check_opened(dzb.open_array(group, "features"), values, (4, 4))
    check_opened(dzb.open_array(group, "sub/labels"), np.arange(10), (3,))
    check_opened(dzb.open_array(group, "/features"), values, (4, 4))


@pytest.mark.parametrize("zarr_format", FORMATS)
def test_store_object(values: np.ndarray, zarr_format: int) -> None:
    store = zarr.storage.MemoryStore()
    to_zarr(values, (3, 2), zarr_format=zarr_format, store=store)
    check_opened(dzb.open_array(store), values, (3, 2))


@pytest.mark.parametrize("zarr_format", FORMATS)
@pytest.mark.parametrize("as_path", [str, pathlib.Path])
def test_directory_store(
    tmp_path: pathlib.Path, values: np.ndarray, zarr_format: int, as_path: Any
) -> None:
    where = tmp_path / "data.zarr"
    group = zarr.open_group(str(where), mode="w", zarr_format=as_format(zarr_format))
    group.create_array("x", data=values, chunks=(4, 3))
    check_opened(dzb.open_array(as_path(where), "x"), values, (4, 3))
    single = tmp_path / "single.zarr"
    to_zarr(values, (6, 4), zarr_format=zarr_format, store=zarr.storage.LocalStore(single))
    check_opened(dzb.open_array(as_path(single)), values, (6, 4))


@pytest.mark.parametrize("zarr_format", FORMATS)
@pytest.mark.parametrize("as_path", [str, pathlib.Path])
def test_zip_store(
    tmp_path: pathlib.Path, values: np.ndarray, zarr_format: int, as_path: Any
) -> None:
    where = tmp_path / "data.zip"
    store = zarr.storage.ZipStore(where, mode="w")
    group = zarr.open_group(store, mode="w", zarr_format=as_format(zarr_format))
    group.create_array("x", data=values, chunks=(4, 4))
    store.close()
    result = dzb.open_array(as_path(where), "x")
    check_opened(result, values, (4, 4))
    batches = list(dzb.batch_stream(result, 3))
    np.testing.assert_array_equal(np.concatenate(batches), values)


def test_opened_array_streams_like_the_zarr_array(values: np.ndarray) -> None:
    array = to_zarr(values, (4, 4))
    opened = dzb.open_array(array)
    a = list(dzb.shuffled_batch_stream(opened, 3, seed=4, shuffle_buffer_size=5))
    b = list(dzb.shuffled_batch_stream(array, 3, seed=4, shuffle_buffer_size=5))
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    assert [c.shape for c in dzb.chunk_stream(opened)] == [(4, 4), (4, 4), (2, 4)]


# --------------------------------------------------------------------------
# Wrong paths


@pytest.mark.parametrize("zarr_format", FORMATS)
def test_wrong_path_lists_the_arrays_that_exist(zarr_format: int, values: np.ndarray) -> None:
    group = zarr.open_group(
        zarr.storage.MemoryStore(), mode="w", zarr_format=as_format(zarr_format)
    )
    group.create_array("features", data=values, chunks=(4, 4))
    group.create_group("sub").create_array("labels", data=np.arange(10), chunks=(3,))
    for source in (group, group.store):
        with pytest.raises(dzb.ArrayNotFoundError) as info:
            dzb.open_array(source, "featurez")
        message = str(info.value)
        assert "'featurez'" in message
        assert "'features'" in message and "'sub/labels'" in message
        assert isinstance(info.value, KeyError | FileNotFoundError)
        assert isinstance(info.value, dzb.DaskZarrBatchesError)
    with pytest.raises(dzb.ArrayNotFoundError, match="a group at path 'sub'"):
        dzb.open_array(group, "sub")


def test_group_without_path_lists_its_arrays(values: np.ndarray) -> None:
    group = zarr.open_group(zarr.storage.MemoryStore(), mode="w")
    group.create_array("a", data=values, chunks=(4, 4))
    group.create_array("b", data=values, chunks=(4, 4))
    with pytest.raises(dzb.ArrayNotFoundError, match=r"pass path=.*'a', 'b'"):
        dzb.open_array(group)
    empty = zarr.open_group(zarr.storage.MemoryStore(), mode="w")
    with pytest.raises(dzb.ArrayNotFoundError, match="none"):
        dzb.open_array(empty)


@pytest.mark.parametrize("name", ["nothing-here.zarr", "nothing-here.zip", ""])
def test_missing_or_empty_location(tmp_path: pathlib.Path, name: str) -> None:
    where = tmp_path / name
    with pytest.raises(dzb.ArrayNotFoundError, match=f"no Zarr array or group at .*{where}"):
        dzb.open_array(where)
    with pytest.raises(FileNotFoundError):
        dzb.open_array(str(where), "x")


def test_path_into_a_single_array_or_an_array_object(values: np.ndarray) -> None:
    store = zarr.storage.MemoryStore()
    array = to_zarr(values, (4, 4), store=store)
    with pytest.raises(dzb.ArrayNotFoundError, match="single array"):
        dzb.open_array(store, "x")
    with pytest.raises(dzb.ArgumentValueError, match="path='x'"):
        dzb.open_array(array, "x")


def test_unopenable_source_type() -> None:
    with pytest.raises(dzb.ArgumentTypeError, match="int"):
        dzb.open_array(42)


# --------------------------------------------------------------------------
# fsspec URLs


def test_fsspec_memory_url_with_storage_options(values: np.ndarray) -> None:
    fsspec = pytest.importorskip("fsspec")
    url = f"memory://dzb-{uuid.uuid4().hex}/data.zarr"
    try:
        group = zarr.open_group(url, mode="w")
        group.create_array("x", data=values, chunks=(4, 4))
    except Exception as exc:  # pragma: no cover - depends on the installed fsspec
        pytest.skip(f"zarr cannot write memory:// through fsspec here: {exc!r}")
    try:
        result = dzb.open_array(url, "x", storage_options={"skip_instance_cache": False})
        check_opened(result, values, (4, 4))
        np.testing.assert_array_equal(np.concatenate(list(dzb.batch_stream(result, 3))), values)
        with pytest.raises(dzb.ArrayNotFoundError, match="'x'"):
            dzb.open_array(url, "y", storage_options={})
    finally:
        fsspec.filesystem("memory").rm(url.removeprefix("memory://"), recursive=True)


@pytest.mark.parametrize("as_path", [str, pathlib.Path])
def test_empty_storage_options_with_a_local_path(
    tmp_path: pathlib.Path, values: np.ndarray, as_path: Any
) -> None:
    """Generic code passing ``storage_options=opts or {}`` must work for local paths."""
    where = tmp_path / "x.zarr"
    to_zarr(values, (4, 4), store=zarr.storage.LocalStore(where))
    check_opened(dzb.open_array(as_path(where), storage_options={}), values, (4, 4))


def test_storage_options_for_a_local_path_is_a_library_error(
    tmp_path: pathlib.Path, values: np.ndarray
) -> None:
    where = tmp_path / "x.zarr"
    to_zarr(values, (4, 4), store=zarr.storage.LocalStore(where))
    with pytest.raises(TypeError, match="storage_options") as info:
        dzb.open_array(str(where), storage_options={"anon": True})
    assert isinstance(info.value, dzb.DaskZarrBatchesError)
    assert str(where) in str(info.value)


def test_unknown_url_protocol_is_a_library_error() -> None:
    with pytest.raises(ValueError, match="nosuchproto") as info:
        dzb.open_array("nosuchproto://bucket/data.zarr")
    assert isinstance(info.value, dzb.DaskZarrBatchesError)
