"""The arrays of a batch stream as its sources, checked together.

``row_source`` (an array, or the path opened, as the source of a row stream),
and the checks a :class:`StreamSpec` makes of its arrays as a whole: roles,
lengths, chunk subsets and mixtures read together, a sampler, the labels, the
``return_sources`` output.  Re-exported by ``streams.spec``, where they were
first.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import ArgumentTypeError, ArgumentValueError, LengthMismatchError
from ..plan.mix import MixOrder
from ..plan.sampling import ClassSampler
from ..store.collections import SourcesSource, sources_source
from ..store.sources import Source, as_source
from ..store.subsets import ChunkSubset
from .checks import as_array

__all__ = ["row_source"]


def _check_sampler(
    sampler: object, shuffle: str, sources: tuple[Source, ...], mix: MixOrder | None
) -> None:
    """A :class:`ClassSampler` draws the epoch: shuffled, not buffered, one label per sample."""
    if not isinstance(sampler, ClassSampler):
        raise ArgumentTypeError(f"sampler must be a ClassSampler, got {sampler!r}")
    if shuffle != "exact":
        raise ArgumentValueError(
            f"sampler={sampler!r} draws its own order: it needs shuffle=True without "
            f"shuffle_buffer_size (got shuffle={shuffle!r})"
        )
    if mix is not None:
        raise ArgumentValueError("sampler and mixtures (mix) cannot be combined")
    if sampler.n_ids != sources[0].n_samples:
        raise LengthMismatchError(
            f"sampler has {sampler.n_ids} labels for arrays of {sources[0].n_samples} samples"
        )


def _check_labels(labels: object, sources: tuple[Source, ...], roles: tuple[str, ...]) -> None:
    """``labels`` names one array of discrete labels: one value per sample."""
    if not isinstance(labels, str):
        raise ArgumentTypeError(f"labels must name an array (a str), got {labels!r}")
    if labels not in roles:
        raise ArgumentValueError(f"labels={labels!r} names none of the arrays {list(roles)!r}")
    source = sources[roles.index(labels)]
    if len(source.shape) != 1 or np.dtype(source.dtype).kind not in "biuUSO":
        raise ArgumentValueError(
            f"labels={labels!r} must be a 1-D array of discrete labels (integers, bools, "
            f"strings), got shape {source.shape} and dtype {source.dtype}"
        )


def _provenance(first: Source, role: str) -> SourcesSource:
    """The ``return_sources`` output of a stream whose first array is ``first``."""
    collection = first.read_collection()
    if collection is None:
        raise ArgumentValueError(
            f"return_sources=True needs a collection (concat or open_collection), but "
            f"{role} is {first.name}; a single array's samples come from that array"
        )
    return sources_source(first, collection)


def _joined(source: Source) -> bool:
    """Whether a window of ``source`` is read per member and joined (a collection)."""
    return source.read_collection() is not None


def _members(source: Source) -> tuple[int, ...]:
    """A collection's member offsets (for the source entropy); empty for one array."""
    return source.member_offsets()


def _sized(source: Source, rows: int) -> Source:
    return source.sized(rows)


def row_source(array: object, role: str) -> Source:
    """``array`` (a path opened) as the source of a row stream: samples along axis 0.

    A chunk subset split along another axis is refused: its rows would not
    be whole samples (such splits are for patch and chunk streams).
    """
    source = as_source(as_array(array), role)
    if source.split_axis not in (None, 0):
        raise ArgumentValueError(
            f"{role} ({source.name}) is split along axis {source.split_axis}; row streams "
            "(batch streams, plan_epoch, Loader, count_batches) take samples along axis 0, "
            "so they need a split with dim=0; a split along another axis is for chunk "
            "streams and map/reduce"
        )
    return source


def _unpaired(arrays: tuple[Any, ...]) -> tuple[Any, ...]:
    """The arrays of a stream: a chunk subset of a tuple of arrays stands for its arrays."""
    if len(arrays) == 1 and isinstance(arrays[0], ChunkSubset) and arrays[0].paired:
        subset = arrays[0]
        if isinstance(subset.data, Mapping):
            raise ArgumentTypeError(
                f"chunk subset {subset.index} is of a dict of arrays {list(subset.data)!r}; "
                "row streams take a tuple: pass its arrays' subsets, e.g. "
                f"paired_batch_stream(subset[{next(iter(subset.data))!r}], subset[...], ...), "
                "or a Loader the dict {name: subset[name]}"
            )
        return tuple(subset)
    return arrays


def _check_subsets(sources: tuple[Source, ...], roles: tuple[str, ...]) -> None:
    """Arrays read together are all chunk subsets of the same ranges, or none is."""
    subsets = [source.subset_ranges is not None for source in sources]
    if not any(subsets):
        return
    if not all(subsets):
        plain = [role for role, subset in zip(roles, subsets, strict=True) if not subset]
        raise ArgumentValueError(
            f"{', '.join(plain)} is a whole array but the other arrays are chunk subsets; "
            "split the arrays together (chunk_split of a tuple) and pass the subsets"
        )
    first = sources[0].subset_ranges
    for role, source in zip(roles[1:], sources[1:], strict=True):
        ranges = source.subset_ranges
        assert ranges is not None and first is not None
        if ranges != first:
            raise ArgumentValueError(
                f"{role} is a chunk subset of other positions than {roles[0]} "
                f"({_ranges_text(ranges)} against {_ranges_text(first)}); "
                "paired subsets must come from one split of the arrays together "
                "(chunk_split of a tuple), subset[0] and subset[1]"
            )


def _check_mixtures(sources: tuple[Source, ...], roles: tuple[str, ...]) -> None:
    """Arrays read together are all mixtures of one rule (pairs drawn together), or none is."""
    mixed = [source.mix_rule is not None for source in sources]
    if not any(mixed):
        return
    if not all(mixed):
        plain = [role for role, m in zip(roles, mixed, strict=True) if not m]
        raise ArgumentValueError(
            f"{', '.join(plain)} is not a mixture but the other arrays are; mix paired "
            "arrays together (mix of dicts or tuples) and pass its mixtures"
        )
    rules = {source.mix_rule for source in sources}
    if len(rules) > 1:
        raise ArgumentValueError(
            f"the mixtures of {', '.join(roles)} draw differently (lengths, weights, stop, "
            "samples_per_epoch or seed differ); mix paired arrays in one call "
            "(mix([{'x': x1, 'y': y1}, {'x': x2, 'y': y2}], weights))"
        )


def _ranges_text(ranges: tuple[tuple[int, int], ...]) -> str:
    shown = ", ".join(f"{a}:{b}" for a, b in ranges[:3])
    return f"[{shown}{', ...' if len(ranges) > 3 else ''}]"


def _default_roles(count: int) -> tuple[str, ...]:
    if count == 1:
        return ("array",)
    if count == 2:
        return ("features", "labels")
    return tuple(f"array {i}" for i in range(count))


def _check_lengths(sources: tuple[Source, ...], roles: tuple[str, ...]) -> None:
    lengths = [source.n_samples for source in sources]
    if len(set(lengths)) > 1:
        described = " but ".join(
            f"{role} has {n} samples (shape {source.shape})"
            for role, n, source in zip(roles, lengths, sources, strict=True)
        )
        raise LengthMismatchError(f"paired arrays must have the same length: {described}")
