"""Every use of ``daskzarr_batches``' private modules by the benchmarks, in one place.

The benchmarks use the public API (``import daskzarr_batches as dzb``) wherever
it has what they need.  What follows has no public equivalent yet; when the
package moves its private modules, this is the one file to fix.  Each entry
says which benchmark needs it and what public function would replace it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import zarr

__all__ = [
    "buffer_estimate",
    "codec_pipeline_of",
    "direct_fetch",
    "exact_window_rows",
    "order_quality",
    "peak_in_flight",
    "time_batch_cutting",
    "zarr_behind",
]


def direct_fetch(client: Any) -> bool:
    """Whether streams on ``client`` fetch windows from the workers, not via the scheduler.

    ``suite.cases.transfer_only``: the ceiling fetched as the streams fetch.
    Public replacement: none (``execute.runners.direct_fetch``).
    """
    from daskzarr_batches.execute.runners import direct_fetch as chosen

    return bool(chosen(client))


def exact_window_rows(budget: int, row_bytes: int) -> int:
    """Samples per window of an exact shuffle with ``memory_budget=budget``, prefetch 0.

    ``suite.cases.quarter_windows_budget``: the budget whose windows hold a
    quarter of the samples.  Public replacement: the window size of
    ``plan_epoch`` without an array (``_plan.exact_budget``).
    """
    from daskzarr_batches.plan.budget import exact_budget

    return int(exact_budget(budget, row_bytes, 0).window_rows)


def buffer_estimate(units: Any, rows: int) -> float:
    """The mean-over-epochs neighbour entropy estimate of a buffer of ``rows``.

    ``suite.quality``: the curve ``shuffle_buffer_size="auto"`` starts its
    search from, beside each epoch's own figure.  Public replacement: none
    planned (the choice itself is held to the epoch's figure).
    """
    from daskzarr_batches.plan.quality import buffer_entropy

    return float(buffer_entropy(units, rows))


def zarr_behind(array: Any) -> zarr.Array:
    """The ``zarr.Array`` behind a dask array made by ``dzb.open_array``.

    ``codec_pipelines``: zarr's own ``x[:]`` with the pipeline ``open_array``
    chose.  Public replacement: ``open_array`` returning (or exposing) its
    Zarr array.
    """
    from daskzarr_batches.store.sources import _zarr_behind

    found = _zarr_behind(array)
    assert found is not None, "not an array made by open_array"
    return found


def codec_pipeline_of(array: zarr.Array) -> str:
    """``"zarrs"`` or ``"zarr"``: which pipeline decodes ``array`` (``codec_pipelines``)."""
    from daskzarr_batches.store.pipelines import codec_pipeline_of as pipeline_of

    return str(pipeline_of(array))


@contextlib.contextmanager
def time_batch_cutting(spent: dict[str, float]) -> Iterator[None]:
    """Seconds the consumer spends cutting batches and aligning windows, added to ``spent``.

    ``profile_cluster``: wraps ``plan.batching._rows`` (``"cut"``: slices, or
    ``np.take`` by the plan order) and ``streams.batch._aligned`` (``"align"``:
    copies of unaligned windows) while the block runs.  Public replacement:
    these times in ``StreamStats``.
    """
    from daskzarr_batches.plan import batching
    from daskzarr_batches.streams import batch

    patched: list[tuple[Any, str, Callable[..., Any]]] = []
    for module, name, label in ((batching, "_rows", "cut"), (batch, "_aligned", "align")):
        original = getattr(module, name)
        patched.append((module, name, original))
        setattr(module, name, _timed(original, label, spent))
    try:
        yield
    finally:
        for module, name, original in patched:
            setattr(module, name, original)


def _timed(function: Callable[..., Any], label: str, spent: dict[str, float]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            spent[label] = spent.get(label, 0.0) + time.perf_counter() - started

    return wrapper


def peak_in_flight(stream: Any) -> int:
    """The most windows a stream's runner had in flight (``profile_cluster``; 0 if unknown).

    Public replacement: ``StreamStats.peak_in_flight``.
    """
    return int(getattr(getattr(stream, "_runner", None), "peak_in_flight", 0))


def order_quality(ids: Any, batch_size: int, strata: Any) -> Any:
    """The ``ShuffleQuality`` of an order of sample ids drawn by another loader.

    ``suite.quality_training``: torch's ``DataLoader(shuffle=True)`` scored by the
    counter a stream uses.  Public replacement: a ``ShuffleQuality`` of any id
    order (``plan.quality.QualityCounter``).
    """
    import numpy as np

    from daskzarr_batches.plan.quality import QualityCounter

    ids = np.asarray(ids)
    counter = QualityCounter(len(ids), batch_size=batch_size, strata=strata)
    counter.add(ids, np.arange(len(ids)))
    return counter.quality()
