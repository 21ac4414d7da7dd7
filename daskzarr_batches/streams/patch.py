"""Patch streams: N-D patches, forecast pairs and whole fields as samples.

:func:`patch_arguments` turns ``patch_stream``'s (and the ``Loader``'s)
patch arguments into the stream's sources, one
:class:`~daskzarr_batches.store.patches.PatchSource` per output (each array's
input patches, its forecast targets, the origins), and the *layout* that
packs a batch's outputs back into what the caller gave: an array, a tuple,
a dict of named variables, ``(x, y)`` pairs, origins last
(:class:`Layout`).  Names follow xbatcher's ``BatchGenerator``
(``input_dims``, ``input_overlap``) so users can move over.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ArgumentTypeError, ArgumentValueError, LengthMismatchError
from ..plan.epoch import EpochPlan
from ..plan.patches import Cut, PatchGrid, box_chunks, chunk_bytes, patch_origins
from ..plan.summary import PlanSummary
from ..plan.windows import Window, chunk_offsets
from ..read.patches import patch_ids
from ..store.patches import PatchSource
from ..store.sources import Source, as_source, dim_names, is_xarray
from .spec import as_array, non_negative_int, positive_int

__all__ = ["Layout", "PatchArguments", "chunk_uses", "patch_arguments", "patch_summary"]


@dataclass(frozen=True)
class Coords:
    """A layout leaf: the origins output, with the coordinate values of xarray dims.

    ``dims`` holds ``(name, axis, values)`` per patched dim with a coordinate.
    """

    index: int
    dims: tuple[tuple[str, int, np.ndarray], ...]


@dataclass(frozen=True)
class Layout:
    """How a batch's outputs (a flat tuple, one per source) are packed for the caller.

    ``template`` is a nest of tuples and dicts whose leaves are output
    numbers (or :class:`Coords`); :meth:`pack` fills it.
    """

    template: Any

    def pack(self, flat: Sequence[np.ndarray]) -> Any:
        """The batch in the caller's structure."""
        return _fill(self.template, flat)


def _fill(template: Any, flat: Sequence[np.ndarray]) -> Any:
    if isinstance(template, int):
        return flat[template]
    if isinstance(template, Coords):
        index = flat[template.index]
        found: dict[str, np.ndarray] = {"index": index}
        for name, axis, values in template.dims:
            found[name] = values[index[:, axis]]
        return found
    if isinstance(template, dict):
        return {key: _fill(value, flat) for key, value in template.items()}
    return tuple(_fill(value, flat) for value in template)


@dataclass(frozen=True)
class PatchArguments:
    """A patch stream's sources, their roles and how batches are packed."""

    sources: tuple[PatchSource, ...]
    roles: tuple[str, ...]
    layout: Layout


@dataclass
class _Array:
    """One array of the caller's data: its name, source and dim names (xarray's or Zarr's)."""

    name: str
    source: Source
    dims: tuple[str | None, ...] | None
    coords: dict[str, np.ndarray]
    xarray: bool = False  # an xarray.DataArray: origins come with its coordinates


def patch_arguments(
    data: Any,
    input_dims: Mapping[Any, int],
    *,
    input_overlap: Mapping[Any, int] | None = None,
    target_offset: Mapping[Any, int] | None = None,
    target_dims: Mapping[Any, int] | None = None,
    target_data: Any = None,
    return_origins: bool = False,
) -> PatchArguments:
    """Validate the patch arguments and build the stream's sources (see :func:`patch_stream`).

    Raises
    ------
    ArgumentTypeError, ArgumentValueError, LengthMismatchError
        An argument has the wrong type or value (the message names it).
    """
    ranges, split_axis, data = _unwrap_split(data)
    inputs, template = _arrays(data, "data")
    if not isinstance(return_origins, bool):
        raise ArgumentTypeError(f"return_origins must be True or False, got {return_origins!r}")
    sizes = _dim_map("input_dims", input_dims, inputs[0], positive_int)
    if not sizes:
        raise ArgumentValueError("input_dims must name at least one dim to cut patches along")
    overlap = _dim_map("input_overlap", input_overlap or {}, inputs[0], non_negative_int)
    offset = _dim_map("target_offset", target_offset or {}, inputs[0], _integer)
    lead = _dim_map("target_dims", target_dims or {}, inputs[0], positive_int)
    # the patched dims in the first array's axis order (the C order of the origins)
    dims = sorted(sizes, key=lambda dim: _axis(inputs[0], dim, "input_dims"))
    resolved = [_axis(inputs[0], dim, "input_dims") for dim in dims]
    if len(set(resolved)) < len(resolved):
        raise ArgumentValueError(f"input_dims names one axis twice: {dict(sizes)!r}")
    _check_patch_dims(sizes, overlap, offset, lead, target_data)
    targets: list[_Array] = []
    target_template: Any = None
    if offset:
        if target_data is None:
            targets, target_template = inputs, template
        else:
            targets, target_template = _arrays(_unwrap_split(target_data)[2], "target_data")
    every = inputs + [t for t in targets if all(t is not i for i in inputs)]
    axes = [_axes(array, dims) for array in every]
    first = every[0]
    lengths = _patched_lengths(every, axes, dims, sizes)
    origins = []
    for j, dim in enumerate(dims):
        cuts = [(0, sizes[dim])]
        if dim in offset:
            cuts.append((offset[dim], lead.get(dim, sizes[dim])))
        usable = None
        if ranges is not None and axes[0][j] == split_axis:
            usable = ranges
        stride = sizes[dim] - overlap.get(dim, 0)
        origins.append(patch_origins(lengths[j], stride, cuts, usable))
    bounds = tuple(chunk_offsets(first.source.chunks[axis]) for axis in axes[0])
    grid = PatchGrid(tuple(lengths), tuple(origins), bounds)
    if grid.n_patches == 0 and all(length > 0 for length in lengths):
        raise ArgumentValueError(
            f"no patch fits: input_dims={dict(sizes)!r}, target_offset={dict(offset)!r}, "
            f"target_dims={dict(lead)!r} over {first.name} of shape {first.source.shape}"
        )

    def cut(array: _Array, where: list[int], target: bool) -> Cut:
        size = list(array.source.shape)
        shift = [0] * len(size)
        for dim, axis in zip(dims, where, strict=True):
            size[axis] = sizes[dim]
            if target and dim in offset:
                shift[axis] = offset[dim]
                size[axis] = lead.get(dim, sizes[dim])
        return Cut(tuple(size), tuple(shift), tuple(where))

    outputs: list[tuple[_Array, Cut | None, str]] = []
    for array in inputs:
        outputs.append((array, cut(array, axes[every.index(array)], False), array.name))
    for array in targets:
        where = axes[next(i for i, a in enumerate(every) if a is array)]
        outputs.append((array, cut(array, where, True), f"{array.name} target"))
    groups: dict[int, tuple[Cut, ...]] = {}
    for array, c, _ in outputs:
        assert c is not None
        groups[id(array)] = (*groups.get(id(array), ()), c)
    sources = [
        PatchSource.of(array.source, grid, c, groups[id(array)], name) for array, c, name in outputs
    ]
    n_inputs = len(inputs)
    shifted = _renumber(target_template, n_inputs) if offset else None
    layout: Any = template if not offset else (template, shifted)
    if return_origins:
        where = axes[0]
        origin_cut = Cut(tuple(first.source.shape), (0,) * len(first.source.shape), tuple(where))
        sources.append(PatchSource.of(first.source, grid, None, (origin_cut,), "origins"))
        index = len(sources) - 1
        coords = tuple(
            (str(dim), axis, first.coords[str(dim)])
            for dim, axis in zip(dims, where, strict=True)
            if str(dim) in first.coords
        )
        leaf: Any = Coords(index, coords) if first.xarray else index
        layout = (*layout, leaf) if offset else (layout, leaf)
    return PatchArguments(tuple(sources), tuple(source.name for source in sources), Layout(layout))


def _check_patch_dims(
    sizes: dict[Any, int],
    overlap: dict[Any, int],
    offset: dict[Any, int],
    lead: dict[Any, int],
    target_data: Any,
) -> None:
    """Check that the patch dims' arguments agree with each other.

    Overlaps and offsets along patched dims only, target dims only where an
    offset shifts, each overlap below its patch size, target data with an offset.
    """
    for name, given in (("input_overlap", overlap), ("target_offset", offset)):
        extra = sorted(set(given) - set(sizes), key=str)
        if extra:
            raise ArgumentValueError(
                f"{name} names {extra!r}, which input_dims does not patch (input_dims: "
                f"{dict(sizes)!r}); a dim not in input_dims is taken whole and cannot "
                f"{'overlap' if name == 'input_overlap' else 'shift'}"
            )
    extra = sorted(set(lead) - set(offset), key=str)
    if extra:
        raise ArgumentValueError(
            f"target_dims names {extra!r} without a target_offset for them; target_dims sets "
            "the target's size along the dims target_offset shifts"
        )
    for dim, step in overlap.items():
        if step >= sizes[dim]:
            raise ArgumentValueError(
                f"input_overlap[{dim!r}]={step} must be smaller than input_dims[{dim!r}]="
                f"{sizes[dim]} (the stride is size - overlap)"
            )
    if target_data is not None and not offset:
        raise ArgumentValueError("target_data needs target_offset (the targets' lead)")


def _patched_lengths(
    every: list[_Array], axes: list[list[int]], dims: list[Any], sizes: dict[Any, int]
) -> list[int]:
    """The positions along each patched dim, which every array shares, each fitting a patch."""
    first = every[0]
    lengths = [first.source.shape[axis] for axis in axes[0]]
    for array, where in zip(every[1:], axes[1:], strict=True):
        for dim, axis, length in zip(dims, where, lengths, strict=True):
            if array.source.shape[axis] != length:
                raise LengthMismatchError(
                    f"{array.name} has {array.source.shape[axis]} positions along dim {dim!r} "
                    f"but {first.name} has {length}; every array of a patch stream shares "
                    "the patched dims"
                )
    for dim, length in zip(dims, lengths, strict=True):
        if sizes[dim] > length > 0:
            raise ArgumentValueError(
                f"input_dims[{dim!r}]={sizes[dim]} is larger than the {length} positions "
                f"of {first.name} along that dim: no patch fits"
            )
    return lengths


def _renumber(template: Any, by: int) -> Any:
    if isinstance(template, int):
        return template + by
    if isinstance(template, dict):
        return {key: _renumber(value, by) for key, value in template.items()}
    return tuple(_renumber(value, by) for value in template)


def _integer(name: str, value: object) -> int:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise ArgumentTypeError(f"{name} must be an integer, got {value!r}")
    return int(value)


def _unwrap_split(data: Any) -> tuple[Any, int | None, Any]:
    """A chunk-aligned split's usable ranges and axis, and its data (else ``None``)."""
    if all(hasattr(data, name) for name in ("ranges", "axis", "data", "chunks")):
        return tuple(data.ranges), int(data.axis), data.data
    return None, None, data


def _arrays(data: Any, role: str) -> tuple[list[_Array], Any]:
    """The caller's arrays and the layout template of their batches."""
    if is_xarray(data, "Dataset"):
        if not data.data_vars:
            raise ArgumentValueError(f"{role} is an xarray.Dataset without data variables")
        data = {str(name): data[name] for name in data.data_vars}
    if isinstance(data, Mapping):
        if not data:
            raise ArgumentValueError(f"{role} is an empty dict")
        names = list(data)
        if not all(isinstance(name, str) for name in names):
            raise ArgumentTypeError(f"the names of {role} must be strings, got {names!r}")
        arrays = [_array(str(name), value) for name, value in data.items()]
        return arrays, {name: i for i, name in enumerate(names)}
    if isinstance(data, tuple | list):
        if not data:
            raise ArgumentValueError(f"{role} is empty")
        arrays = [_array(f"{role}[{i}]", value) for i, value in enumerate(data)]
        return arrays, tuple(range(len(arrays)))
    return [_array(role, data)], 0


def _array(name: str, value: Any) -> _Array:
    coords = None
    labelled = is_xarray(value, "DataArray")
    if labelled:
        coords = {
            str(dim): np.asarray(value[dim].values) for dim in value.dims if dim in value.coords
        }
    value = as_array(value)
    dims = dim_names(value)  # xarray's dims, or a Zarr array's own dimension names
    source = as_source(value, name)
    stored = source.read_collection()  # itself, or the collection a subset is cut from
    if stored is not None:
        raise ArgumentTypeError(
            f"{name} is a collection ({stored.name}); patch streams take one array per "
            "input: a patch would span two members at their border, so collections are "
            "refused here. Stream each member with its own patch_stream, or concatenate "
            "the members along the patched dims into one array first"
        )
    return _Array(name, source, dims, coords or {}, labelled)


def _dim_map(name: str, given: Any, array: _Array, check: Any) -> dict[Any, int]:
    """``given`` as ``{dim: value}``, each dim known to ``array`` and each value checked."""
    if not isinstance(given, Mapping):
        raise ArgumentTypeError(f"{name} must be a dict of dim -> int, got {given!r}")
    out: dict[Any, int] = {}
    for dim, value in given.items():
        _axis(array, dim, name)
        out[dim] = check(f"{name}[{dim!r}]", value)
    return out


def _axis(array: _Array, dim: Any, name: str) -> int:
    """The axis of ``dim`` (an axis number, or a dim name: xarray's or Zarr's) in ``array``."""
    ndim = len(array.source.shape)
    if isinstance(dim, str):
        if array.dims is None or dim not in array.dims:
            known = (
                "it has no named dims (an xarray.DataArray's dims and a Zarr array's "
                "dimension_names name them; else pass an axis number)"
                if array.dims is None
                else f"its dims are {array.dims}"
            )
            raise ArgumentValueError(
                f"{name} names dim {dim!r}, not a dim of {array.name}: {known}"
            )
        return array.dims.index(dim)
    if isinstance(dim, numbers.Integral) and not isinstance(dim, bool):
        if not -ndim <= int(dim) < ndim:
            raise ArgumentValueError(
                f"{name} names axis {dim}, but {array.name} has {ndim} axes "
                f"(shape {array.source.shape})"
            )
        return int(dim) % ndim
    raise ArgumentTypeError(f"{name} keys must be dim names or axis numbers, got {dim!r}")


def _axes(array: _Array, dims: Sequence[Any]) -> list[int]:
    """The axis of each patched dim in ``array`` (names resolved per array)."""
    return [_axis(array, dim, "input_dims") for dim in dims]


def _window_blocks(
    source: Source, pieces: Sequence[Any], size: int
) -> dict[tuple[int, ...], tuple[slice, ...]]:
    """The stored chunks of ``source``'s base array a window's boxes overlap (in order)."""
    base = source.patched
    ids, groups, _ = patch_ids(pieces, size, False)
    boxes = source.patch_boxes(ids, groups)
    assert boxes is not None and base is not None
    bounds = [chunk_offsets(sizes) for sizes in base.chunks]
    return box_chunks(boxes, bounds)[0]


def chunk_uses(
    sources: Sequence[Source], windows: Iterable[Window]
) -> dict[int, dict[tuple[int, ...], int]]:
    """How many of ``windows`` need each stored chunk, per base array (``id``).

    What a shuffled patch stream's ``ChunkShare`` counts claims against, so
    that a chunk two windows need (a forecast target at ``t + 1`` and the
    window whose input it is) is decoded once and released at its last use.
    """
    uses: dict[int, dict[tuple[int, ...], int]] = {}
    for window in windows:
        seen: set[int] = set()
        for source, pieces in zip(sources, window.pieces, strict=True):
            base = source.patched
            if source.patch_cut is None or base is None:  # not patches, or the origins
                continue
            if id(base) in seen:
                continue
            seen.add(id(base))
            counts = uses.setdefault(id(base), {})
            for block in _window_blocks(source, pieces, window.size):
                counts[block] = counts.get(block, 0) + 1
    return uses


def _shared_decodes(
    found: tuple[tuple[tuple[int, ...], int], ...],
    base: int,
    uses: dict[tuple[int, tuple[int, ...]], int],
    held: dict[tuple[int, tuple[int, ...]], int],
    capacity: int,
) -> tuple[tuple[tuple[int, ...], int], ...]:
    """The chunks of ``found`` a shuffled window decodes, others' handed on (``ChunkShare``).

    ``uses`` counts the claims left per chunk; ``held`` (in recency order)
    the chunks handed on and their bytes, at most ``capacity`` bytes of them.
    """
    decoded = []
    for block, nbytes in found:
        key = (base, block)
        uses[key] = uses.get(key, 1) - 1
        if key in held:
            held[key] = held.pop(key)  # most recent
            if uses[key] <= 0:
                del held[key]
            continue
        decoded.append((block, nbytes))
        if uses[key] > 0:
            held[key] = nbytes
            while sum(held.values()) > capacity and len(held) > 1:
                del held[next(iter(held))]
    return tuple(decoded)


def patch_summary(
    sources: Sequence[Source],
    plan: EpochPlan,
    summary: PlanSummary,
    shared: bool = True,
    capacities: Mapping[int, int] | None = None,
) -> PlanSummary:
    """``summary`` of a patch stream's plan with the stored chunks its windows decode.

    The plan's own summary counts its units; here each window's boxes (as the
    read layer makes them, :meth:`PatchGrid.boxes`) give the chunks of each
    base array decoded, their bytes, and the distinct chunks of the epoch.
    ``shared``: a sequential stream read in this process hands the chunks a
    window shares with the one before on (``ChunkShare``), so they count in
    the first window only; on a cluster each window decodes its own.  A
    buffered stream's windows hand on the chunks several of them need while
    its share holds them (``capacities``: its bytes per base array, ``id``);
    an exact stream's do not (a share would exceed its memory budget).
    """
    distinct: dict[tuple[int, tuple[int, ...]], int] = {}
    handed = shared and plan.shuffle == "none"
    previous: set[tuple[int, tuple[int, ...]]] = set()
    uses: dict[tuple[int, tuple[int, ...]], int] = {}
    held: dict[tuple[int, tuple[int, ...]], int] = {}
    if shared and capacities and plan.shuffle == "buffer":
        counts = chunk_uses(sources, plan.windows())
        uses = {(base, block): n for base, per in counts.items() for block, n in per.items()}
    rows = []
    for window, row in zip(plan.windows(), summary.windows, strict=True):
        chunks: list[tuple[int, ...]] = []
        decoded = 0
        seen: set[int] = set()
        now: set[tuple[int, tuple[int, ...]]] = set()
        for source, pieces in zip(sources, window.pieces, strict=True):
            assert source.patch_grid is not None  # every source a patch stream's output
            base = source.patched
            if source.patch_cut is None or base is None or id(base) in seen:
                chunks.append(())
                continue
            seen.add(id(base))
            ids, groups, _ = patch_ids(pieces, window.size, False)
            boxes = source.patch_boxes(ids, groups)
            assert boxes is not None
            bounds = [chunk_offsets(sizes) for sizes in base.chunks]
            spans, _ = box_chunks(boxes, bounds)
            found = chunk_bytes(spans, bounds, base.dtype.itemsize)
            current = {(id(base), block) for block, _ in found}
            if handed:
                found = tuple(item for item in found if (id(base), item[0]) not in previous)
            elif uses and id(base) in (capacities or {}):
                capacity = (capacities or {})[id(base)]
                found = _shared_decodes(found, id(base), uses, held, capacity)
            grid_shape = tuple(len(sizes) for sizes in base.chunks)
            chunks.append(tuple(int(np.ravel_multi_index(b, grid_shape)) for b, _ in found))
            for block, nbytes in found:
                decoded += nbytes
                distinct[(id(base), block)] = nbytes
            now |= current
        previous = now
        rows.append(dataclasses.replace(row, chunks=tuple(chunks), bytes_decoded=decoded))
    return dataclasses.replace(summary, windows=tuple(rows), bytes_distinct=sum(distinct.values()))
