"""Store layout: the one place that knows where a Zarr array's bytes sit in its store.

Store keys (the metadata documents' names, an array's own document, the key
of a chunk or shard through the array's chunk key encoding) and shard
geometry (axis-0 chunks per shard, the shard holding a block, a source's
blocks grouped by shard, the :class:`~daskzarr_batches.plan.shards.ShardLayout`
the plan works on).  Everything else asks here; nothing here reads the store.

The *objects* of an array are what its store holds per grid cell: its
chunks, or, when it is sharded, its shards.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable
from typing import Any

import zarr

from ..plan.shards import ShardLayout
from .zarr_adapter import encode_chunk_key

__all__ = [
    "CONSOLIDATED_METADATA",
    "METADATA_DOCUMENTS",
    "METADATA_NAMES",
    "V2_ARRAY_METADATA",
    "V2_ATTRIBUTES",
    "V2_GROUP_METADATA",
    "V3_METADATA",
    "array_prefix",
    "block_key",
    "blocks_by_shard",
    "chunk_grid",
    "chunks_per_shard",
    "is_metadata_key",
    "metadata_key",
    "object_grid",
    "object_key",
    "object_keys",
    "object_shape",
    "shard_layout",
    "shard_of",
    "storage_keys",
]

#: A node's metadata document in Zarr format 3 (array or group, its attributes inside).
V3_METADATA = "zarr.json"
#: An array's, a group's metadata document and a node's attributes in Zarr format 2.
V2_ARRAY_METADATA, V2_GROUP_METADATA, V2_ATTRIBUTES = ".zarray", ".zgroup", ".zattrs"
#: The metadata documents of one node: Zarr format 3, then format 2 (array, group, attributes).
METADATA_DOCUMENTS = (V3_METADATA, V2_ARRAY_METADATA, V2_GROUP_METADATA, V2_ATTRIBUTES)
#: The consolidated metadata of a format-2 hierarchy (at its root only).
CONSOLIDATED_METADATA = ".zmetadata"
#: Every metadata document name a store may hold beside chunks.
METADATA_NAMES = frozenset((*METADATA_DOCUMENTS, CONSOLIDATED_METADATA))
_METADATA_SUFFIXES = tuple(sorted(METADATA_NAMES))


def is_metadata_key(key: str) -> bool:
    """Whether store key ``key`` names a metadata document (else: a chunk or shard)."""
    return key.rsplit("/", 1)[-1].endswith(_METADATA_SUFFIXES)


def array_prefix(array: zarr.Array) -> str:
    """What every store key of ``array`` starts with: its path and a slash (or nothing)."""
    return f"{array.path}/" if array.path else ""


def metadata_key(array: Any) -> str | None:
    """The store key of a Zarr array's own metadata document (``None``: not a Zarr array)."""
    if not isinstance(array, zarr.Array):
        return None
    document = V3_METADATA if array.metadata.zarr_format == 3 else V2_ARRAY_METADATA
    return array_prefix(array) + document


def object_shape(array: zarr.Array) -> tuple[int, ...]:
    """The shape of one stored object: the shard shape, else the chunk shape."""
    return tuple(array.shards if array.shards is not None else array.chunks)


def object_grid(array: zarr.Array) -> tuple[int, ...]:
    """Objects (shards, else chunks) along each axis."""
    return tuple(math.ceil(n / c) for n, c in zip(array.shape, object_shape(array), strict=True))


def object_key(array: zarr.Array, coords: tuple[int, ...], relative: bool = False) -> str:
    """The store key of the object at grid ``coords`` (``relative``: without the array's path)."""
    key = encode_chunk_key(array)(coords)
    return key if relative else array_prefix(array) + key


def object_keys(array: zarr.Array) -> dict[str, tuple[int, ...]]:
    """``{key relative to the array: grid coordinates}`` of every object of the grid."""
    encode = encode_chunk_key(array)
    grid = object_grid(array)
    return {encode(coords): coords for coords in itertools.product(*(range(n) for n in grid))}


def storage_keys(array: Any, start: int, stop: int) -> list[str]:
    """Store keys holding samples ``start:stop`` of a Zarr array (chunks or shards)."""
    if not isinstance(array, zarr.Array) or stop <= start:
        return []
    grid = object_shape(array)
    counts = [-(-size // step) for size, step in zip(array.shape[1:], grid[1:], strict=True)]
    rows = range(start // grid[0], (stop - 1) // grid[0] + 1)
    prefix = array_prefix(array)
    encode = encode_chunk_key(array)
    return [
        prefix + encode((row, *rest))
        for row in rows
        for rest in itertools.product(*(range(n) for n in counts))
    ]


def chunk_grid(array: zarr.Array) -> tuple[int, ...]:
    """Chunks (inner chunks, when sharded) along each axis."""
    return tuple(-(-n // c) for n, c in zip(array.shape, array.chunks, strict=True))


def chunks_per_shard(array: zarr.Array) -> tuple[int, ...]:
    """Chunks per shard along each axis (all 1 for an unsharded array)."""
    if array.shards is None:
        return (1,) * len(array.shape)
    return tuple(
        max(shard // chunk, 1) for shard, chunk in zip(array.shards, array.chunks, strict=True)
    )


def shard_of(block: tuple[int, ...], per_shard: tuple[int, ...]) -> tuple[int, ...]:
    """Grid coordinates of the object holding chunk ``block`` (``per_shard``: chunks per shard)."""
    return tuple(b // n for b, n in zip(block, per_shard, strict=True))


def block_key(array: Any, block: tuple[int, ...]) -> list[str]:
    """The store key holding chunk ``block`` of a Zarr array: its chunk's, or its shard's."""
    if not isinstance(array, zarr.Array):
        return []
    return [object_key(array, shard_of(block, chunks_per_shard(array)))]


def blocks_by_shard(source: Any) -> list[tuple[tuple[int, ...], ...]] | None:
    """A source's stored blocks grouped by shard (``None``: not a sharded Zarr array).

    ``source`` is a :class:`~daskzarr_batches.store.sources.Source`.  Shards
    in C order, each with its non-empty inner blocks in C order; a shard's
    first block comes before the next shard's in the C order of the blocks.
    """
    array = getattr(source, "array", None)
    if not isinstance(array, zarr.Array) or array.shards is None:
        return None
    per_shard = chunks_per_shard(array)
    units: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
    for block in source.blocks():
        units.setdefault(shard_of(block, per_shard), []).append(block)
    return [tuple(blocks) for blocks in units.values()]


def shard_layout(source: Any) -> ShardLayout | None:
    """How a source's chunks are stored, for the plan (``None``: not a Zarr array).

    ``source`` is a :class:`~daskzarr_batches.store.sources.Source`; its
    ``chunks`` are dask-style (edge chunks cropped) and ``shards`` its shard
    shape (``None``: unsharded).
    """
    if not isinstance(getattr(source, "array", None), zarr.Array):
        return None
    shards: tuple[int, ...] | None = source.shards
    first = tuple(sizes[0] if sizes else 0 for sizes in source.chunks)
    keys = _per_row(source.shape, shards or first)
    if shards is None:
        return ShardLayout(1, keys, 1)
    inner = math.prod(
        max(1, shard // chunk) if chunk else 1
        for shard, chunk in zip(shards[1:], first[1:], strict=True)
    )
    return ShardLayout(max(1, shards[0] // max(first[0] or 1, 1)), keys, inner)


def _per_row(shape: Iterable[int], grid: tuple[int, ...]) -> int:
    """Stored objects per axis-0 row of ``grid``-shaped objects (1 unless split along others)."""
    return math.prod(
        -(-size // step) if step else 1
        for size, step in zip(list(shape)[1:], grid[1:], strict=True)
    )
