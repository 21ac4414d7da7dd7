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


def complex_data(shape: tuple[int, ...], dtype: str, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    # an offset far from 0 in both parts: a naive E[|x|^2] - |E[x]|^2 would cancel
    real = rng.normal(1e3, 2.0, shape)
    imag = rng.normal(-5e2, 3.0, shape)
    return (real + 1j * imag).astype(dtype)


# --------------------------------------------------------------------------
# complex data: mean in complex128, m2 and variance real (sum of |x - mean|^2)

KINDS = ["zarr", "numpy", "dask"]
COMPLEX_CHUNKINGS = {
    "rows": ((37, 5), (8, 5)),  # chunked along axis 0 only
    "features": ((37, 5), (37, 2)),  # chunked along the feature axis only
    "both": ((37, 5), (10, 2)),
    "3d": ((29, 3, 4), (7, 2, 3)),
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
@pytest.mark.parametrize("layout", list(COMPLEX_CHUNKINGS))
def test_feature_moments_of_complex_data_match_numpy(kind: str, dtype: str, layout: str) -> None:
    shape, chunks = COMPLEX_CHUNKINGS[layout]
    data = complex_data(shape, dtype)
    moments = dzb.feature_moments(as_kind(data, kind, chunks), io_concurrency=2)
    assert moments.count == shape[0]
    assert moments.mean.dtype == np.complex128
    assert moments.mean.shape == shape[1:]
    assert moments.m2.dtype == np.float64
    exact = data.astype(np.complex128)
    np.testing.assert_allclose(moments.mean, np.mean(exact, axis=0), rtol=1e-12)
    variance = moments.variance()
    assert variance.dtype == np.float64
    np.testing.assert_allclose(variance, np.var(exact, axis=0), rtol=1e-9)
    np.testing.assert_allclose(moments.std(ddof=1), np.std(exact, axis=0, ddof=1), rtol=1e-9)


def test_complex_moments_merge_uses_the_squared_modulus_of_the_delta() -> None:
    data = complex_data((1000, 2), "complex128", seed=1)
    left, right = dzb.Moments.from_chunk(data[:300]), dzb.Moments.from_chunk(data[300:])
    merged = left.merge(right)
    assert merged.count == 1000
    np.testing.assert_allclose(merged.mean, data.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(merged.variance(), data.var(axis=0), rtol=1e-9)
    assert merged.m2.dtype == np.float64


def test_complex_moments_of_no_samples_keep_a_complex_mean() -> None:
    empty = dzb.Moments.from_chunk(np.zeros((0, 3), dtype="complex64"))
    assert empty.count == 0 and empty.mean.dtype == np.complex128 and empty.mean.shape == (3,)
    assert empty.m2.dtype == np.float64
    moments = dzb.feature_moments(np.zeros((0, 3), dtype="complex64"))
    assert moments.count == 0 and moments.mean.dtype == np.complex128
    assert np.isnan(moments.variance()).all() and moments.variance().dtype == np.float64


def test_real_data_keeps_float64_statistics() -> None:
    data = np.arange(24, dtype="int16").reshape(8, 3)
    moments = dzb.feature_moments(data)
    assert moments.mean.dtype == np.float64 and moments.m2.dtype == np.float64
    np.testing.assert_allclose(moments.variance(), data.var(axis=0))


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
