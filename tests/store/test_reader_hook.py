"""The reader hook's contract, across every stream kind (issue 36).

A counting wrapper passed as ``reader=`` (flat, and as ``ReadOptions(reader=...)``)
to each stream kind must see every stored chunk decoded: the chunks it is asked for
are the chunks fetched from the store (a :class:`~stores.CountingStore` beneath),
each once where the kind reads each chunk once (sequential, buffered, paired, the
per-chunk jobs), and every chunk of the array for the exact shuffle; an epoch served
from a ``ChunkCache`` asks it nothing and fetches nothing; the factory is called
once per array per stream.  Then: a reader of its own format is one class, and a
factory that returns no reader, raises, or is no callable is refused, naming it.
"""

from __future__ import annotations

import collections
import itertools
import threading
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import numcodecs
import numpy as np
import pytest
import zarr
from hypothesis import given
from stores import CountingStore
from strategies import batch_sizes, buffer_sizes, property_settings, regular_chunks, shapes

import daskzarr_batches as dzb
from daskzarr_batches.readers import ChunkReader, ChunkRequest
from daskzarr_batches.store.zarr_adapter import sync

SHAPE, CHUNKS, SHARDS = (48, 6), (8, 3), (16, 6)


class Counting:
    """Counts the chunks it is asked for, and lets the library's reader read them."""

    def __init__(self, inner: ChunkReader) -> None:
        self.inner, self.chunks = inner, []
        self.lock = threading.Lock()

    def read(self, requests: Sequence[ChunkRequest]) -> None:
        with self.lock:
            self.chunks += [r.chunk for r in requests]
        self.inner.read(requests)


#: what every :class:`Factory` made, by its name: copies sent to an in-process cluster's
#: workers record where the test reads
_MADE: dict[str, list[tuple[str, Counting]]] = {}


class Factory:
    """A reader factory that wraps each array's default in :class:`Counting`, and remembers.

    It pickles as its name, so that the copies a cluster's tasks carry (workers in this
    process) record in the same list.
    """

    def __init__(self, name: str | None = None) -> None:
        self.name = uuid.uuid4().hex if name is None else name
        self.made = _MADE.setdefault(self.name, [])
        self.lock = threading.Lock()

    def __reduce__(self) -> Any:
        return (Factory, (self.name,))

    def __call__(self, array: Any, default: ChunkReader) -> Counting:
        reader = Counting(default)
        with self.lock:
            self.made.append((str(array.store_path), reader))
        return reader

    def seen(self) -> collections.Counter[tuple[str, tuple[int, ...]]]:
        """Each (array, chunk) asked for, and how many times."""
        return collections.Counter((name, c) for name, r in self.made for c in r.chunks)

    def calls(self) -> collections.Counter[str]:
        return collections.Counter(name for name, _ in self.made)


def _array(
    kind: str = "plain",
    seed: int = 0,
    shape: tuple[int, ...] = SHAPE,
    where: Path | None = None,
    chunks: tuple[int, ...] = CHUNKS,
) -> zarr.Array:
    """An array in a store of its own: in memory, counting the chunk keys it fetches, or a
    plain directory (whose zstd chunks the library's direct reader decodes, uncounted)."""
    memory = zarr.storage.MemoryStore()
    store: Any = zarr.storage.LocalStore(where) if where else CountingStore(memory)
    chunks = chunks[: len(shape)]
    shards = SHARDS[: len(shape)] if kind == "sharded" else None
    x = zarr.create_array(store, shape=shape, chunks=chunks, shards=shards, dtype="f4")
    x[:] = np.arange(np.prod(shape), dtype="f4").reshape(shape) + 1000 * seed
    _clear(x)
    return x


def _clear(array: Any) -> None:
    """Forget what ``array``'s store has fetched so far (a counting store's)."""
    counts = getattr(getattr(array, "store", None), "counts", None)
    if counts is not None:
        counts.clear()


def _name(array: zarr.Array) -> str:
    return str(array.store_path)


def _grid(array: zarr.Array) -> set[tuple[int, ...]]:
    """Every stored chunk of ``array`` (inner chunks when sharded)."""
    counts = [-(-n // c) for n, c in zip(array.shape, array.chunks, strict=True)]
    return set(itertools.product(*map(range, counts)))


def _keys(array: zarr.Array, chunks: Iterable[tuple[int, ...]]) -> set[str]:
    """The store keys holding ``chunks`` (their shards' when sharded)."""
    per = [s // c for s, c in zip(array.shards or array.chunks, array.chunks, strict=True)]
    return {
        array.metadata.encode_chunk_key(tuple(i // n for i, n in zip(c, per, strict=True)))
        for c in chunks
    }


def _fetched(array: zarr.Array) -> set[str] | None:
    """The chunk keys fetched from ``array``'s store (``None``: a store that does not count)."""
    counts: collections.Counter[str] | None = getattr(array.store, "counts", None)
    return None if counts is None else {key for key, n in counts.items() if n}


# --------------------------------------------------------------------------
# The stream kinds: each consumes one epoch with the read keywords ``kw`` and
# returns the arrays it reads and how often each chunk must be asked for:
# "once" (read amplification 1), "all" (every chunk, maybe more than once) or
# "some" (a part of the epoch: what was fetched, nothing more).


def _take(stream: Iterable[Any]) -> list[Any]:
    with stream as s:  # type: ignore[attr-defined]
        return list(s)


def _rows(batches: Sequence[Any]) -> np.ndarray:
    return np.concatenate([np.asarray(b) for b in batches])


def _sequential(a: dict[str, Any], kw: dict[str, Any], tmp: Path) -> tuple[list[Any], str]:
    out = _rows(_take(dzb.batch_stream(a["x"], 5, **kw)))
    np.testing.assert_array_equal(out, a["x_np"])
    return [a["x"]], "once"


def _rows_chunks(a: dict[str, Any], kw: dict[str, Any], tmp: Path) -> tuple[list[Any], str]:
    out = _rows(_take(dzb.shuffled_batch_stream(a["x2"], 5, shuffle_buffer_size=16, **kw)))
    np.testing.assert_array_equal(np.sort(out, axis=0), a["x2_np"])
    return [a["x2"]], "once"


def _buffered(a: dict[str, Any], kw: dict[str, Any], tmp: Path) -> tuple[list[Any], str]:
    s = dzb.shuffled_batch_stream(a["x"], 5, shuffle_buffer_size=16, seed=1, **kw)
    out = _rows(_take(s))
    np.testing.assert_array_equal(np.sort(out, axis=0), a["x_np"])
    return [a["x"]], "once"


def _exact(a: dict[str, Any], kw: dict[str, Any], tmp: Path) -> tuple[list[Any], str]:
    s = dzb.shuffled_batch_stream(a["x"], 5, shuffle_buffer_size=None, seed=1, **kw)
    out = _rows(_take(s))
    np.testing.assert_array_equal(np.sort(out, axis=0), a["x_np"])
    return [a["x"]], "all"


def _paired(a: dict[str, Any], kw: dict[str, Any], tmp: Path) -> tuple[list[Any], str]:
    pairs = _take(dzb.paired_batch_stream(a["x"], a["y"], 5, **kw))
    np.testing.assert_array_equal(_rows([y for _, y in pairs]), a["y_np"])
    return [a["x"], a["y"]], "once"


def _paired_shuffled(a: dict[str, Any], kw: dict[str, Any], tmp: Path) -> tuple[list[Any], str]:
    s = dzb.paired_shuffled_batch_stream(a["x"], a["y"], 5, shuffle_buffer_size=16, **kw)
    pairs = _take(s)
    x, y = _rows([x for x, _ in pairs]), _rows([y for _, y in pairs])
    np.testing.assert_array_equal(x[:, 0], y)  # x's first column is y's row
    return [a["x"], a["y"]], "once"


def _patches(a: dict[str, Any], kw: dict[str, Any], tmp: Path) -> tuple[list[Any], str]:
    s = dzb.patch_stream(
        a["x"], {0: 8}, 2, target_data=a["y"], target_dims={0: 8}, target_offset={0: 8}, **kw
    )
    got = _take(s)
    x, y = _rows([x for x, _ in got]), _rows([y for _, y in got])
    np.testing.assert_array_equal(x[:, :, 0] + 8 * 6, y)  # x[:, 0] one chunk (8 rows of 6) on
    return [a["x"], a["y"]], "some"  # x's last chunk and y's first are no patch's


def _collection(a: dict[str, Any], kw: dict[str, Any], tmp: Path) -> tuple[list[Any], str]:
    out = _rows(_take(dzb.batch_stream(dzb.concat([a["x"], a["x2"]]), 5, **kw)))
    np.testing.assert_array_equal(out, np.concatenate([a["x_np"], a["x2_np"]]))
    return [a["x"], a["x2"]], "once"


def _mixture(a: dict[str, Any], kw: dict[str, Any], tmp: Path) -> tuple[list[Any], str]:
    mixed = dzb.mix([a["x"], a["x2"]], [0.5, 0.5], seed=3, stop="all_exhausted")
    out = _rows(_take(dzb.batch_stream(mixed, 5, **kw)))
    assert set(np.unique(out)) <= set(np.unique(np.concatenate([a["x_np"], a["x2_np"]])))
    return [a["x"], a["x2"]], "some"


def _subset(a: dict[str, Any], kw: dict[str, Any], tmp: Path) -> tuple[list[Any], str]:
    first, second = dzb.chunk_split(a["x"], [0.5, 0.5], seed=2)
    rows = [_rows(_take(dzb.batch_stream(part, 5, **kw))) for part in (first, second)]
    np.testing.assert_array_equal(np.sort(np.concatenate(rows), axis=0), a["x_np"])
    return [a["x"]], "once"  # the two subsets' streams: each chunk in one of them


def _sharded(a: dict[str, Any], kw: dict[str, Any], tmp: Path) -> tuple[list[Any], str]:
    out = _rows(_take(dzb.batch_stream(a["xs"], 5, **kw)))
    np.testing.assert_array_equal(out, a["xs_np"])
    return [a["xs"]], "once"


def _sharded_shuffled(a: dict[str, Any], kw: dict[str, Any], tmp: Path) -> tuple[list[Any], str]:
    s = dzb.shuffled_batch_stream(a["xs"], 5, shuffle_buffer_size=16, seed=1, **kw)
    np.testing.assert_array_equal(np.sort(_rows(_take(s)), axis=0), a["xs_np"])
    return [a["xs"]], "once"


def _blocks(array: zarr.Array, values: np.ndarray, kw: dict[str, Any]) -> None:
    """A chunk stream's blocks, each equal to its region of ``array`` (``values``)."""
    blocks = _take(dzb.chunk_stream(array, with_index=True, **kw))
    for index, block in blocks:
        where = tuple(slice(i * c, i * c + c) for i, c in zip(index, array.chunks, strict=True))
        np.testing.assert_array_equal(block, values[where])
    assert sum(np.size(block) for _, block in blocks) == values.size


def _chunks(a: dict[str, Any], kw: dict[str, Any], tmp: Path) -> tuple[list[Any], str]:
    _blocks(a["x"], a["x_np"], kw)
    return [a["x"]], "once"


def _sharded_chunks(a: dict[str, Any], kw: dict[str, Any], tmp: Path) -> tuple[list[Any], str]:
    _blocks(a["xs"], a["xs_np"], kw)
    return [a["xs"]], "once"


def _map_chunks(a: dict[str, Any], kw: dict[str, Any], tmp: Path) -> tuple[list[Any], str]:
    sums = _take(dzb.map_chunks(lambda c: float(np.sum(c)), a["x"], **kw))
    assert sum(sums) == float(np.sum(a["x_np"]))
    return [a["x"]], "once"


def _reduce(a: dict[str, Any], kw: dict[str, Any], tmp: Path) -> tuple[list[Any], str]:
    total = dzb.reduce_chunks(lambda c: float(np.sum(c)), lambda p, q: p + q, a["x"], **kw)
    assert total == float(np.sum(a["x_np"]))
    return [a["x"]], "once"


def _moments(a: dict[str, Any], kw: dict[str, Any], tmp: Path) -> tuple[list[Any], str]:
    moments = dzb.feature_moments(a["x"], **kw)
    np.testing.assert_allclose(moments.mean, np.mean(a["x_np"], axis=0), rtol=1e-5)
    return [a["x"]], "once"


def _map_to_zarr(a: dict[str, Any], kw: dict[str, Any], tmp: Path) -> tuple[list[Any], str]:
    out = dzb.map_to_zarr(lambda c: c * 2, a["x"], tmp / "mapped.zarr", overwrite=True, **kw)
    np.testing.assert_array_equal(out[:], a["x_np"] * 2)
    return [a["x"]], "all"  # chunk 0 twice: the probe of func's dtype, then its unit


def _map_to_zarr_typed(a: dict[str, Any], kw: dict[str, Any], tmp: Path) -> tuple[list[Any], str]:
    out = dzb.map_to_zarr(
        lambda c: c * 2, a["x"], tmp / "typed.zarr", dtype="f4", sample_shape=(6,),
        overwrite=True, **kw,
    )  # fmt: skip
    np.testing.assert_array_equal(out[:], a["x_np"] * 2)
    return [a["x"]], "once"


def _write_shuffled(a: dict[str, Any], kw: dict[str, Any], tmp: Path) -> tuple[list[Any], str]:
    out = dzb.write_shuffled(a["x"], tmp / "shuffled.zarr", overwrite=True, chunks=8, **kw)
    np.testing.assert_array_equal(np.sort(np.asarray(out[:]), axis=0), a["x_np"])
    return [a["x"]], "all"


def _to_dask(a: dict[str, Any], kw: dict[str, Any], tmp: Path) -> tuple[list[Any], str]:
    with dzb.batch_stream(a["x"], 5, **kw) as stream:
        out = stream.to_dask().compute()
    np.testing.assert_array_equal(np.asarray(out), a["x_np"])
    return [a["x"]], "once"


def _loader(a: dict[str, Any], kw: dict[str, Any], tmp: Path) -> tuple[list[Any], str]:
    loader = dzb.Loader(a["x"], 5, shuffle=True, shuffle_buffer_size=16, **kw)
    np.testing.assert_array_equal(np.sort(_rows(list(loader)), axis=0), a["x_np"])
    return [a["x"]], "once"


def _loader_resumed(a: dict[str, Any], kw: dict[str, Any], tmp: Path) -> tuple[list[Any], str]:
    first = dzb.Loader(a["x"], 5, **kw)
    batches = iter(first)
    head = [next(batches) for _ in range(3)]
    state = first.state_dict()
    batches.close()  # type: ignore[attr-defined]
    _clear(a["x"])  # what the resumed loader reads, below
    factory = kw["reader"] if "reader" in kw else kw["read"].reader
    del factory.made[:]
    again = dzb.Loader(a["x"], 5, **kw)
    again.load_state_dict(state)
    rest = list(again)
    np.testing.assert_array_equal(_rows(head + rest), a["x_np"])
    return [a["x"]], "some"


def _device(make: Callable[[dzb.Loader], Iterable[Any]]) -> Any:
    def kind(a: dict[str, Any], kw: dict[str, Any], tmp: Path) -> tuple[list[Any], str]:
        loader = dzb.Loader(a["x"], 5, **kw)
        out = _rows([np.asarray(b) for b in make(loader)])
        np.testing.assert_array_equal(out, a["x_np"])
        return [a["x"]], "once"

    return kind


def _cupy_feed(loader: dzb.Loader) -> Iterable[Any]:
    from daskzarr_batches.cupy import CupyLoader

    return CupyLoader(loader, xp=np)


def _torch_feed(loader: dzb.Loader) -> Iterable[Any]:
    import torch  # noqa: F401  (marks the test: deselected where torch is not installed)

    from daskzarr_batches.torch import ZarrIterableDataset

    return (b.numpy() for b in ZarrIterableDataset(loader, device="cpu"))


def _jax_feed(loader: dzb.Loader) -> Iterable[Any]:
    import jax  # noqa: F401  (marks the test: run last, deselected without jax)

    from daskzarr_batches.jax import JaxLoader

    return JaxLoader(loader)


KINDS: dict[str, Callable[[dict[str, Any], dict[str, Any], Path], tuple[list[Any], str]]] = {
    "sequential": _sequential,
    "buffered": _buffered,
    "buffered_whole_rows": _rows_chunks,
    "exact": _exact,
    "paired": _paired,
    "paired_shuffled": _paired_shuffled,
    "patches_with_targets": _patches,
    "collection": _collection,
    "mixture": _mixture,
    "chunk_subset": _subset,
    "sharded": _sharded,
    "sharded_shuffled": _sharded_shuffled,
    "chunk_stream": _chunks,
    "sharded_chunk_stream": _sharded_chunks,
    "map_chunks": _map_chunks,
    "reduce_chunks": _reduce,
    "feature_moments": _moments,
    "map_to_zarr": _map_to_zarr,
    "map_to_zarr_typed": _map_to_zarr_typed,
    "write_shuffled": _write_shuffled,
    "to_dask": _to_dask,
    "loader": _loader,
    "loader_resumed": _loader_resumed,
    "cupy_loader_numpy": _device(_cupy_feed),
}
#: the kinds that read through more than one stream (the factory is called once in each)
STREAMS = {"chunk_subset": 2}
DEVICE_KINDS = {"torch_cpu": _device(_torch_feed)}
JAX_KINDS = {"jax_loader": _device(_jax_feed)}


@pytest.fixture(params=["memory", "directory"])
def arrays(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    def at(name: str) -> Path | None:
        return None if request.param == "memory" else tmp_path / f"{name}.zarr"

    x = _array(where=at("x"))  # chunks across the trailing axis too
    x2 = _array(seed=1, where=at("x2"), chunks=(8, 6))  # whole rows: the direct decode's
    xs = _array("sharded", seed=2, where=at("xs"))
    y = _array(shape=SHAPE[:1], where=at("y"))
    y[:] = x[:, 0]  # x's first column
    made = {"x": x, "x2": x2, "xs": xs, "y": y}
    values = {f"{name}_np": np.asarray(array[:]) for name, array in made.items()}
    for array in made.values():
        _clear(array)  # what the streams fetch, from here on
    return {**made, **values}


def _keywords(how: str, factory: Factory, cache: Any = None) -> dict[str, Any]:
    if how == "flat":
        return {"reader": factory} if cache is None else {"reader": factory, "cache": cache}
    return {"read": dzb.ReadOptions(reader=factory, cache=cache)}


def _check_seen(factory: Factory, read: list[Any], mode: str, kind: str) -> None:
    """The factory's readers saw every chunk fetched, as ``mode`` says, once per array."""
    names = {_name(array) for array in read}
    streams = STREAMS.get(kind, 1)
    calls = factory.calls()
    assert set(calls) <= names, f"{kind}: a reader made for arrays not read: {calls}"
    seen = factory.seen()
    for array in read:
        name = _name(array)
        mine = {c: n for (a, c), n in seen.items() if a == name}
        assert calls[name] == streams, f"{kind}: factory called {calls[name]} times for {name}"
        assert mine, f"{kind}: the reader of {name} was asked for nothing"
        assert set(mine) <= _grid(array), f"{kind}: chunks outside the grid: {set(mine)}"
        fetched = _fetched(array)
        assert fetched is None or _keys(array, mine) == fetched, (
            f"{kind}: {name}: the store gave {sorted(fetched or ())}, the reader was asked "
            f"for {sorted(mine)}"
        )
        if mode in ("once", "all"):
            assert set(mine) == _grid(array), f"{kind}: {name}: not every chunk: {sorted(mine)}"
        if mode == "once":
            twice = {c: n for c, n in mine.items() if n != 1}
            assert not twice, f"{kind}: {name}: chunks asked for more than once: {twice}"


def _contract(
    kind: str, how: str, arrays: dict[str, Any], tmp_path: Path, kinds: dict[str, Any]
) -> None:
    factory = Factory()
    read, mode = kinds[kind](arrays, _keywords(how, factory), tmp_path)
    _check_seen(factory, read, mode, kind)


@pytest.mark.parametrize("how", ["flat", "options"])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_counting_reader_sees_every_chunk_decoded(
    kind: str, how: str, arrays: dict[str, Any], tmp_path: Path
) -> None:
    _contract(kind, how, arrays, tmp_path, KINDS)


@pytest.mark.parametrize("how", ["flat", "options"])
def test_a_counting_reader_sees_the_torch_feeds_chunks(
    how: str, arrays: dict[str, Any], tmp_path: Path
) -> None:
    import torch  # noqa: F401  (deselected where torch is not installed)

    _contract("torch_cpu", how, arrays, tmp_path, DEVICE_KINDS)


def test_a_counting_reader_sees_the_jax_feeds_chunks(
    arrays: dict[str, Any], tmp_path: Path
) -> None:
    import jax  # noqa: F401  (runs last; deselected where jax is not installed)

    _contract("jax_loader", "flat", arrays, tmp_path, JAX_KINDS)


#: the kinds run on a cluster (in-process workers: one process, the factory called once)
ON_A_CLUSTER = ["buffered", "chunk_stream", "exact", "loader", "map_chunks", "paired", "sequential"]


@pytest.mark.parametrize("kind", ON_A_CLUSTER)
def test_a_counting_reader_sees_every_chunk_decoded_on_a_cluster(
    kind: str, arrays: dict[str, Any], tmp_path: Path, client: Any
) -> None:
    factory = Factory()
    read, mode = KINDS[kind](arrays, {"reader": factory, "client": client}, tmp_path)
    _check_seen(factory, read, mode, kind)


@pytest.mark.parametrize("kind", ["buffered", "chunk_stream", "sequential"])
def test_an_epoch_from_the_cluster_cache_asks_the_reader_nothing(
    kind: str, arrays: dict[str, Any], tmp_path: Path, client: Any
) -> None:
    cache = dzb.ChunkCache("64MiB")  # its cluster tier: chunks kept as the cluster's futures
    first, second = Factory(), Factory()
    try:
        read, mode = KINDS[kind](
            arrays, {"reader": first, "cache": cache, "client": client}, tmp_path
        )
        _check_seen(first, read, mode, kind)
        for array in arrays.values():
            _clear(array)
        KINDS[kind](arrays, {"reader": second, "cache": cache, "client": client}, tmp_path)
        assert not second.seen(), f"{kind}: epoch two from the cache asked for {second.seen()}"
        fetched = {
            n: f for n, a in arrays.items() if isinstance(a, zarr.Array) and (f := _fetched(a))
        }
        assert not fetched, f"{kind}: epoch two from the cache fetched {fetched}"
        if _fetched(arrays["x"]) is None:  # arrays in a directory: kept on the cluster
            assert cache.cluster_chunks > 0  # (in memory: read and cached in this process)
    finally:
        cache.clear()  # the kept futures released


@pytest.mark.parametrize("kind", sorted(set(KINDS) - {"loader_resumed"}))
def test_an_epoch_from_the_cache_asks_the_reader_nothing(
    kind: str, arrays: dict[str, Any], tmp_path: Path
) -> None:
    cache = dzb.ChunkCache("64MiB")
    first = Factory()
    KINDS[kind](arrays, _keywords("flat", first, cache), tmp_path)
    assert first.seen(), f"{kind}: the first epoch asked the reader for nothing"
    for array in arrays.values():
        _clear(array)
    second = Factory()
    KINDS[kind](arrays, _keywords("options", second, cache), tmp_path)
    assert not second.seen(), f"{kind}: epoch two from the cache asked for {second.seen()}"
    fetched = {
        name: _fetched(array)
        for name, array in arrays.items()
        if isinstance(array, zarr.Array) and _fetched(array)  # a counting store's
    }
    assert not fetched, f"{kind}: epoch two from the cache fetched {fetched}"


@property_settings(12)
@given(
    shape=shapes(min_rows=1, min_width=1, max_rows=30, max_width=5),
    data=st.data(),
    mode=st.sampled_from(["sequential", "buffered", "exact"]),
)
def test_every_chunk_once_in_any_grid(shape: tuple[int, ...], data: Any, mode: str) -> None:
    """Any shape and chunk grid, sharded or not: the counting reader is asked for every
    stored chunk (inner chunk), once where amplification is 1 (sequential and buffered, any
    buffer), and the rows are right."""
    chunks = data.draw(regular_chunks(shape), label="chunks")
    batch = data.draw(batch_sizes(shape[0]), label="batch_size")
    per = data.draw(st.none() | st.tuples(*(st.integers(1, 2) for _ in shape)), label="shards")
    shards = None if per is None else tuple(c * n for c, n in zip(chunks, per, strict=True))
    store = CountingStore(zarr.storage.MemoryStore())
    x = zarr.create_array(store, shape=shape, chunks=chunks, shards=shards, dtype="i4")
    values = np.arange(np.prod(shape), dtype="i4").reshape(shape)
    x[:] = values
    factory = Factory()
    if mode == "sequential":
        stream = dzb.batch_stream(x, batch, reader=factory)
    else:
        size = None if mode == "exact" else data.draw(buffer_sizes(shape[0]), label="buffer")
        stream = dzb.shuffled_batch_stream(x, batch, shuffle_buffer_size=size, reader=factory)
    x.store.counts.clear()
    out = _rows(_take(stream))
    np.testing.assert_array_equal(out if mode == "sequential" else np.sort(out, axis=0), values)
    _check_seen(factory, [x], "all" if mode == "exact" else "once", mode)


# --------------------------------------------------------------------------
# A reader of a format of its own: one class


class ZstdChunks:
    """Reads an array whose chunks are little-endian values, zstd-compressed, by itself.

    Each request's chunk is fetched from the array's store by its key and
    decompressed with numcodecs' zstd here, never through Zarr's codec
    pipeline nor the library's reader (``default`` is not used).
    """

    def __init__(self, array: zarr.Array, default: ChunkReader) -> None:
        self.array, self.decoded = array, 0
        self.zstd = numcodecs.Zstd()
        self.dtype = np.dtype(array.dtype).newbyteorder("<")

    def read(self, requests: Sequence[ChunkRequest]) -> None:
        for request in requests:
            key = self.array.metadata.encode_chunk_key(request.chunk)
            data = sync(self.array.store.get(key, zarr.core.buffer.default_buffer_prototype()))
            if data is None:  # never written: the fill value
                chunk = np.full(self.array.chunks, self.array.fill_value, self.dtype)
            else:
                raw = self.zstd.decode(data.to_bytes())
                chunk = np.frombuffer(raw, self.dtype).reshape(self.array.chunks)
            request.fill(chunk)
            self.decoded += 1


def _zstd_array(path: Path) -> zarr.Array:
    x = zarr.create_array(
        path, shape=(30, 4), chunks=(7, 3), dtype="<f8",
        serializer=zarr.codecs.BytesCodec(endian="little"), compressors=zarr.codecs.ZstdCodec(),
    )  # fmt: skip
    x[:28] = np.arange(112, dtype="f8").reshape(28, 4) / 3  # rows 28, 29: never written
    return x


@pytest.mark.parametrize("shuffled", [False, True])
def test_a_reader_of_its_own_format_is_one_class(shuffled: bool, tmp_path: Path) -> None:
    x = _zstd_array(tmp_path / "raw.zarr")
    readers: list[ZstdChunks] = []

    def factory(array: Any, default: ChunkReader) -> ZstdChunks:
        readers.append(ZstdChunks(array, default))
        return readers[-1]

    if shuffled:
        stream = dzb.shuffled_batch_stream(x, 4, shuffle_buffer_size=14, seed=4, reader=factory)
        out = np.sort(_rows(_take(stream)), axis=0)
    else:
        out = _rows(_take(dzb.batch_stream(x, 4, reader=factory)))
    np.testing.assert_array_equal(out, np.sort(x[:], axis=0) if shuffled else x[:])
    assert len(readers) == 1 and readers[0].decoded >= len(_grid(x))


def test_a_reader_of_its_own_format_serves_chunk_jobs(tmp_path: Path) -> None:
    x = _zstd_array(tmp_path / "raw.zarr")
    read = dzb.ReadOptions(reader=ZstdChunks)
    total = dzb.reduce_chunks(lambda c: float(np.sum(c)), lambda p, q: p + q, x, read=read)
    assert total == pytest.approx(float(np.sum(x[:])))


# --------------------------------------------------------------------------
# Factories that give no reader


class NoRead:
    pass


@pytest.mark.parametrize(
    "stream",
    [
        lambda x, f: dzb.batch_stream(x, 5, reader=f),
        lambda x, f: dzb.chunk_stream(x, reader=f),
        lambda x, f: dzb.map_chunks(np.sum, x, reader=f),
    ],
    ids=["batch_stream", "chunk_stream", "map_chunks"],
)
def test_a_factory_returning_no_reader_is_named(stream: Any) -> None:
    x = _array()
    pattern = rf"returned .*NoRead.* for zarr array '{_name(x)}': a ChunkReader has a read"
    with pytest.raises(dzb.DaskZarrBatchesError, match=pattern) as info:  # the task's error,
        _take(stream(x, lambda array, default: NoRead()))  # named by the stream
    assert isinstance(_causes(info.value)[-1], dzb.ArgumentTypeError)


def _causes(error: BaseException) -> list[BaseException]:
    out = [error]
    while out[-1].__cause__ is not None:
        out.append(out[-1].__cause__)
    return out


@pytest.mark.parametrize("stream", ["batch_stream", "chunk_stream"])
def test_a_factory_that_raises_is_raised_naming_the_array(stream: str) -> None:
    x = _array()

    def broken(array: Any, default: ChunkReader) -> ChunkReader:
        raise RuntimeError("no reader here")

    made = getattr(dzb, stream)(x, 5, reader=broken) if stream == "batch_stream" else None
    made = dzb.chunk_stream(x, reader=broken) if made is None else made
    pattern = rf"reader factory .* raised RuntimeError: no reader here for zarr array '{_name(x)}'"
    with pytest.raises(dzb.DaskZarrBatchesError, match=pattern) as info:
        _take(made)
    causes = _causes(info.value)
    assert isinstance(causes[-2], dzb.ArgumentValueError) and isinstance(causes[-1], RuntimeError)


#: every entry point that reads, called with one more keyword
ENTRY_POINTS: dict[str, Callable[..., Any]] = {
    "batch_stream": lambda x, p, **kw: dzb.batch_stream(x, 5, **kw),
    "shuffled_batch_stream": lambda x, p, **kw: dzb.shuffled_batch_stream(x, 5, **kw),
    "paired_batch_stream": lambda x, p, **kw: dzb.paired_batch_stream(x, x, 5, **kw),
    "paired_shuffled_batch_stream": lambda x, p, **kw: dzb.paired_shuffled_batch_stream(
        x, x, 5, **kw
    ),
    "patch_stream": lambda x, p, **kw: dzb.patch_stream(x, {0: 4}, 2, **kw),
    "chunk_stream": lambda x, p, **kw: dzb.chunk_stream(x, **kw),
    "map_chunks": lambda x, p, **kw: dzb.map_chunks(np.sum, x, **kw),
    "reduce_chunks": lambda x, p, **kw: dzb.reduce_chunks(np.sum, np.add, x, **kw),
    "feature_moments": lambda x, p, **kw: dzb.feature_moments(x, **kw),
    "map_to_zarr": lambda x, p, **kw: dzb.map_to_zarr(np.negative, x, p / "m.zarr", **kw),
    "write_shuffled": lambda x, p, **kw: dzb.write_shuffled(x, p / "w.zarr", **kw),
    "Loader": lambda x, p, **kw: dzb.Loader(x, 5, **kw),
}


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_a_reader_that_is_no_callable_is_refused_naming_it(entry: str, tmp_path: Path) -> None:
    x = _array()
    for bad in (3, "numpy"):
        with pytest.raises(dzb.ArgumentTypeError, match=rf"reader must be a callable.*{bad!r}"):
            ENTRY_POINTS[entry](x, tmp_path, reader=bad)
    assert not _fetched(x)  # refused before anything is read
    with pytest.raises(dzb.ArgumentTypeError, match=r"reader must be a callable.*object"):
        dzb.ReadOptions(reader=object())


def test_a_flat_reader_beside_read_must_be_the_same_factory() -> None:
    x, factory = _array(), Factory()
    with pytest.raises(dzb.ArgumentValueError, match=r"reader=.* disagrees with read\.reader="):
        dzb.batch_stream(x, 5, reader=Factory(), read=dzb.ReadOptions(reader=factory))
    same = dzb.batch_stream(x, 5, reader=factory, read=dzb.ReadOptions(reader=factory))
    assert len(_take(same)) == 10 and factory.calls() == {_name(x): 1}


@pytest.mark.parametrize("layout", ["write_zarr", "write_sharded"])
def test_a_counting_reader_sees_every_sparse_chunk_decoded(layout: str, tmp_path: Path) -> None:
    """anndata's CSR rows: each stored (inner) chunk of ``data`` and ``indices`` asked for."""
    from sparse_layout import random_cells, write_sharded_like, write_zarr_like

    cells = random_cells(60, 12, 4, seed=3)
    if layout == "write_zarr":
        write_zarr_like(tmp_path / "cells.zarr", cells, chunk=16)
    else:
        write_sharded_like(tmp_path / "cells.zarr", cells, n_obs_per_chunk=8, obs_per_shard=16)
    x = dzb.open_array(str(tmp_path / "cells.zarr"), "X")
    factory = Factory()
    batches = _take(dzb.shuffled_batch_stream(x, 16, shuffle_buffer_size=24, reader=factory))
    assert sum(b.shape[0] for b in batches) == 60
    group = zarr.open_group(tmp_path / "cells.zarr" / "X", mode="r")
    seen = factory.seen()
    for name in ("data", "indices"):  # by path: however the library opened the group
        mine = {c for (a, c) in seen if a.endswith(f"X/{name}")}
        calls = [n for a, n in factory.calls().items() if a.endswith(f"X/{name}")]
        assert calls == [1], (name, factory.calls())
        assert mine == _grid(group[name]), (name, sorted(mine))
