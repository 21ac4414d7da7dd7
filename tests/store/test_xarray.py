"""xarray inputs: a DataArray streams its data, a Dataset is a Loader's dict of variables."""

from __future__ import annotations

import pathlib
import subprocess
import sys
from typing import Any

import dask.array as da
import numpy as np
import pytest

import daskzarr_batches as dzb
from daskzarr_batches.store.sources import DaskSource, as_source

xr = pytest.importorskip("xarray")

N, K = 37, 3


def numpy_data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.standard_normal((N, K)).astype("f4"), np.arange(N, dtype="i8")


@pytest.fixture
def opened(tmp_path: pathlib.Path) -> Any:
    """The data of numpy_data written to Zarr by xarray and opened back, dask-backed."""
    x, y = numpy_data()
    ds = xr.Dataset({"features": (("sample", "k"), x), "labels": ("sample", y)})
    ds.chunk({"sample": 8}).to_zarr(tmp_path / "ds.zarr", consolidated=False)
    return xr.open_zarr(tmp_path / "ds.zarr", consolidated=False)


def same(a: list[Any], b: list[Any]) -> None:
    assert len(a) == len(b)
    for left, right in zip(a, b, strict=True):
        if isinstance(left, dict):
            assert left.keys() == right.keys()
            for name in left:
                np.testing.assert_array_equal(left[name], right[name], strict=True)
        elif isinstance(left, tuple):
            for p, q in zip(left, right, strict=True):
                np.testing.assert_array_equal(p, q, strict=True)
        else:
            np.testing.assert_array_equal(left, right, strict=True)


def test_opened_dataset_is_dask_backed_with_the_stored_chunks(opened: Any) -> None:
    source = as_source(opened["features"])
    assert isinstance(source, DaskSource)
    assert source.chunks == ((8, 8, 8, 8, 5), (K,))
    assert "'features'" in source.name


@pytest.mark.parametrize("shuffle", [False, True])
def test_loader_over_a_dataset_matches_numpy(opened: Any, shuffle: bool) -> None:
    x, y = numpy_data()
    kw: dict[str, Any] = {"shuffle": shuffle, "seed": 3}
    got = list(dzb.Loader(opened, 5, **kw))
    data = {"features": x, "labels": y}
    want = list(dzb.Loader({name: data[name] for name in opened.data_vars}, 5, **kw))
    assert list(got[0]) == list(opened.data_vars)  # zarr lists them in its own order
    assert sorted(got[0]) == ["features", "labels"]
    same(got, want)


def test_loader_over_one_data_array(opened: Any) -> None:
    _, y = numpy_data()
    same(list(dzb.Loader(opened["labels"], 6)), list(dzb.Loader(y, 6)))


def test_streams_over_data_arrays_match_numpy(opened: Any) -> None:
    x, y = numpy_data()
    same(list(dzb.batch_stream(opened["features"], 4)), list(dzb.batch_stream(x, 4)))
    pair = (opened["features"], opened["labels"])
    got = list(dzb.paired_shuffled_batch_stream(*pair, 4, seed=1))
    same(got, list(dzb.paired_shuffled_batch_stream(x, y, 4, seed=1)))
    assert dzb.count_batches(opened["labels"], 4) == dzb.count_batches(y, 4)


def test_numpy_backed_data_array() -> None:
    x, _ = numpy_data()
    array = xr.DataArray(x, dims=("sample", "k"), name="x")
    same(
        list(dzb.shuffled_batch_stream(array, 7, seed=2)),
        list(dzb.shuffled_batch_stream(x, 7, seed=2)),
    )
    # chunked by xarray: streams read its dask chunks
    chunked = array.chunk({"sample": 10})
    assert as_source(chunked).chunks == da.from_array(x, chunks=(10, K)).chunks
    same(list(dzb.batch_stream(chunked, 7)), list(dzb.batch_stream(x, 7)))


def test_variables_of_different_lengths(opened: Any) -> None:
    ds = xr.Dataset({"a": ("s", np.arange(4)), "b": ("t", np.arange(5))})
    with pytest.raises(dzb.LengthMismatchError, match=r"a has 4 samples.*b has 5 samples"):
        dzb.Loader(ds, 2)


def test_errors_name_the_data_array() -> None:
    words = xr.DataArray(np.array(["a", "b"]), dims="s", name="words")
    with pytest.raises(dzb.ArgumentTypeError, match=r"array \(DataArray 'words'\) has dtype"):
        dzb.batch_stream(words, 1)
    with pytest.raises(dzb.ArgumentTypeError, match=r"^words has dtype"):
        dzb.Loader(xr.Dataset({"words": words}), 1)


def test_works_without_xarray() -> None:
    # dask.array itself imports xarray when it is installed: block it instead
    code = (
        "import sys; sys.modules['xarray'] = None\n"
        "import numpy as np, daskzarr_batches as d\n"
        "assert [b['a'].tolist() for b in d.Loader({'a': np.arange(3)}, 2)] == [[0, 1], [2]]\n"
        "assert len(list(d.batch_stream(np.arange(3), 2))) == 2\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_lazily_backed_without_dask(opened: Any, tmp_path: pathlib.Path) -> None:
    lazy = xr.open_zarr(tmp_path / "ds.zarr", chunks=None, consolidated=False)
    x, y = numpy_data()
    same(
        list(dzb.Loader(lazy, 6, shuffle=True)),
        list(
            dzb.Loader(
                {name: {"features": x, "labels": y}[name] for name in lazy.data_vars},
                6,
                shuffle=True,
            )
        ),
    )
