"""Hypothesis strategies and builders shared by the test modules.

Shapes include a zero-length axis 0 and zero-width other axes; chunk grids
include chunks larger than the axis and short last chunks.  The same data can
be built as a ``zarr.Array`` (memory store, format 2 or 3), a dask array
(arbitrary chunking, also along the other axes), a dask array opened over a
Zarr array (the path the library reads as Zarr), a Zarr array in a local
directory opened with zarrs' Rust codec pipeline, or a plain numpy array.

Data is ``arange`` shaped to the array, so the first element of sample ``i``
is ``i * row_width``: :func:`sample_ids` recovers which samples a batch holds.
"""

from __future__ import annotations

import atexit
import itertools
import math
import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any

import dask.array as da
import numpy as np
import zarr
import zarr.storage
from hypothesis import settings
from hypothesis import strategies as st

from daskzarr_batches.plan.epoch import EpochPlan
from daskzarr_batches.plan.windows import chunk_offsets

__all__ = [
    "DTYPES",
    "INPUT_KINDS",
    "MODES",
    "ArrayCase",
    "array_cases",
    "axis0_chunks",
    "batch_sizes",
    "buffer_sizes",
    "build_input",
    "chunk_rows",
    "irregular_chunks",
    "local_path",
    "make_data",
    "plans",
    "property_settings",
    "regular_chunks",
    "sample_ids",
    "seeds",
    "shapes",
    "to_dask",
    "to_zarr",
]

DTYPES = ("int32", "int64", "float32", "float64", "uint16")

#: the shuffle modes of an epoch plan
MODES = ("none", "buffer", "exact")

#: numpy, zarr (formats 2 and 3), a general dask array, a dask array over zarr, and zarr
#: (format 3) in a local directory read by zarrs' Rust codec pipeline.
INPUT_KINDS = ("numpy", "zarr2", "zarr3", "dask", "dask_zarr", "zarrs")

_local_root: list[str] = []


def local_path(name: str = "a.zarr") -> str:
    """A fresh path in a directory of this process, removed at exit (zarrs reads local stores)."""
    if not _local_root:
        _local_root.append(tempfile.mkdtemp(prefix="dzb-tests-"))
        atexit.register(shutil.rmtree, _local_root[0], True)
    return tempfile.mkdtemp(dir=_local_root[0]) + "/" + name


def property_settings(max_examples: int) -> settings:
    """Settings of a property test: ``max_examples`` times ``$DZB_EXAMPLES_SCALE``.

    The default keeps the suite fast; ``DZB_EXAMPLES_SCALE=20`` hunts harder, with
    ``DZB_HYPOTHESIS=random`` (tests/conftest.py) drawing new examples each run.
    """
    scale = float(os.environ.get("DZB_EXAMPLES_SCALE", "1"))
    return settings(max_examples=max(1, round(max_examples * scale)), deadline=None)


seeds = st.integers(min_value=0, max_value=2**32 - 1)


@st.composite
def shapes(
    draw: st.DrawFn,
    *,
    min_dims: int = 1,
    max_dims: int = 3,
    max_rows: int = 40,
    max_width: int = 4,
    min_rows: int = 0,
    min_width: int = 0,
) -> tuple[int, ...]:
    """1-D to 3-D shapes; axis 0 may be empty, other axes may have width 0."""
    ndim = draw(st.integers(min_dims, max_dims))
    rows = draw(st.integers(min_rows, max_rows))
    rest = tuple(draw(st.integers(min_width, max_width)) for _ in range(ndim - 1))
    return (rows, *rest)


@st.composite
def regular_chunks(draw: st.DrawFn, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A Zarr chunk shape: one size per axis, possibly larger than the axis."""
    return tuple(draw(st.integers(1, max(size, 1) + 2)) for size in shape)


def _split(draw: st.DrawFn, size: int) -> tuple[int, ...]:
    if size <= 1:
        return (size,)
    cuts = draw(st.sets(st.integers(1, size - 1), max_size=min(size - 1, 8)))
    bounds = [0, *sorted(cuts), size]
    sizes = [b - a for a, b in itertools.pairwise(bounds)]
    for position in draw(st.lists(st.integers(0, len(sizes)), max_size=2)):
        sizes.insert(position, 0)  # dask allows empty chunks anywhere
    return tuple(sizes)


@st.composite
def irregular_chunks(draw: st.DrawFn, shape: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """Dask chunks: arbitrary sizes per axis (not a regular grid), some maybe empty."""
    return tuple(_split(draw, size) for size in shape)


def batch_sizes(n_samples: int) -> st.SearchStrategy[int]:
    """Batch sizes from 1 to a little more than the array."""
    return st.integers(1, n_samples + 3)


def buffer_sizes(n_samples: int) -> st.SearchStrategy[int]:
    """Shuffle buffer sizes from 1 sample to more than the array."""
    return st.integers(1, n_samples + 5)


def make_data(shape: tuple[int, ...], dtype: str = "int32") -> np.ndarray:
    """``arange`` data of ``shape``: sample ``i`` starts with ``i * row_width``."""
    return np.arange(math.prod(shape)).reshape(shape).astype(dtype)


def row_width(shape: tuple[int, ...]) -> int:
    return math.prod(shape[1:])


def sample_ids(batch: np.ndarray) -> np.ndarray:
    """Which samples of :func:`make_data` data the rows of ``batch`` are."""
    width = row_width(batch.shape)
    assert width > 0, "zero-width samples carry no identity"
    return (batch.reshape(len(batch), width)[:, 0].astype(np.int64)) // width


def to_zarr(
    data: np.ndarray,
    chunks: tuple[int, ...],
    *,
    zarr_format: int = 3,
    store: Any = None,
) -> zarr.Array:
    """``data`` written to a Zarr array (a fresh memory store by default)."""
    array = zarr.create_array(
        store=zarr.storage.MemoryStore() if store is None else store,
        shape=data.shape,
        chunks=chunks,
        dtype=data.dtype,
        zarr_format=zarr_format,  # type: ignore[arg-type]
    )
    if data.size:
        array[...] = data
    return array


def to_dask(data: np.ndarray, chunks: Any) -> da.Array:
    """``data`` as a general dask array (read through its own graph)."""
    return da.from_array(data, chunks=chunks)


@dataclass(frozen=True)
class ArrayCase:
    """One input: the expected data, the input object and how it is chunked."""

    kind: str
    data: np.ndarray
    array: Any
    chunks: tuple[tuple[int, ...], ...] | None  # None: numpy, chunked by the library

    @property
    def n(self) -> int:
        return int(self.data.shape[0])

    def __repr__(self) -> str:  # hypothesis prints this on failure
        return (
            f"ArrayCase(kind={self.kind!r}, shape={self.data.shape}, "
            f"dtype={self.data.dtype}, chunks={self.chunks})"
        )


def axis0_chunks(chunks: tuple[tuple[int, ...], ...]) -> tuple[int, ...]:
    return chunks[0]


def build_input(
    kind: str,
    data: np.ndarray,
    zarr_chunks: tuple[int, ...],
    dask_chunks: tuple[tuple[int, ...], ...],
) -> ArrayCase:
    """Build ``data`` as input ``kind`` (see :data:`INPUT_KINDS`)."""
    grid = tuple(da.core.normalize_chunks(zarr_chunks, data.shape))
    if kind == "numpy":
        return ArrayCase(kind, data, data, None)
    if kind in ("zarr2", "zarr3"):
        array = to_zarr(data, zarr_chunks, zarr_format=int(kind[-1]))
        return ArrayCase(kind, data, array, grid)
    if kind == "dask":
        return ArrayCase(kind, data, to_dask(data, dask_chunks), tuple(dask_chunks))
    if kind == "dask_zarr":
        array = da.from_zarr(to_zarr(data, zarr_chunks, zarr_format=3))
        return ArrayCase(kind, data, array, grid)
    if kind == "zarrs":
        import daskzarr_batches as dzb

        path = local_path()
        to_zarr(data, zarr_chunks, store=zarr.storage.LocalStore(path))
        return ArrayCase(kind, data, dzb.open_array(path, codec_pipeline="zarrs"), grid)
    raise ValueError(f"unknown input kind {kind!r}")


@st.composite
def array_cases(
    draw: st.DrawFn,
    *,
    kinds: tuple[str, ...] = INPUT_KINDS,
    min_dims: int = 1,
    max_dims: int = 3,
    max_rows: int = 40,
    min_rows: int = 0,
    min_width: int = 0,
    dtypes: tuple[str, ...] = DTYPES,
) -> ArrayCase:
    """An input array of a random kind, shape, dtype and chunking."""
    shape = draw(
        shapes(
            min_dims=min_dims,
            max_dims=max_dims,
            max_rows=max_rows,
            min_rows=min_rows,
            min_width=min_width,
        )
    )
    dtype = draw(st.sampled_from(dtypes))
    kind = draw(st.sampled_from(kinds))
    data = make_data(shape, dtype)
    zarr_chunks = draw(regular_chunks(shape))
    dask_chunks = draw(irregular_chunks(shape))
    return build_input(kind, data, zarr_chunks, dask_chunks)


# Epoch plans (tests/plan/test_plan.py, tests/read/test_window_order.py): pure, no data.
@st.composite
def chunk_rows(draw: st.DrawFn, n: int) -> tuple[int, ...]:
    """Axis-0 chunk sizes summing to ``n``: regular with a short last chunk, or ragged."""
    if n == 0:
        return (0,)
    if draw(st.booleans()):
        size = draw(st.integers(1, n + 2))
        full, rest = divmod(n, size)
        return (size,) * full + ((rest,) if rest else ())
    return draw(irregular_chunks((n,)))[0]


@st.composite
def plans(
    draw: st.DrawFn,
    *,
    modes: tuple[str, ...] = MODES,
    paired: bool | None = None,
    drop: bool | None = None,
) -> EpochPlan:
    n = draw(st.integers(0, 60))
    arrays = draw(st.integers(1, 2)) if paired is None else (2 if paired else 1)
    offsets = tuple(chunk_offsets(draw(chunk_rows(n))) for _ in range(arrays))
    return EpochPlan(
        n_samples=n,
        offsets=offsets,
        batch_size=draw(st.integers(1, n + 3)),
        drop_remainder=draw(st.booleans()) if drop is None else drop,
        shuffle=draw(st.sampled_from(modes)),
        window_rows=draw(st.integers(1, n + 5)),
        seed=draw(seeds),
        epoch=draw(st.integers(0, 3)),
    )


# ---------------------------------------------------------------- interrupted epochs


class Interrupted(Exception):
    """Raised by an interrupted epoch's loop body or transform (``interruptions``)."""


#: what interrupts an epoch: a ``break``, an exception in the loop body, or the
#: Loader's ``transform`` raising on one of its calls
INTERRUPTIONS = ("break", "body", "transform")


@st.composite
def interruptions(draw: st.DrawFn) -> dict[str, Any]:
    """An epoch of ``n`` samples (``y = arange(n)``) to run through interruptions.

    ``events``: (kind, k) pairs: after the ``k``-th batch handed out in all
    (``break`` / ``body``), or at the ``k``-th call of the transform.
    """
    n = draw(st.integers(1, 60))
    events = draw(
        st.lists(st.tuples(st.sampled_from(INTERRUPTIONS), st.integers(1, 12)), max_size=4)
    )
    return {
        "n": n,
        "batch": draw(st.integers(1, 9)),
        "mode": draw(st.sampled_from(MODES)),
        "events": events,
    }


def interrupted_epoch(case: dict[str, Any], feed: Any, ids: Any) -> tuple[list[int], list[int]]:
    """One epoch of ``feed(loader)`` run through ``case``'s interruptions.

    Returns the sample ids handed out over every re-iteration until the epoch
    ends, and those of the same epoch uninterrupted.  After each interruption
    ``state_dict()["batches"]`` must count the batches handed out, and a new
    feed loaded with it must hand out exactly the rest of the epoch.
    ``feed(loader)``: what is iterated (the loader itself, or a device feed over
    it); ``ids(batch)``: a batch's sample ids.
    """
    import daskzarr_batches as dzb

    n, batch, mode = case["n"], case["batch"], case["mode"]
    kw: dict[str, Any] = {"shuffle": mode != "none", "seed": 7}
    if mode == "buffer":
        kw["shuffle_buffer_size"] = 9
    y = np.arange(n, dtype="i8")
    failing = {k for kind, k in case["events"] if kind == "transform"}
    calls = [0]

    def transform(b: Any) -> Any:
        calls[0] += 1
        if calls[0] in failing:
            raise Interrupted(f"transform call {calls[0]}")
        return b

    def make(**more: Any) -> Any:
        return feed(dzb.Loader(y, batch, transform=transform, **kw, **more))

    calls[0] = -(10**6)  # no transform error in the uninterrupted run
    whole = [i for b in make() for i in ids(b)]
    calls[0] = 0
    stops = {k: kind for kind, k in case["events"] if kind != "transform"}
    interrupted, seen, handed = make(), [], 0
    epoch = interrupted.epoch
    for _ in range(4 * len(case["events"]) + 4):
        try:
            for b in interrupted:
                seen += ids(b)
                handed += 1
                kind = stops.pop(handed, None)
                if kind == "break":
                    break
                if kind == "body":
                    raise Interrupted(f"loop body at batch {handed}")
            else:
                break  # the epoch ended
        except Interrupted:
            pass
        state = interrupted.state_dict()
        assert state["batches"] == handed, (state, handed)
        assert interrupted.epoch == epoch
        kept, calls[0] = calls[0], -(10**6)  # no transform error in the check
        fresh = make()
        fresh.load_state_dict(state)
        rest = [i for b in fresh for i in ids(b)]
        calls[0] = kept
        assert seen + rest == whole, (seen, rest, whole)
    assert interrupted.epoch == epoch + 1
    assert seen == whole  # every sample once, in the uninterrupted order
    return seen, whole
