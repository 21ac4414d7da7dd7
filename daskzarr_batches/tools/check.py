"""``daskzarr-batches info --check``: read every stored object of each array, name those that fail.

Objects are read a block at a time (a rectangle of neighbouring objects, one
``array[region]`` call), and only a block whose read raises is read again
object by object, so that each object whose read raises is recorded as
*corrupt* in its :class:`~daskzarr_batches.tools.info.ArrayReport`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, as_completed, wait
from typing import TYPE_CHECKING, Any

import numpy as np
import zarr
from tqdm import tqdm

from ..store.layout import object_grid, object_key, object_shape
from ..store.policy import is_program_error, program_error

if TYPE_CHECKING:
    from .info import ArrayReport

__all__ = ["CHECK_BYTES", "CHECK_OBJECTS", "CHECK_THREADS", "check_arrays", "progress_bar"]

#: Blocks of chunks (or shards) read at once by ``--check``.
CHECK_THREADS = 4
#: Decoded bytes ``--check`` reads in one call (a block of neighbouring chunks).
CHECK_BYTES = 16 * 2**20
#: Objects ``--check`` reads in one call at most, so that tiny chunks still spread over threads.
CHECK_OBJECTS = 1024


def check_arrays(
    arrays: Sequence[tuple[str, zarr.Array]],
    reports: Sequence[ArrayReport],
    progress: Callable[..., Any] | None = None,
    threads: int = CHECK_THREADS,
    block_bytes: int = CHECK_BYTES,
) -> None:
    """Read every stored chunk (or shard) of each array; record those that raise.

    Objects are read a block at a time: the region of a rectangle of
    neighbouring objects of about ``block_bytes`` decoded bytes (at most
    ``CHECK_OBJECTS`` objects), in one ``array[region]`` call, so Zarr
    decodes them concurrently and the fixed cost of a call is paid per
    block, not per object.  Only when a block's read
    raises is each of its stored objects read alone, to name the ones that
    fail.  Absent objects inside a block read as the fill value and raise
    nothing.  ``threads`` blocks are read at once.

    Fills ``report.corrupt`` (sorted by key) and sets ``report.checked``.
    """
    jobs = []
    for (_, array), report in zip(arrays, reports, strict=True):
        absent = set(report.absent)
        for region, objects in _object_blocks(array, block_bytes):
            stored = [(key, coords) for key, coords in objects if key not in absent]
            if stored:
                jobs.append((report, array, region, stored))
        report.checked = True

    def read(array: zarr.Array, region: tuple[slice, ...]) -> str | None:
        try:
            array[region]
        except Exception as exc:
            if is_program_error(exc):  # not the store's fault: never reported as a bad chunk
                error = program_error(exc, f"{region} of array {array.path!r}")
                raise error from error.__cause__
            return _one_line(f"{type(exc).__name__}: {exc}")
        return None

    def check(
        report: ArrayReport,
        array: zarr.Array,
        region: tuple[slice, ...],
        stored: list[tuple[str, tuple[int, ...]]],
    ) -> int:
        if read(array, region) is not None:  # find the objects that fail
            for key, coords in stored:
                error = read(array, _object_region(array, coords))
                if error is not None:
                    report.corrupt.append((key, error))  # list.append is atomic
        return len(stored)

    total = sum(len(stored) for *_, stored in jobs)
    with (
        progress_bar(progress, total=total, desc="checking", unit="chunk") as bar,
        ThreadPoolExecutor(max_workers=max(1, threads)) as pool,
    ):
        # Two blocks per thread in flight: memory stays bounded, whatever the store.
        pending: set[Future[int]] = set()
        for job in jobs:
            pending.add(pool.submit(check, *job))
            if len(pending) >= 2 * threads:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    bar.update(future.result())
        for future in as_completed(pending):
            bar.update(future.result())
    for report in reports:
        report.corrupt.sort()


def _object_blocks(
    array: zarr.Array, block_bytes: int
) -> Iterator[tuple[tuple[slice, ...], list[tuple[str, tuple[int, ...]]]]]:
    """Rectangles of neighbouring objects of about ``block_bytes``: (region, [(key, coords)]).

    The rectangle spans whole trailing axes of the object grid while it fits
    (C order), so a region is contiguous in the grid and, for the common
    layout chunked along axis 0 only, a run of consecutive chunks.
    """
    grid = object_grid(array)
    outer = object_shape(array)
    object_bytes = math.prod(outer) * max(1, np.dtype(array.dtype).itemsize)
    room = max(1, min(CHECK_OBJECTS, block_bytes // max(1, object_bytes)))
    block: list[int] = []
    for size in reversed(grid):
        take = max(1, min(size, room))
        block.insert(0, take)
        room = room // take if take == size else 1
    for first in itertools.product(*(range(0, g, b) for g, b in zip(grid, block, strict=True))):
        ranges = [range(f, min(f + b, g)) for f, b, g in zip(first, block, grid, strict=True)]
        region = tuple(
            slice(r.start * o, min(r.stop * o, n))
            for r, o, n in zip(ranges, outer, array.shape, strict=True)
        )
        coords = itertools.product(*ranges)
        yield region, [(object_key(array, c, relative=True), c) for c in coords]


def _object_region(array: zarr.Array, coords: Sequence[int]) -> tuple[slice, ...]:
    outer = object_shape(array)
    return tuple(
        slice(i * c, min((i + 1) * c, n))
        for i, c, n in zip(coords, outer, array.shape, strict=True)
    )


def _one_line(text: str) -> str:
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


def progress_bar(progress: Callable[..., Any] | None, **kwargs: Any) -> Any:
    """A progress bar from ``progress``, or a disabled ``tqdm`` bar without one."""
    return tqdm(disable=True) if progress is None else progress(**kwargs)
