"""Patch sources: one output of a patch stream (an array cut at every patch origin) as a source.

A :class:`PatchSource` looks to the plan and the streams like any other
source: its samples are patches (``n_samples`` is the grid's patch count),
one sample is one patch (``row_bytes``), and its axis-0 "chunks" are the
grid's units, so :class:`~daskzarr_batches.plan.epoch.EpochPlan` plans patch
streams with the same three orders, ranks and resume as rows.  What it reads
is its ``base`` array (a :class:`~daskzarr_batches.store.sources.Source`):
the read layer groups the patch sources of a stream that share a base array
(``group``), so each stored chunk of that array is decoded once per window
for all of them (an input and its forecast target, say).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from ..plan.patches import Cut, PatchGrid
from ..plan.windows import IndexArray
from .sources import Source

__all__ = ["PatchSource"]


@dataclass(frozen=True)
class PatchSource(Source):
    """One output of a patch stream: ``base`` cut by ``cut`` at every origin of ``grid``.

    Attributes
    ----------
    base : Source
        The array read (a Zarr, numpy or dask array's source).
    grid : PatchGrid
        The patch origins, shared by every output of the stream.
    cut : Cut or None
        The cut of this output; ``None``: the output is the patches' origins
        (``return_origins``), an ``(n, ndim)`` int64 array, read from no array.
    group : tuple of Cut
        Every cut read from ``base`` in the same task (this one among them).
    """

    base: Source | None = field(default=None, repr=False)
    grid: PatchGrid | None = field(default=None, repr=False)
    cut: Cut | None = None
    group: tuple[Cut, ...] = ()

    @property
    def patched(self) -> Source | None:
        """``base``, the array the patches are cut from (``None``: the origins)."""
        return self.base

    @property
    def patch_grid(self) -> PatchGrid | None:
        """``grid``: the patches' origins."""
        return self.grid

    @property
    def patch_cut(self) -> Cut | None:
        """``cut`` (``None``: the origins)."""
        return self.cut

    def patch_boxes(self, ids: IndexArray, counts: Sequence[int]) -> list[tuple[slice, ...]] | None:
        """The boxes of ``base`` the patches' cuts of ``group`` span (``None``: the origins)."""
        if self.cut is None or self.base is None or self.grid is None:
            return None
        return self.grid.boxes(ids, counts, self.group) if len(ids) else []

    @classmethod
    def of(
        cls, base: Source, grid: PatchGrid, cut: Cut | None, group: tuple[Cut, ...], name: str
    ) -> PatchSource:
        """The patch source of ``cut`` of ``base`` (``None``: the origins)."""
        shape: tuple[int, ...]
        if cut is None:  # an origin per axis of the array cut (read_origins), patched or not
            axes = len(group[0].size) if group else len(grid.shape)
            shape, dtype = (grid.n_patches, axes), np.dtype(np.int64)
        else:
            shape, dtype = (grid.n_patches, *cut.size), base.dtype
        chunks = (grid.unit_sizes, *((n,) for n in shape[1:]))
        return cls(name, shape, dtype, chunks, base, grid, cut, group)

    def parts(self) -> tuple[Source, ...]:
        """The base array (none for the origins' source without one)."""
        return () if self.base is None else (self.base,)

    def with_parts(self, parts: tuple[Source, ...]) -> Source:
        """This output cut from ``parts[0]``."""
        (base,) = parts
        return replace(self, base=base)

    def sized(self, unit_patches: int) -> PatchSource:
        """The same source with the grid's units at most ``unit_patches`` patches."""
        assert self.grid is not None
        grid = self.grid.sized(unit_patches)
        if grid is self.grid:
            return self
        return replace(self, grid=grid, chunks=(grid.unit_sizes, *self.chunks[1:]))
