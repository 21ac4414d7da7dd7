"""The task reading the inner blocks of one shard for chunk streams and a cluster cache.

One task per shard (:func:`read_shard`): each block one request (its inner
chunk) to the array's reader (``store.reader_hook``), the library's running
the shard reader (``store.shards.read_shard_blocks``: the whole shard in one
request); the blocks read one by one (``read.tasks.read_block``) when the
shard read fails or the shard reader does not read the array
(``store.shards.reads_by_shard``, the one shard decision).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import MissingChunkError, ReadCancelledError, StoreGoneError
from ..store.policy import Ledger, ReadReport, is_program_error, policy_view, program_error
from ..store.reader_hook import Planned, planned, raise_users_failure, reader_of
from ..store.readers import run_on_loop
from ..store.requests import block_requests
from ..store.shards import read_shard_blocks, reads_by_shard
from .context import DEFAULT_CONTEXT, ReadContext
from .failures import raise_failed_read
from .tasks import _block_piece, _planned_block, apply_transform, read_block

__all__ = ["ShardItem", "read_shard"]


#: One inner block of a shard read by :func:`read_shard`: its index, the block (or
#: ``transform(block)``; ``None`` if skipped), its report, and the transform's error.
ShardItem = tuple[tuple[int, ...], Any, ReadReport, BaseException | None]


def read_shard(
    array: Any,
    name: str,
    blocks: Sequence[tuple[int, ...]],
    slices: Sequence[tuple[slice, ...]],
    ctx: ReadContext = DEFAULT_CONTEXT,
    transform: Callable[[np.ndarray], Any] | None = None,
) -> list[ShardItem]:
    """Read the stored blocks of one shard with one read; one item per block, in order.

    Each block is one request (its inner chunk) to the array's reader
    (``store.reader_hook``), all in one call: the library's runs the shard
    reader (:func:`_planned_shard`: the whole shard fetched with one request,
    its inner chunks decoded concurrently, each into the array the caller
    owns), ``transform`` applied to each block here, its error returned
    beside the block so the stream names that block; a cache holding some
    of the blocks, the others read by the shard reader alone.  If the shard
    read fails, its blocks are read again one by one (:func:`_planned_block`),
    so errors name the block and ``on_error="skip"`` skips single blocks; a
    read whose retries were spent is not tried again
    (:func:`~daskzarr_batches.read.failures.raise_failed_read`).  A reader of
    the user's that fails raises :class:`~daskzarr_batches.ChunkReadError`
    naming the shard's chunks (``store.reader_hook.users_failure``).  An array
    the shard reader does not read (:func:`~daskzarr_batches.store.shards.reads_by_shard`)
    is read block by block (:func:`read_block`).
    """
    policy = ctx.policy
    if not reads_by_shard(array, policy.cache is not None):
        reads = [read_block(array, name, b, w, ctx) for b, w in zip(blocks, slices, strict=True)]
        return _shard_items(blocks, reads, transform)
    dtype = np.dtype(array.dtype)
    outs = [np.empty(tuple(s.stop - s.start for s in where), dtype) for where in slices]
    requests = [
        request
        for where, out in zip(slices, outs, strict=True)
        for request in block_requests(array, where, out)
    ]
    ledger = Ledger()
    view = policy_view(array, name, policy, ledger)
    failed: list[int] = []  # blocks whose shard read failed: each read again on its own

    def shard_run(numbers: Sequence[int]) -> Callable[[], bool]:
        def run() -> bool:
            done = _planned_shard(
                view, name, [blocks[i] for i in numbers], [slices[i] for i in numbers],
                [outs[i] for i in numbers], ctx, ledger,
            )  # fmt: skip
            if not done:
                failed.extend(numbers)
            return done

        return run

    number_of = {id(request): number for number, request in enumerate(requests)}
    plan = Planned(
        requests, shard_run(range(len(blocks))), view, lambda coro: run_on_loop(coro, ctx.scope),
        counts=ledger.cache,
        # a cache holding some of the shard's chunks: the others read by the shard reader
        narrow=(lambda some: shard_run([number_of[id(r)] for r in some]))
        if len(requests) == len(blocks) else None,
    )  # fmt: skip
    reader = reader_of(array, policy)
    try:
        with planned(plan):
            reader.read(requests)
    except (MissingChunkError, StoreGoneError, ReadCancelledError):
        raise
    except Exception as exc:  # the library's read names its own failures; a user reader's:
        if not plan.ran and is_program_error(exc):
            error = program_error(exc, f"a shard of array {name}")
            raise error from error.__cause__
        raise_users_failure(plan, reader, name, exc)
        raise
    again = {i: _planned_block(array, name, blocks[i], slices[i], ctx) for i in sorted(set(failed))}
    read = [i for i in range(len(blocks)) if i not in again]
    missing = tuple(dict.fromkeys(ledger.missing))
    reads = [
        again[number]
        if number in again
        else (
            out,
            ReadReport(
                cache=ledger.cache if number == read[0] else None,
                missing_keys=missing,
                missing_chunks=(block[0],) if missing else (),
                retries=ledger.retries if number == read[0] else 0,  # counted once per shard
            ),
        )
        for number, (block, out) in enumerate(zip(blocks, outs, strict=True))
    ]
    return _shard_items(blocks, reads, transform)


def _planned_shard(
    view: Any,
    name: str,
    blocks: Sequence[tuple[int, ...]],
    slices: Sequence[tuple[slice, ...]],
    outs: Sequence[np.ndarray],
    ctx: ReadContext,
    ledger: Ledger,
) -> bool:
    """:func:`read_shard`'s own read into ``outs``: the whole shard in one request.

    ``view``: the array's policy view (counted in ``ledger``).  ``False``:
    the read failed (not for good): the caller reads each block again.
    """
    named = [
        (f"chunk {block}", _block_piece(block, where))
        for block, where in zip(blocks, slices, strict=True)
    ]
    try:
        run_on_loop(read_shard_blocks(view, blocks, slices, outs), ctx.scope)
    except (MissingChunkError, StoreGoneError, ReadCancelledError):
        raise
    except Exception as exc:  # read again block by block, so that the error names the block
        if is_program_error(exc):
            failure = program_error(exc, f"a shard of array {name}")
            raise failure from failure.__cause__
        raise_failed_read(view, name, named, ledger)
        return False
    return True


def _shard_items(
    blocks: Sequence[tuple[int, ...]],
    reads: Sequence[tuple[Any, ReadReport]],
    transform: Callable[[np.ndarray], Any] | None,
) -> list[ShardItem]:
    """One :data:`ShardItem` per block read, ``transform`` applied (its error kept beside)."""
    items: list[ShardItem] = []
    for block, (item, report) in zip(blocks, reads, strict=True):
        error: BaseException | None = None
        if item is not None and transform is not None:
            try:
                item, _ = apply_transform(transform, (item, report))
            except Exception as exc:
                item, error = None, exc
        items.append((block, item, report, error))
    return items
