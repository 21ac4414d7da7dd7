"""Every public entry point that takes an array takes a path or URL too (``open_array`` semantics).

A ``str`` or ``os.PathLike`` naming a store whose root is an array (no
``path=``) is opened with :func:`open_array`; the result equals reading the
array object itself.
"""

from __future__ import annotations

import operator
import pathlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import zarr

import daskzarr_batches as dzb

pytestmark = pytest.mark.timeout(120)

DATA = np.arange(40.0, dtype="f4").reshape(20, 2)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    where = tmp_path_factory.mktemp("paths") / "x.zarr"
    array = zarr.create_array(store=str(where), shape=DATA.shape, chunks=(6, 2), dtype="f4")
    array[:] = DATA
    return where


def batches(stream: Any) -> np.ndarray:
    with stream:
        return np.concatenate([b[0] if isinstance(b, tuple) else b for b in stream])


ENTRY_POINTS: dict[str, Callable[[Any], Any]] = {
    "batch_stream": lambda a: batches(dzb.batch_stream(a, 4)),
    "shuffled_batch_stream": lambda a: np.sort(
        batches(dzb.shuffled_batch_stream(a, 4, seed=0)), axis=0
    ),
    "paired_batch_stream": lambda a: batches(dzb.paired_batch_stream(a, a, 4)),
    "paired_shuffled_batch_stream": lambda a: np.sort(
        batches(dzb.paired_shuffled_batch_stream(a, a, 4, seed=0)), axis=0
    ),
    "chunk_stream": lambda a: batches(dzb.chunk_stream(a)),
    "map_chunks": lambda a: np.array(list(dzb.map_chunks(np.sum, a))),
    "reduce_chunks": lambda a: dzb.reduce_chunks(np.sum, operator.add, a),
    "feature_moments": lambda a: dzb.feature_moments(a).mean,
    "count_batches": lambda a: dzb.count_batches(a, 3),
    "plan_epoch": lambda a: dzb.plan_epoch(a, 3).n_batches,
    "Loader": lambda a: np.concatenate(list(dzb.Loader(a, 4))),
    "Loader dict": lambda a: np.concatenate([b["x"] for b in dzb.Loader({"x": a}, 4)]),
}


@pytest.mark.parametrize("kind", ["str", "PathLike", "file URL"])
@pytest.mark.parametrize("name", list(ENTRY_POINTS))
def test_entry_point_takes_a_path(name: str, kind: str, store: pathlib.Path) -> None:
    where: Any = {"str": str(store), "PathLike": store, "file URL": store.as_uri()}[kind]
    expected = ENTRY_POINTS[name](zarr.open_array(str(store), mode="r"))
    np.testing.assert_array_equal(ENTRY_POINTS[name](where), expected)


def test_a_path_that_is_no_array_is_a_library_error(tmp_path: pathlib.Path) -> None:
    with pytest.raises(dzb.DaskZarrBatchesError):
        dzb.batch_stream(str(tmp_path / "nothing.zarr"), 2)
