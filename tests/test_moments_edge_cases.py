"""feature_moments / Moments on inputs issue 7 found loose: complex data and zero features."""

from __future__ import annotations

from typing import Any

import dask.array as da
import numpy as np
import pytest
import zarr

import daskzarr_batches as dzb

pytestmark = pytest.mark.timeout(120)


def as_kind(data: np.ndarray, kind: str, chunks: tuple[int, ...]) -> Any:
    """``data`` as a Zarr, numpy or dask array (Zarr and dask chunked by ``chunks``)."""
    if kind == "numpy":
        return data
    if kind == "dask":
        return da.from_array(data, chunks=chunks)
    array = zarr.create_array(
        store={}, shape=data.shape, chunks=tuple(max(c, 1) for c in chunks), dtype=data.dtype
    )
    array[...] = data
    return array


KINDS = ["zarr", "numpy", "dask"]


# --------------------------------------------------------------------------
# arrays without features, or without samples


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("shape", "chunks"),
    [((7, 0), (3, 1)), ((7, 3, 0), (3, 3, 1)), ((7, 0, 3), (3, 1, 3)), ((1, 0), (1, 1))],
)
def test_samples_without_features_are_counted(
    kind: str, shape: tuple[int, ...], chunks: tuple[int, ...]
) -> None:
    moments = dzb.feature_moments(as_kind(np.zeros(shape, dtype="float32"), kind, chunks))
    assert moments.count == shape[0]
    assert moments.mean.shape == shape[1:] and moments.m2.shape == shape[1:]
    assert moments.variance().shape == shape[1:]
    assert moments.std(ddof=1).shape == shape[1:]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("shape", "chunks"), [((0, 4), (2, 2)), ((0, 0), (1, 1)), ((0,), (1,))])
def test_no_samples_count_zero(kind: str, shape: tuple[int, ...], chunks: tuple[int, ...]) -> None:
    moments = dzb.feature_moments(as_kind(np.zeros(shape, dtype="float64"), kind, chunks))
    assert moments.count == 0
    assert moments.mean.shape == shape[1:]
    assert np.isnan(moments.variance()).all()
