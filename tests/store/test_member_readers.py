"""The reader hook under collections, mixtures, chunk subsets and CSR groups.

A counting reader (``reader=factory``) sees every stored chunk of the arrays
beneath: a collection's members (the one combined zstd read of plain members
too), a mixture's sources, a chunk subset's base array, a CSR group's ``data``
and ``indices`` (1-D chunk coordinates) -- each chunk once for a sequential or
buffered epoch, none on an epoch served from a ``ChunkCache``, the factory
called once per array per stream.  Readers that fill requests themselves, or
pass them on one at a time, give the same rows.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp
import zarr
from hypothesis import given
from hypothesis import strategies as st
from sparse_layout import random_cells, write_sharded_like, write_zarr_like
from strategies import property_settings, seeds
from zarr.codecs import BloscCodec

import daskzarr_batches as dzb
from daskzarr_batches.readers import ChunkRequest
from daskzarr_batches.store.requests import chunk_region

WIDTH = 3


class Counting:
    """Counts the chunks it is asked for, and lets the reader beneath read them."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.chunks = inner, []

    def read(self, requests: Sequence[ChunkRequest]) -> None:
        self.chunks += [r.chunk for r in requests]
        self.inner.read(requests)


class OneByOne(Counting):
    """Passes each request on alone (so the library's planned read never runs)."""

    def read(self, requests: Sequence[ChunkRequest]) -> None:
        for request in requests:
            super().read([request])


class Itself(Counting):
    """Reads its requests itself, whole chunks through Zarr, asking the default nothing."""

    def __init__(self, inner: Any, array: Any) -> None:
        super().__init__(inner)
        self.array = array

    def read(self, requests: Sequence[ChunkRequest]) -> None:
        self.chunks += [r.chunk for r in requests]
        for request in requests:
            request.fill(self.array[chunk_region(self.array, request.chunk)])


class Factory:
    """``reader=`` factory: one ``kind`` reader per array, remembered by the array's path."""

    def __init__(self, kind: str = "counting") -> None:
        self.kind = kind
        self.made: list[tuple[str, Counting]] = []

    def __call__(self, array: Any, default: Any) -> Counting:
        if self.kind == "itself":
            reader: Counting = Itself(default, array)
        else:
            reader = OneByOne(default) if self.kind == "one-by-one" else Counting(default)
        self.made.append((str(array.store_path), reader))
        return reader

    def seen(self) -> dict[str, collections.Counter[tuple[int, ...]]]:
        return {path: collections.Counter(reader.chunks) for path, reader in self.made}

    def once_per_array(self) -> None:
        paths = [path for path, _ in self.made]
        assert len(paths) == len(set(paths)), paths


def _array(path: Path, n: int, chunk: int, start: int = 0, compressors: Any = "auto") -> Any:
    array = zarr.create_array(
        str(path), shape=(n, WIDTH), chunks=(chunk, WIDTH), dtype="i4", compressors=compressors
    )
    array[:] = (np.arange(start, start + n)[:, None] * WIDTH + np.arange(WIDTH)).astype("i4")
    return array


def _members(tmp_path: Path, plain: bool) -> list[Any]:
    """Three zarr arrays: plain zstd (``store.direct``), or the last one blosc."""
    third = "auto" if plain else (BloscCodec(cname="lz4"),)
    return [
        _array(tmp_path / "a", 20, 5, 0),
        _array(tmp_path / "b", 12, 4, 20),
        _array(tmp_path / "c", 9, 3, 32, third),
    ]


def _all_chunks(array: Any) -> set[tuple[int, ...]]:
    return {(i, 0) for i in range(-(-array.shape[0] // array.chunks[0]))}


def _rows(batches: Sequence[np.ndarray]) -> np.ndarray:
    return np.sort(np.concatenate(batches)[:, 0] // WIDTH)


STREAMS: dict[str, Callable[..., Any]] = {
    "sequential": lambda data, **kw: dzb.batch_stream(data, 7, **kw),
    "buffered": lambda data, **kw: dzb.shuffled_batch_stream(
        data, 7, seed=3, shuffle_buffer_size=16, **kw
    ),
}


@pytest.mark.parametrize("mode", list(STREAMS))
@pytest.mark.parametrize("plain", [True, False], ids=["plain-zstd", "mixed"])
def test_collection_members_each_chunk_once_then_none_from_the_cache(
    tmp_path: Path, mode: str, plain: bool
) -> None:
    members = _members(tmp_path, plain)
    data = dzb.concat(members)
    factory = Factory()
    got = list(STREAMS[mode](data, reader=factory))
    np.testing.assert_array_equal(_rows(got), np.arange(41))
    factory.once_per_array()
    seen = factory.seen()
    assert len(seen) == 3
    for member in members:
        counts = seen[str(member.store_path)]
        assert set(counts) == _all_chunks(member) and set(counts.values()) == {1}
    cache = dzb.ChunkCache("8MiB")
    list(STREAMS[mode](data, cache=cache))  # epoch one fills the cache
    again = Factory()
    second = list(STREAMS[mode](data, cache=cache, reader=again))
    np.testing.assert_array_equal(_rows(second), np.arange(41))
    assert all(not reader.chunks for _, reader in again.made)


@pytest.mark.parametrize("kind", ["one-by-one", "itself"])
def test_collection_readers_that_do_not_run_the_planned_read(tmp_path: Path, kind: str) -> None:
    members = _members(tmp_path, True)
    factory = Factory(kind)
    got = list(dzb.batch_stream(dzb.concat(members), 7, reader=factory))
    np.testing.assert_array_equal(np.concatenate(got)[:, 0] // WIDTH, np.arange(41))
    factory.once_per_array()
    for member in members:
        counts = factory.seen()[str(member.store_path)]
        assert set(counts) == _all_chunks(member) and set(counts.values()) == {1}


def test_many_plain_members_under_wrappers_are_read_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More wrapped members than are asked inside one another: the rest asked after."""
    from daskzarr_batches.read import window

    monkeypatch.setattr(window, "MEMBERS_NESTED", 2)
    gathered: list[int] = []
    gather = window._Members.gather

    def counted(self: Any) -> None:
        gathered.append(len(self.enlisted))
        gather(self)

    monkeypatch.setattr(window._Members, "gather", counted)
    members = [_array(tmp_path / f"m{i}", 4, 2, 4 * i) for i in range(12)]
    factory = Factory()
    got = list(dzb.batch_stream(dzb.concat(members), 50, reader=factory))
    np.testing.assert_array_equal(np.concatenate(got)[:, 0] // WIDTH, np.arange(48))
    factory.once_per_array()
    assert all(reader.chunks == [(0, 0), (1, 0)] for _, reader in factory.made)
    # each combined read of at most two members (a member split by windows read in each)
    assert max(gathered) == 2 and sum(gathered) >= 12


@property_settings(8)
@given(
    lengths=st.lists(st.integers(1, 13), min_size=1, max_size=5),
    chunk=st.integers(1, 5),
    blosc=st.lists(st.booleans(), min_size=5, max_size=5),
    kind=st.sampled_from(["counting", "one-by-one", "itself"]),
    mode=st.sampled_from(["sequential", "buffered", "exact"]),
    seed=seeds,
)
def test_every_member_decode_is_asked_of_its_reader(
    lengths: list[int], chunk: int, blosc: list[bool], kind: str, mode: str, seed: int
) -> None:
    """Any members, reader and shuffle: the rows are the members' and the readers saw
    exactly the chunks the stream says it decoded, each member's chunks all."""
    store = zarr.storage.MemoryStore()
    members, at = [], 0
    for i, length in enumerate(lengths):
        codec = (BloscCodec(cname="lz4"),) if blosc[i] else "auto"
        array = zarr.create_array(
            store, name=f"m{i}", shape=(length, WIDTH), chunks=(chunk, WIDTH), dtype="i4",
            compressors=codec,
        )  # fmt: skip
        array[:] = (np.arange(at, at + length)[:, None] * WIDTH + np.arange(WIDTH)).astype("i4")
        members.append(array)
        at += length
    factory = Factory(kind)
    data = dzb.concat(members)
    if mode == "exact":
        stream = dzb.shuffled_batch_stream(data, 3, seed=seed, reader=factory)
    else:
        stream = STREAMS[mode](data, reader=factory)
    got = list(stream)
    np.testing.assert_array_equal(_rows(got), np.arange(at))
    factory.once_per_array()
    seen = factory.seen()
    assert sum(sum(counts.values()) for counts in seen.values()) == stream.stats.chunks_read
    for member in members:
        assert set(seen[str(member.store_path)]) == _all_chunks(member)


@pytest.mark.parametrize("mode", list(STREAMS))
def test_mixture_sources_every_chunk_decoded_seen(tmp_path: Path, mode: str) -> None:
    a, b = _array(tmp_path / "a", 20, 5, 0), _array(tmp_path / "b", 12, 4, 20)
    data = dzb.mix([a, b], [1.0, 1.0], seed=2, stop="all_exhausted")
    factory = Factory()
    stream = STREAMS[mode](data, reader=factory)
    rows = np.concatenate(list(stream))[:, 0] // WIDTH
    assert set(rows.tolist()) == set(range(32))
    factory.once_per_array()
    seen = factory.seen()
    for array in (a, b):  # b, drawn again once spent, is read again: each chunk at least once
        assert set(seen[str(array.store_path)]) == _all_chunks(array)
    assert sum(sum(c.values()) for c in seen.values()) == stream.stats.chunks_read
    cache = dzb.ChunkCache("8MiB")
    list(STREAMS[mode](data, cache=cache))
    again = Factory()
    assert len(np.concatenate(list(STREAMS[mode](data, cache=cache, reader=again)))) == len(rows)
    assert all(not reader.chunks for _, reader in again.made)


def _subsets(tmp_path: Path) -> list[tuple[Any, Any, set[tuple[int, ...]]]]:
    """(subset, base array, its chunks): made directly, by chunk_split, of a collection."""
    a = _array(tmp_path / "a", 20, 5, 0)
    direct = dzb.ChunkSubset(
        a, dim=0, axis=0, chunks=(1, 3), ranges=((5, 10), (15, 20)), index=0, fraction=0.5
    )
    split = dzb.chunk_split(a, [0.5, 0.5], seed=0)[0]
    b = _array(tmp_path / "b", 12, 4, 20)
    joined = dzb.chunk_split(dzb.concat([a, b]), [0.5, 0.5], seed=1)[1]
    return [
        (direct, a, {(1, 0), (3, 0)}),
        (split, a, {(c, 0) for c in split.chunks}),
        (joined, None, set()),
    ]


@pytest.mark.parametrize("mode", list(STREAMS))
@pytest.mark.parametrize("which", ["ChunkSubset", "chunk_split", "split-collection"])
def test_subset_shows_its_base_arrays_chunks(tmp_path: Path, mode: str, which: str) -> None:
    index = ["ChunkSubset", "chunk_split", "split-collection"].index(which)
    subset, base, chunks = _subsets(tmp_path)[index]
    factory = Factory()
    got = list(STREAMS[mode](subset, reader=factory))
    assert sum(len(batch) for batch in got) == len(subset)
    factory.once_per_array()
    seen = factory.seen()
    if base is not None:
        assert set(seen) == {str(base.store_path)}
        counts = seen[str(base.store_path)]
        assert set(counts) == chunks and set(counts.values()) == {1}
    else:  # a collection's subset: whole chunks of its members, each once
        rows = set((np.concatenate(got)[:, 0] // WIDTH).tolist())
        assert sum(len(c) for c in seen.values()) > 0
        for path, counts in seen.items():
            assert set(counts.values()) == {1}, path
        assert len(rows) == len(subset)
    cache = dzb.ChunkCache("8MiB")
    list(STREAMS[mode](subset, cache=cache))
    again = Factory()
    assert sum(len(b) for b in STREAMS[mode](subset, cache=cache, reader=again)) == len(subset)
    assert all(not reader.chunks for _, reader in again.made)


def _csr(tmp_path: Path, layout: str) -> tuple[Any, sp.csr_matrix]:
    matrix = random_cells(120, 30, 5, seed=4)
    if layout == "sharded":
        root = write_sharded_like(tmp_path / "x.zarr", matrix, n_obs_per_chunk=8)
    else:
        root = write_zarr_like(tmp_path / "x.zarr", matrix, chunk=40)
    return dzb.open_array(root["X"]), matrix


@pytest.mark.parametrize("mode", list(STREAMS))
@pytest.mark.parametrize("layout", ["sharded", "zarr"])
def test_csr_data_and_indices_chunks_each_once_then_none_from_the_cache(
    tmp_path: Path, mode: str, layout: str
) -> None:
    rows, matrix = _csr(tmp_path, layout)
    factory = Factory()
    got = list(STREAMS[mode](rows, reader=factory))
    assert sum(batch.shape[0] for batch in got) == matrix.shape[0]
    assert sum(batch.nnz for batch in got) == matrix.nnz
    factory.once_per_array()
    seen = factory.seen()
    group = rows.group
    for part in ("data", "indices"):
        array = group[part]
        counts = seen[str(array.store_path)]
        stored = {(i,) for i in range(-(-array.shape[0] // array.chunks[0]))}
        assert set(counts) == stored
        if mode == "sequential":
            assert set(counts.values()) == {1}
    assert set(seen) == {str(group[p].store_path) for p in ("data", "indices")}
    cache = dzb.ChunkCache("8MiB")
    list(STREAMS[mode](rows, cache=cache))
    again = Factory()
    second = list(STREAMS[mode](rows, cache=cache, reader=again))
    assert sum(batch.nnz for batch in second) == matrix.nnz
    assert all(not reader.chunks for _, reader in again.made)


@pytest.mark.parametrize("kind", ["one-by-one", "itself"])
def test_csr_readers_that_do_not_run_the_planned_read(tmp_path: Path, kind: str) -> None:
    rows, matrix = _csr(tmp_path, "zarr")
    factory = Factory(kind)
    got = sp.vstack(list(dzb.batch_stream(rows, 16, reader=factory)))
    assert (got != matrix).nnz == 0
    factory.once_per_array()
    assert len(factory.made) == 2 and all(reader.chunks for _, reader in factory.made)
