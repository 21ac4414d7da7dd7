"""One read context: everything a stream's reads share, built once per stream.

A :class:`ReadContext` carries the read policy, the cancellation scope, the
plan order, the buffer pool, the allocator of the outputs its reads' chunk
requests point at (:meth:`ReadContext.allocate`: numpy, pinned host memory,
a device array module), the cache on a cluster (its kept chunks) and the
decode limit, frozen, so that graph builders and task functions take it
whole instead of threading each through every layer.  Graph builders narrow
it (:meth:`ReadContext.narrowed`: one array's decode share, one window's
priority) and hand tasks :meth:`ReadContext.for_tasks`, the part a worker
uses (no kept futures, no chunk shares).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ..store.policy import DEFAULT_POLICY, CancelScope, ReadPolicy

if TYPE_CHECKING:
    from ..plan.windows import ChunkPiece
    from ..store.sources import SliceSource
    from .buffers import BufferPool

__all__ = ["DEFAULT_CONTEXT", "Allocator", "Kept", "ReadContext"]


class Allocator(Protocol):
    """Makes the output a read's chunk requests point at (``ChunkRequest.out``).

    Called with the output's shape and dtype; returns an uninitialised array
    of them that a chunk reader fills (``out[where] = chunk[selection]``):
    numpy's (the default), one in pinned host memory, or a device array
    module's for a reader that decodes on the device.  Picklable where the
    stream reads on a cluster (each task allocates in its worker).
    """

    def __call__(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
        """An uninitialised array of ``shape`` and ``dtype``."""


class Kept(Protocol):
    """The chunks a cache keeps on a cluster (``execute.runners.Keeper``).

    Each call returns the cluster future and whether it was made now (a
    miss), or ``None``: not kept, read it.
    """

    def __call__(
        self, source: SliceSource, piece: ChunkPiece, priority: int
    ) -> tuple[Any, bool] | None:
        """The whole axis-0 chunk of ``piece`` (every row, every column)."""

    def block(
        self, source: SliceSource, block: tuple[int, ...], priority: int, read: Callable[..., Any]
    ) -> tuple[Any, bool, tuple[slice, ...]] | None:
        """The kept part holding stored ``block``, and the region of the array it holds."""


@dataclasses.dataclass(frozen=True)
class ReadContext:
    """What every read of one stream shares (frozen; built once per stream).

    Parameters
    ----------
    policy : ReadPolicy
        Missing chunks, errors, retries and the cache.
    scope : CancelScope, optional
        The stream's cancellation scope (reads on Zarr's loop run through it).
    plan_order : bool
        Write each chunk's rows at their place in the window's plan order
        (results that travel to another process) instead of ascending order.
    decode_bytes : int, optional
        The exact shuffle's decode limit (a graph builder narrows it to one
        array's share).
    pool : BufferPool, optional
        Where local reads take their outputs from.
    shares : mapping, optional
        A patch stream's ``ChunkShare`` per base array (``id``); graph
        builders only.
    kept : Kept, optional
        A cache on a cluster; graph builders only.
    priority : int
        The priority kept chunks are made at (the window's or block's).
    allocator : Allocator, optional
        What the outputs of the reads' chunk requests are allocated by
        (:meth:`allocate`); ``None``: numpy, from ``pool`` where it applies.
    """

    policy: ReadPolicy = DEFAULT_POLICY
    scope: CancelScope | None = None
    plan_order: bool = False
    decode_bytes: int | None = None
    pool: BufferPool | None = None
    shares: Mapping[int, Any] | None = None
    kept: Kept | None = None
    priority: int = 0
    allocator: Allocator | None = None

    def allocate(self, shape: tuple[int, ...], dtype: Any, pooled: bool = False) -> Any:
        """An output of ``shape`` and ``dtype`` for a read's requests to point at.

        The context's :class:`Allocator` when it has one; else, with
        ``pooled`` (an output the consumer gives back) and a pool, a buffer
        from the pool; else ``numpy.empty``.
        """
        dtype = np.dtype(dtype)
        if self.allocator is not None:
            return self.allocator(tuple(shape), dtype)
        if pooled and self.pool is not None:
            return self.pool.take(tuple(shape), dtype)
        return np.empty(shape, dtype)

    def narrowed(self, **changes: Any) -> ReadContext:
        """This context with ``changes`` (``dataclasses.replace``), itself when there are none."""
        if all(getattr(self, name) == value for name, value in changes.items()):
            return self
        return dataclasses.replace(self, **changes)

    def for_tasks(self) -> ReadContext:
        """The part a task uses: without the graph builder's kept chunks and chunk shares."""
        if self.kept is None and self.shares is None and self.priority == 0:
            return self
        return dataclasses.replace(self, shares=None, kept=None, priority=0)

    def kept_chunk(self, source: SliceSource, piece: ChunkPiece) -> tuple[Any, bool] | None:
        """The kept future of ``piece``'s chunk at this context's priority (``None``: not kept)."""
        return None if self.kept is None else self.kept(source, piece, self.priority)

    def with_cache_tokens(self, tokens: tuple[tuple[str, str], ...]) -> ReadContext:
        """This context with the cache tokens ``tokens`` (looked up at compute time)."""
        if self.policy.cache is None or self.policy.cache_tokens == tokens:
            return self
        policy = dataclasses.replace(self.policy, cache_tokens=tokens)
        return dataclasses.replace(self, policy=policy)

    def uncached(self) -> ReadContext:
        """This context with its policy less the cache (a read again from the store)."""
        policy = dataclasses.replace(self.policy, cache=None, cache_tokens=())
        return dataclasses.replace(self, policy=policy)


#: The context of a read with the default policy, in ascending order, nothing shared.
DEFAULT_CONTEXT = ReadContext()
