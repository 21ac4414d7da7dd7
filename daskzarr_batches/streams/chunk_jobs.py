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

__all__ = ["TREE_BATCH", "TREE_LEAF", "LeafFailure", "PairwiseFold", "fused", "reduce_on_cluster"]

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

    def push(self, value: R, count: int = 1) -> None:
        """Push ``value`` covering ``count`` items (a complete subtree of them, aligned: a
        power of two pushed where the items so far are a multiple of it)."""
        stack = self._stack
        stack.append((count, value))
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


#: chunks one leaf task reads and combines (a complete, aligned subtree of the fold; a
#: power of two): fewer tasks for the scheduler, the tree's shape unchanged
TREE_LEAF = 4


class _Deferred:
    """A read task carried as data into a leaf task, run there (so a failure is named)."""

    __slots__ = ("task",)

    def __init__(self, task: tuple[Any, ...]) -> None:
        self.task = task

    def __call__(self) -> Any:
        function, *args = self.task
        return function(*args)


class LeafFailure(Exception):
    """A chunk's read or ``func`` failed inside a leaf task of several chunks (internal:
    the caller names ``block`` and raises ``error`` as a chunk stream would)."""

    def __init__(self, block: tuple[int, ...], error: BaseException) -> None:
        super().__init__(block, error)
        self.block, self.error = block, error


def tree_subtree(
    combine: Callable[[Any, Any], Any],
    transform: Callable[[Any], Any],
    blocks: tuple[tuple[int, ...], ...],
    reads: tuple[_Deferred, ...],
) -> tuple[Any, Notes]:
    """A leaf task of ``len(blocks)`` chunks (a power of two): each read and transformed,
    then combined pairwise level by level, the fold's complete subtree (task function)."""
    parts = []
    for block, read in zip(blocks, reads, strict=True):
        try:
            value, report = apply_transform(transform, read())
        except Exception as exc:
            raise LeafFailure(block, exc) from exc
        parts.append((value, _notes(block, report)))
    while len(parts) > 1:
        parts = [tree_node(combine, parts[i], parts[i + 1]) for i in range(0, len(parts), 2)]
    return parts[0]


def _literal(task: Any) -> bool:
    """Whether a read task's arguments are plain values (no keys, futures or tasks)."""
    if not (isinstance(task, tuple) and task and callable(task[0])):
        return False
    for arg in task[1:]:
        if isinstance(arg, (str, list)) or (isinstance(arg, tuple) and arg and callable(arg[0])):
            return False
        if type(arg).__name__ == "Future":
            return False
    return True


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
        self.pending: dict[Hashable, list[tuple[tuple[int, ...], Any]]] = {}  # not yet sent
        self.per_leaf: int | None = None  # chunks a leaf task reads: decided at the first
        self.subtrees: set[Any] = set()  # keys of leaf tasks of several chunks
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
            if self.per_leaf is None:  # reads as plain calls: several chunks a leaf task
                self.per_leaf = TREE_LEAF if not graph and _literal(read) else 1
            dsk.update(graph)
            group = self.group(block)
            waiting = self.pending.setdefault(group, [])
            waiting.append((block, read))
            if len(waiting) == self.per_leaf:
                leaves.append(self.leaf(group, waiting, transform))
                waiting.clear()
        if last:  # the tails: a leaf task a chunk (the fold's shape is the same)
            for group, waiting in self.pending.items():
                for one in waiting:
                    leaves.append(self.leaf(group, [one], transform))
            self.pending.clear()
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

    def leaf(
        self, group: Hashable, reads: list[tuple[tuple[int, ...], Any]], transform: Any
    ) -> tuple[Any, tuple[int, ...]]:
        """A leaf task of ``reads`` (one chunk, or a complete subtree), pushed to its fold."""
        block = reads[0][0]
        key = (f"dzb-leaf-{self.token}", *block)
        if len(reads) == 1:
            self.dsk[key] = (tree_leaf, block, (apply_transform, transform, reads[0][1]))
        else:
            blocks = tuple(b for b, _ in reads)
            deferred = tuple(_Deferred(r) for _, r in reads)
            self.dsk[key] = (tree_subtree, self.combine, transform, blocks, deferred)
            self.subtrees.add(key)
        fold = self.folds.get(group)
        if fold is None:
            fold = self.folds[group] = PairwiseFold(self.node)
        fold.push(key, len(reads))
        return key, block

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
                            self.failed(future, block)
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

    def failed(self, future: Any, block: tuple[int, ...]) -> None:
        """Raise what a failed leaf task raised, naming its chunk as a chunk stream does."""
        stream = self.stream
        error = future.exception() if future.status == "error" else None
        if isinstance(error, LeafFailure):
            inner = error.error
            stream._wait(_Raising(inner), lambda b=error.block: stream._where(b))
        if error is not None and future.key in self.subtrees:
            raise error  # combine raised inside a leaf task: as on the caller, unwrapped
        stream._wait(future, lambda: stream._where(block))

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


class _Raising:
    """A done future whose result raises ``error`` (for ``Stream._wait``'s naming)."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def result(self, timeout: float | None = None) -> Any:
        raise self.error

    def done(self) -> bool:
        return True
