"""Per-chunk reductions on a cluster: fused leaf tasks, combined on the workers in the tree.

``reduce_chunks`` and ``feature_moments`` on a ``distributed`` client do not bring
every chunk's result to the caller.  Each stored chunk is one task (its read and
``func`` fused), and the partial results are combined *on the workers* by
``combine`` tasks laid out in exactly the tree :class:`PairwiseFold` makes on the
caller (the fold runs here on task keys instead of values), so the result is
bit-for-bit the one the caller-side fold gives, on every scheduler.  Only each
group's final value travels to the caller.

The leaves are sent ``TREE_BATCH`` per graph (one ``client.get``), the next batch as
soon as fewer than one batch of leaves is in flight; a partial left on the fold's
stack by one batch is referred to by the next through its future.  The caller
watches the leaves (never fetching their values): the first that fails is named
like a chunk stream names it, a ``timeout`` counts between leaves finishing.
"""

from __future__ import annotations

import itertools
import queue
from collections.abc import Callable, Hashable, Iterable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ..errors import WindowTimeoutError
from ..execute.runners import untokenized
from ..read.blocks import block_graph
from ..read.context import ReadContext
from ..read.kept import read_kept_chunk
from ..read.tasks import apply_transform
from ..store.policy import ReadReport

if TYPE_CHECKING:
    from .chunk import ChunkStream

__all__ = ["TREE_BATCH", "PairwiseFold", "fused", "reduce_on_cluster"]

R = TypeVar("R")

#: leaves sent to the scheduler in one graph
TREE_BATCH = 128


class PairwiseFold(Generic[R]):
    """Combine a sequence pairwise, like a binary counter: O(log n) partials.

    The shape of the tree depends only on the number of values pushed: two
    partials covering the same number of values are combined as soon as both
    exist; :meth:`result` then folds what is left from the right.
    """

    def __init__(self, combine: Callable[[R, R], R]) -> None:
        self._combine = combine
        self._stack: list[tuple[int, R]] = []  # (items covered, partial), left to right

    @property
    def empty(self) -> bool:
        return not self._stack

    @property
    def partials(self) -> list[R]:
        """The partials held now, left to right."""
        return [value for _, value in self._stack]

    def push(self, value: R) -> None:
        stack = self._stack
        stack.append((1, value))
        while len(stack) >= 2 and stack[-2][0] == stack[-1][0]:
            (count, right), (_, left) = stack.pop(), stack.pop()
            stack.append((2 * count, self._combine(left, right)))

    def result(self) -> R:
        partials = [value for _, value in self._stack]
        value = partials.pop()
        while partials:
            value = self._combine(partials.pop(), value)
        return value


Notes = tuple[tuple[tuple[int, ...], ReadReport], ...]


def _notes(block: tuple[int, ...], report: ReadReport) -> Notes:
    """What the caller must still see of a leaf's report: missing keys, retries, the cache."""
    if report.missing_keys or report.retries or report.cache is not None:
        return ((block, report),)
    return ()


def tree_leaf(block: tuple[int, ...], read: tuple[Any, ReadReport]) -> tuple[Any, Notes]:
    """A leaf of the tree: ``func``'s value and the notes of its read (task function)."""
    value, report = read
    return value, _notes(block, report)


def tree_node(
    combine: Callable[[Any, Any], Any], left: tuple[Any, Notes], right: tuple[Any, Notes]
) -> tuple[Any, Notes]:
    """``combine(left, right)`` of two partials, their notes joined (task function)."""
    return combine(left[0], right[0]), left[1] + right[1]


def reduce_on_cluster(
    stream: ChunkStream,
    combine: Callable[[Any, Any], Any],
    group: Callable[[tuple[int, ...]], Hashable] = lambda block: (),
) -> dict[Hashable, Any] | None:
    """Each group's ``combine`` tree of the stream's transformed chunks, run on its cluster.

    ``group(block)``: the fold a block's result joins (blocks of one group in C
    order).  Returns ``{group: value}`` (empty without chunks); ``None`` when
    the stream cannot be reduced this way (local threads, a sharded array read
    a shard per task, or ``on_error="skip"``, whose skipped chunks change the
    tree): the caller then folds the stream's items itself.
    """
    runner = stream._runner
    client = getattr(runner, "client", None)
    policy = stream.policy
    if client is None or policy.on_error == "skip" or stream._transform is None:
        return None
    (source,) = stream._place([stream.source])
    cache = policy.cache
    kept = None if cache is None else runner.keeper(cache, read_kept_chunk, policy)
    if stream._sharded and not (kept is not None and kept.keeps(source)):
        return None
    return _Tree(stream, source, combine, group, ReadContext(policy, runner.scope, kept=kept))()


class _Tree:
    """One cluster reduction: the symbolic folds, the futures it holds, the leaves watched."""

    def __init__(
        self,
        stream: ChunkStream,
        source: Any,
        combine: Callable[[Any, Any], Any],
        group: Callable[[tuple[int, ...]], Hashable],
        ctx: ReadContext,
    ) -> None:
        self.stream, self.source, self.combine, self.group, self.ctx = (
            stream, source, combine, group, ctx
        )  # fmt: skip
        self.client = stream._runner.client  # type: ignore[attr-defined]
        self.token = stream._token
        self.folds: dict[Hashable, PairwiseFold[Any]] = {}
        self.held: dict[Any, Any] = {}  # partial key -> its future (from an earlier batch)
        self.leaves: dict[Any, tuple[int, ...]] = {}  # leaf future -> its block, in flight
        self.roots: dict[Hashable, Any] = {}
        self.numbers = itertools.count()
        self.dsk: dict[Any, Any] = {}
        self.finished: queue.Queue[Any] = queue.Queue()  # leaves done, as they finish

    def node(self, left: Any, right: Any) -> Any:
        key = f"dzb-combine-{self.token}-{next(self.numbers)}"
        held = self.held
        self.dsk[key] = (
            tree_node, self.combine, held.get(left, left), held.get(right, right)
        )  # fmt: skip
        return key

    def send(self, blocks: list[tuple[int, ...]], first: int, last: bool) -> None:
        """One graph: the leaves of ``blocks`` and the combines they complete (with ``last``,
        the folds' results too); the futures of its leaves and new partials kept."""
        self.dsk = dsk = {}
        transform = self.stream._task_transform
        leaves = []
        for number, block in enumerate(blocks, first):
            here = self.ctx.narrowed(priority=-number)
            graph, key = block_graph(self.source, block, self.token, None, here)
            read = graph.pop(key)
            dsk.update(graph)
            leaf = (f"dzb-leaf-{self.token}", *block)
            dsk[leaf] = (tree_leaf, block, (apply_transform, transform, read))
            leaves.append((leaf, block))
            fold = self.folds.get(group := self.group(block))
            if fold is None:
                fold = self.folds[group] = PairwiseFold(self.node)
            fold.push(leaf)
        roots = {g: fold.result() for g, fold in self.folds.items()} if last else {}
        # what later batches (or the caller) need: the folds' partials, or their results
        keep = set(roots.values()) if last else {k for f in self.folds.values() for k in f.partials}
        made = [k for k in dict.fromkeys([*(k for k, _ in leaves), *keep]) if k in dsk]
        sent = self.client.get(untokenized(dsk), made, sync=False, priority=-first)
        futures = dict(zip(made, sent, strict=True))
        for key, block in leaves:
            future = futures[key]
            self.leaves[future] = block
            future.add_done_callback(self.finished.put)
        for key in [k for k in self.held if k not in keep]:
            future = self.held.pop(key)  # the graph just sent holds it while it needs it
            if future not in self.leaves:  # a leaf still watched: released once it is done
                future.release()
        self.held.update((k, futures[k]) for k in keep if k in futures)
        if last:
            self.roots = {g: self.held[k] for g, k in roots.items()}

    def __call__(self) -> dict[Hashable, Any]:
        stream = self.stream
        blocks = stream._blocks
        sent = 0
        try:
            while True:
                if sent < len(blocks) and len(self.leaves) < TREE_BATCH:
                    batch = blocks[sent : sent + TREE_BATCH]
                    self.send(batch, sent, last=sent + len(batch) == len(blocks))
                    sent += len(batch)
                    continue
                if not self.leaves:
                    break
                try:
                    done = [self.finished.get(timeout=stream._timeout)]
                except queue.Empty:
                    oldest = stream._where(next(iter(self.leaves.values())))
                    raise WindowTimeoutError(
                        f"{oldest} was not ready after timeout={stream._timeout} s (nor any of "
                        f"the {len(self.leaves)} chunks in flight){stream._runner.timeout_note}"
                    ) from None
                for future in done:
                    block = self.leaves.pop(future)
                    try:
                        if future.status != "finished":  # raises, naming the chunk
                            stream._wait(future, lambda b=block: stream._where(b))
                    finally:
                        if not any(future is kept for kept in self.held.values()):
                            future.release()  # (a fold of one chunk: the leaf its result)
            values = self.client.gather(list(self.roots.values()))
            results: dict[Hashable, Any] = {}
            for group, (value, notes) in zip(self.roots, values, strict=True):
                results[group] = value
                self.note(notes)
            self.count(blocks)
            return results
        finally:
            for future in [*self.leaves, *self.held.values()]:
                future.release()
            self.leaves.clear()
            self.held.clear()
            self.roots = {}

    def note(self, notes: Notes) -> None:
        for block, report in notes:
            chunks = [block] if report.missing_chunks else ()
            self.stream._note(self.stream.source.name, report, chunks)

    def count(self, blocks: Iterable[tuple[int, ...]]) -> None:
        """The stream's stats as if its items had been handed out."""
        stream = self.stream
        stats, source = stream.stats, stream.source
        for block in blocks:
            sizes = source.block_sizes(block)
            stats.windows_read += 1
            stats.chunks_read += 1
            stats.bytes_read += _prod(sizes) * source.dtype.itemsize
            stats.items_yielded += 1
            stats.samples_yielded += sizes[0]


def _prod(sizes: Iterable[int]) -> int:
    total = 1
    for size in sizes:
        total *= size
    return total


def fused(dsk: dict[Any, Any], key: Any) -> dict[Any, Any]:
    """``dsk`` with ``key``'s task absorbing every task only it uses (transitively).

    A write unit's graph (a window's read tasks, their join, the write) becomes
    one task, as dask fuses a ``map_blocks(...).to_zarr`` chunk: one task for
    the scheduler to place and one result to report.  A task used by two others
    (a dask source's shared blocks) stays its own.  Legacy graphs only (tuples
    whose first item is callable; lists evaluated item by item).
    """
    uses: dict[Any, int] = {}

    def count(task: Any) -> None:
        if _is_key(task, dsk):
            uses[task] = uses.get(task, 0) + 1
        elif isinstance(task, tuple) and task and callable(task[0]):
            for arg in task[1:]:
                count(arg)
        elif isinstance(task, list):
            for arg in task:
                count(arg)

    for task in dsk.values():
        count(task)
    absorbed: set[Any] = set()

    def inline(task: Any) -> Any:
        if _is_key(task, dsk):
            if task == key or uses.get(task, 0) != 1:
                return task
            absorbed.add(task)
            return inline(dsk[task])
        if isinstance(task, tuple) and task and callable(task[0]):
            return (task[0], *(inline(arg) for arg in task[1:]))
        if isinstance(task, list):
            return [inline(arg) for arg in task]
        return task

    top = inline(dsk[key])
    graph = {k: v for k, v in dsk.items() if k not in absorbed}
    graph[key] = top
    return graph


def _is_key(value: Any, dsk: dict[Any, Any]) -> bool:
    if not (isinstance(value, str) or (isinstance(value, tuple) and value and isinstance(
            value[0], str))):  # fmt: skip
        return False
    try:
        return value in dsk
    except TypeError:  # a tuple holding something unhashable: a value, not a key
        return False
