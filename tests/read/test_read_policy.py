"""The read policy: missing chunks, chunks that do not decode, transient faults.

Faults come from real stores: chunk files deleted or overwritten in a directory
store, and :class:`stores.FaultStore`, a Zarr wrapper store that raises chosen
exceptions; nothing of the library is mocked.
"""

from __future__ import annotations

import shutil
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from hypothesis import given
from hypothesis import strategies as st
from stores import FaultStore
from strategies import property_settings

import daskzarr_batches as dzb
from daskzarr_batches.store.policy import is_transient

ROWS, COLS, CHUNK = 60, 3, 10


def write(path: Path, name: str = "x", chunk: int = CHUNK, dtype: str = "f4") -> zarr.Array:
    data = (np.arange(ROWS * COLS, dtype=dtype).reshape(ROWS, COLS) + 1) if COLS else None
    array = zarr.create_array(
        path / f"{name}.zarr", shape=(ROWS, COLS), chunks=(chunk, COLS), dtype=dtype
    )
    array[:] = data
    return array


def labels(path: Path) -> zarr.Array:
    array = zarr.create_array(path / "y.zarr", shape=(ROWS,), chunks=(7,), dtype="i8")
    array[:] = np.arange(ROWS) + 1
    return array


def chunk_file(path: Path, chunk: int, name: str = "x") -> Path:
    return path / f"{name}.zarr" / "c" / str(chunk) / "0"


STREAMS: dict[str, Callable[..., Any]] = {
    "sequential": lambda x, **kw: dzb.batch_stream(x, 8, window_bytes=24 * 12, **kw),
    "buffered": lambda x, **kw: dzb.shuffled_batch_stream(
        x, 8, seed=1, shuffle_buffer_size=25, **kw
    ),
    "exact": lambda x, **kw: dzb.shuffled_batch_stream(x, 8, seed=1, memory_budget=30 * 12, **kw),
    "chunks": lambda x, **kw: dzb.chunk_stream(x, **kw),
    "unordered chunks": lambda x, **kw: dzb.chunk_stream(x, ordered=False, **kw),
    "map_chunks": lambda x, **kw: dzb.map_chunks(lambda c: c * 1, x, **kw),
}


def rows_of(items: list[Any]) -> np.ndarray:
    return np.concatenate(items) if items else np.empty((0, COLS))


# --------------------------------------------------------------------------
# Missing chunks


@pytest.mark.parametrize("kind", STREAMS)
def test_a_missing_chunk_warns_once_at_the_first_and_reads_as_fill(
    tmp_path: Path, kind: str
) -> None:
    x = write(tmp_path)
    chunk_file(tmp_path, 2).unlink()
    stream = STREAMS[kind](x, missing="warn")  # opt-in: the default "fill" does not warn
    if isinstance(stream, dzb.BatchStream):  # an exact shuffle reads a chunk once per window
        reads = [piece.chunk for window in stream.plan.windows() for piece in window.pieces[0]]
    else:
        reads = list(range(ROWS // CHUNK))
    items: list[Any] = []
    warned_at = None
    with pytest.warns(dzb.MissingChunksWarning) as caught:
        for item in stream:  # the warning's line: the caller's, not the library's
            items.append(item)
            warned_at = len(items) if caught and warned_at is None else warned_at
    got = rows_of(items)
    assert len(caught) == 1
    assert caught[0].filename == __file__
    # in the next() that handed out the first item of the window holding it, not at the end
    first_fill = next(i for i, item in enumerate(items, 1) if (np.asarray(item) == 0).any())
    assert warned_at is not None and warned_at <= first_fill
    warning = caught[0].message
    assert isinstance(warning, dzb.MissingChunksWarning)
    assert (warning.key, warning.array, warning.count) == ("c/2/0", stream_name(stream), 1)
    assert "'c/2/0'" in str(warning) and "missing='fill'" in str(warning)
    assert reads.count(2) > 1 or kind != "exact"  # several windows read it: counted once
    assert stream.stats.chunks_missing == 1
    assert stream.stats.chunks_read == len(reads) - reads.count(2)
    assert np.sort(got[:, 0]).tolist().count(0.0) == CHUNK  # the fill value, 10 rows of it


def stream_name(stream: Any) -> str:
    if isinstance(stream, dzb.ChunkStream):
        return str(stream.source.name)
    return str(stream.spec.sources[0].name)


def test_the_missing_chunk_warning_points_at_the_loop_through_a_loader(tmp_path: Path) -> None:
    x = write(tmp_path)
    chunk_file(tmp_path, 3).unlink()
    loader = dzb.Loader({"x": x}, 8, missing="warn")
    with pytest.warns(dzb.MissingChunksWarning) as caught:
        for _ in loader:  # the warning's line
            pass
    assert len(caught) == 1 and caught[0].filename == __file__
    assert loader.stats is not None and loader.stats.chunks_missing == 1


@pytest.mark.parametrize("prefetch", [0, 2])
def test_the_missing_chunk_warning_points_at_the_loop_through_a_device_feed(
    tmp_path: Path, prefetch: int
) -> None:
    """Raised on the prefetch thread, it was attributed to threading.py."""
    from daskzarr_batches.cupy import CupyLoader

    x = write(tmp_path)
    chunk_file(tmp_path, 3).unlink()
    feed = CupyLoader(dzb.Loader({"x": x}, 8, missing="warn"), xp=np, prefetch=prefetch)
    with pytest.warns(dzb.MissingChunksWarning) as caught:
        line = sys._getframe().f_lineno + 1
        for _ in feed:  # the warning's line
            pass
    assert len(caught) == 1
    assert (caught[0].filename, caught[0].lineno) == (__file__, line)


@pytest.mark.torch
def test_the_missing_chunk_warning_points_at_the_loop_through_the_torch_adapter(
    tmp_path: Path,
) -> None:
    from daskzarr_batches.torch import ZarrIterableDataset

    x = write(tmp_path)
    chunk_file(tmp_path, 3).unlink()
    with pytest.warns(dzb.MissingChunksWarning) as caught:
        for _ in ZarrIterableDataset(dzb.Loader({"x": x}, 8, missing="warn")):  # its line
            pass
    assert len(caught) == 1 and caught[0].filename == __file__


@pytest.mark.parametrize("kind", STREAMS)
def test_missing_fill_is_silent_and_missing_error_raises_naming_the_key(
    tmp_path: Path, kind: str
) -> None:
    x = write(tmp_path)
    chunk_file(tmp_path, 4).unlink()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(rows_of(list(STREAMS[kind](x, missing="fill")))) == ROWS
    with pytest.raises(dzb.MissingChunkError, match=r"'c/4/0' of array .*x\.zarr") as raised:
        list(STREAMS[kind](x, missing="error"))
    assert isinstance(raised.value, KeyError) and isinstance(raised.value, dzb.ChunkReadError)


def test_reductions_take_the_policy_too(tmp_path: Path) -> None:
    x = write(tmp_path)
    chunk_file(tmp_path, 0).unlink()
    with pytest.raises(dzb.MissingChunkError):
        dzb.feature_moments(x, missing="error")
    with pytest.raises(dzb.MissingChunkError):
        dzb.reduce_chunks(np.sum, np.add, x, missing="error")
    with pytest.warns(dzb.MissingChunksWarning):
        assert dzb.feature_moments(x, missing="warn").count == ROWS
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the default: the fill value, as Zarr says, silently
        assert dzb.feature_moments(x).count == ROWS


@pytest.mark.parametrize("kind", STREAMS)
def test_chunks_zarr_left_unwritten_are_the_fill_value_counted_not_warned(
    tmp_path: Path, kind: str
) -> None:
    """Zarr's default write_empty_chunks=False stores no chunk that is all fill value."""
    x = zarr.create_array(tmp_path / "z.zarr", shape=(ROWS, COLS), chunks=(CHUNK, COLS),
                          dtype="f4", config={"write_empty_chunks": False})  # fmt: skip
    x[:] = 0
    x[:CHUNK] = 1  # one chunk stored, five left out
    assert sorted(p.name for p in (tmp_path / "z.zarr" / "c").iterdir()) == ["0"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        stream = STREAMS[kind](x)
        got = rows_of(list(stream))
    assert len(got) == ROWS and (got == 0).sum() == (ROWS - CHUNK) * COLS
    assert stream.stats.chunks_missing == ROWS // CHUNK - 1
    with pytest.warns(dzb.MissingChunksWarning):
        list(STREAMS[kind](x, missing="warn"))


@pytest.mark.parametrize("opened", ["zarr.Array", "open_array", "chunks", "cluster"])
@pytest.mark.parametrize("missing", ["warn", "fill", "error"])
def test_a_store_removed_mid_epoch_is_an_outage_not_zeros(
    tmp_path: Path, missing: str, opened: str, request: pytest.FixtureRequest
) -> None:
    write(tmp_path)
    where = tmp_path / "x.zarr"
    # zarr's own pipeline through the policy store, or zarrs reading the directory itself
    x = dzb.open_array(where) if opened == "open_array" else zarr.open_array(where, mode="r")
    client = request.getfixturevalue("client") if opened == "cluster" else None
    if opened == "chunks":
        stream: Any = dzb.chunk_stream(x, io_concurrency=1, missing=missing)
    else:
        stream = dzb.batch_stream(
            x, 8, window_bytes=24 * 12, prefetch=0, missing=missing, client=client
        )
    first = next(stream)
    shutil.rmtree(where)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # and no MissingChunksWarning either
        with pytest.raises(dzb.StoreGoneError, match=r"array .*x\.zarr is gone") as raised:
            more = list(stream)
            pytest.fail(f"{len(more)} more items, {sum((m == 0).all() for m in more)} of zeros")
    assert isinstance(raised.value, dzb.ChunkReadError) and isinstance(raised.value, OSError)
    assert isinstance(raised.value, FileNotFoundError)
    assert str(where) in str(raised.value)
    assert np.asarray(first)[0, 0] == 1
    assert stream.stats.chunks_missing == 0


def test_array_metadata_gone_is_an_outage_and_unwritten_chunks_are_not(tmp_path: Path) -> None:
    x = write(tmp_path)
    chunk_file(tmp_path, 1).unlink()
    assert len(rows_of(list(dzb.batch_stream(x, 8, missing="fill")))) == ROWS  # a hole
    (tmp_path / "x.zarr" / "zarr.json").unlink()  # the array itself is gone
    with pytest.raises(dzb.StoreGoneError, match=r"'zarr\.json' is no longer in the store"):
        list(dzb.batch_stream(x, 8, missing="fill"))


class MetadataGets(zarr.storage.WrapperStore[Any]):
    """Counts ``get`` calls of the array's metadata document."""

    def __init__(self, store: Any, counts: list[int] | None = None) -> None:
        super().__init__(store)
        self.counts = [0] if counts is None else counts

    def _with_store(self, store: Any) -> MetadataGets:
        return type(self)(store, self.counts)

    async def get(self, key: str, prototype: Any, byte_range: Any = None) -> Any:
        self.counts[0] += key.endswith("zarr.json")
        return await self._store.get(key, prototype, byte_range)


def test_a_sparse_array_pays_one_metadata_lookup_per_read_task(tmp_path: Path) -> None:
    x = zarr.create_array(tmp_path / "x.zarr", shape=(ROWS, COLS), chunks=(CHUNK, COLS), dtype="f4")
    x[:CHUNK] = 1  # one chunk written, five never were
    store = MetadataGets(zarr.storage.LocalStore(tmp_path / "x.zarr", read_only=True))
    sparse = zarr.open_array(store, mode="r")
    opened = store.counts[0]
    stream = dzb.shuffled_batch_stream(sparse, 8, seed=1, memory_budget=30 * 12, missing="fill")
    assert len(rows_of(list(stream))) == ROWS
    windows = stream.stats.windows_read
    assert windows > 1 and stream.stats.chunks_missing == 5
    absent_reads = sum(p.chunk > 0 for w in stream.plan.windows() for p in w.pieces[0])
    assert absent_reads > windows  # 33 reads of absent chunks in 9 windows
    assert store.counts[0] - opened <= windows  # one lookup per read task, not per chunk


# --------------------------------------------------------------------------
# Chunks that do not decode


@pytest.mark.parametrize("kind", STREAMS)
def test_a_corrupt_chunk_is_named_with_its_key_and_samples(tmp_path: Path, kind: str) -> None:
    x = write(tmp_path)
    chunk_file(tmp_path, 3).write_bytes(b"not zstd at all")
    with pytest.raises(dzb.CorruptChunkError, match=r"samples 30:40, key 'c/3/0'"):
        list(STREAMS[kind](x))


@pytest.mark.parametrize("kind", ["sequential", "buffered", "exact"])
def test_skip_leaves_the_corrupt_chunks_samples_out_of_every_paired_array(
    tmp_path: Path, kind: str
) -> None:
    x, y = write(tmp_path), labels(tmp_path)
    chunk_file(tmp_path, 1).write_bytes(b"garbage")
    make = {
        "sequential": lambda: dzb.paired_batch_stream(x, y, 8, on_error="skip"),
        "buffered": lambda: dzb.paired_shuffled_batch_stream(
            x, y, 8, seed=2, shuffle_buffer_size=25, on_error="skip"
        ),
        "exact": lambda: dzb.paired_shuffled_batch_stream(
            x, y, 8, seed=2, memory_budget=20 * 20, on_error="skip"
        ),
    }[kind]
    stream = make()
    with pytest.warns(dzb.SkippedChunksWarning, match="samples 10:20"):
        pairs = list(stream)
    xs = np.concatenate([a for a, _ in pairs])
    ys = np.concatenate([b for _, b in pairs])
    assert sorted(ys.tolist()) == [i + 1 for i in range(ROWS) if not 10 <= i < 20]
    np.testing.assert_array_equal(xs[:, 0], (ys - 1) * COLS + 1)  # pairs aligned, values true
    assert [s.samples for s in stream.stats.skipped] == [range(10, 20)]
    assert all(len(a) == 8 for a, _ in pairs[:-1])


@pytest.mark.parametrize("kind", ["sequential", "buffered", "exact"])
def test_skip_on_a_cluster_gives_the_local_batches(tmp_path: Path, client: Any, kind: str) -> None:
    """Workers return rows in plan order: the skipped samples leave every array there too."""
    x, y = write(tmp_path), labels(tmp_path)
    chunk_file(tmp_path, 1).write_bytes(b"garbage")
    make = {
        "sequential": lambda **kw: dzb.paired_batch_stream(x, y, 8, on_error="skip", **kw),
        "buffered": lambda **kw: dzb.paired_shuffled_batch_stream(
            x, y, 8, seed=2, shuffle_buffer_size=25, on_error="skip", **kw
        ),
        "exact": lambda **kw: dzb.paired_shuffled_batch_stream(
            x, y, 8, seed=2, memory_budget=20 * 20, on_error="skip", **kw
        ),
    }[kind]
    with pytest.warns(dzb.SkippedChunksWarning):
        expected = list(make(client=None))
    with pytest.warns(dzb.SkippedChunksWarning, match="samples 10:20"):
        got = list(make(client=client))
    assert len(got) == len(expected)
    for (a, b), (c, d) in zip(got, expected, strict=True):
        np.testing.assert_array_equal(a, c, strict=True)
        np.testing.assert_array_equal(b, d, strict=True)


def test_skip_in_chunk_streams_and_reductions(tmp_path: Path) -> None:
    x = write(tmp_path)
    chunk_file(tmp_path, 5).write_bytes(b"garbage")
    with pytest.warns(dzb.SkippedChunksWarning):
        chunks = dzb.chunk_stream(x, on_error="skip", with_index=True)
        blocks = [block for block, _ in chunks]
    assert blocks == [(i, 0) for i in range(5)]
    assert chunks.stats.skipped[0].chunk == (5, 0)
    with pytest.warns(dzb.SkippedChunksWarning):
        assert dzb.feature_moments(x, on_error="skip").count == ROWS - CHUNK


# --------------------------------------------------------------------------
# Transient faults


def faulty(tmp_path: Path, faults: dict[str, list[BaseException]]) -> tuple[zarr.Array, FaultStore]:
    write(tmp_path)
    store = FaultStore(zarr.storage.LocalStore(tmp_path / "x.zarr", read_only=True), faults)
    return zarr.open_array(store=store, mode="r"), store


@pytest.mark.parametrize("kind", STREAMS)
def test_transient_faults_are_retried_and_change_nothing(tmp_path: Path, kind: str) -> None:
    reference = rows_of(list(STREAMS[kind](write(tmp_path / "ref"))))
    faults: dict[str, list[BaseException]] = {
        "c/0/0": [ConnectionResetError("reset"), TimeoutError("slow")],
        "c/3/0": [OSError(104, "Connection reset by peer")],
    }
    x, store = faulty(tmp_path, faults)
    stream = STREAMS[kind](x)
    got = rows_of(list(stream))
    if kind == "unordered chunks":  # completion order
        got, reference = got[np.argsort(got[:, 0])], reference[np.argsort(reference[:, 0])]
    np.testing.assert_array_equal(got, reference)
    assert stream.stats.retries >= 3 and store.attempts["c/0/0"] >= 3


def test_more_faults_than_retries_is_a_named_chunk_read_error(tmp_path: Path) -> None:
    x, _ = faulty(tmp_path, {"c/2/0": [ConnectionError("down")] * 3})
    with pytest.raises(dzb.ChunkReadError, match=r"axis-0 chunk 2 .*after 2 retries") as raised:
        list(dzb.batch_stream(x, 8, retries=2))
    assert not isinstance(raised.value, dzb.CorruptChunkError)


def test_permanent_errors_are_never_retried(tmp_path: Path) -> None:
    x, store = faulty(tmp_path, {"c/1/0": [PermissionError("denied")]})
    with pytest.raises(dzb.ChunkReadError, match="PermissionError"):
        list(dzb.chunk_stream(x, retries=5))
    assert store.attempts["c/1/0"] == 1


class HTTPError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


class BotoError(Exception):
    def __init__(self, code: str, status: int) -> None:
        super().__init__(code)
        self.response = {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}


def chained(outer: BaseException, inner: BaseException) -> BaseException:
    outer.__cause__ = inner
    return outer


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        (ConnectionResetError(), True),
        (TimeoutError(), True),
        (HTTPError(503), True),
        (HTTPError(429), True),
        (BotoError("SlowDown", 503), True),
        (BotoError("Throttling", 400), True),
        (chained(OSError("read failed"), ConnectionError("reset")), True),
        (ExceptionGroup("g", [ValueError("x"), TimeoutError()]), True),
        (FileNotFoundError(), False),
        (PermissionError(), False),
        (HTTPError(404), False),
        (HTTPError(403), False),
        (BotoError("AccessDenied", 403), False),
        (chained(ConnectionError("wrapped"), FileNotFoundError()), False),
        (ValueError("bad zstd frame"), False),
        (RuntimeError("checksum mismatch"), False),
    ],
)
def test_what_counts_as_transient(error: BaseException, transient: bool) -> None:
    assert is_transient(error) is transient


def test_policy_arguments_are_validated() -> None:
    x = np.zeros((4, 2))
    with pytest.raises(dzb.ArgumentValueError, match="missing"):
        dzb.batch_stream(x, 2, missing="ignore")  # type: ignore[arg-type]
    with pytest.raises(dzb.ArgumentValueError, match="on_error"):
        dzb.chunk_stream(x, on_error="omit")  # type: ignore[arg-type]
    with pytest.raises(dzb.ArgumentValueError, match="retries"):
        dzb.shuffled_batch_stream(x, 2, retries=-1)
    with pytest.raises(dzb.ArgumentTypeError, match="retries"):
        dzb.map_chunks(np.sum, x, retries=1.5)  # type: ignore[arg-type]


# --------------------------------------------------------------------------
# Random faults: exactly the reference batches, or a library error, never other data

ERRORS: list[Callable[[], BaseException]] = [
    lambda: ConnectionResetError("reset"),
    lambda: TimeoutError("timed out"),
    lambda: HTTPError(503),
    lambda: PermissionError("denied"),
    lambda: ValueError("garbled"),
]


@property_settings(25)
@given(
    plan=st.dictionaries(
        st.integers(0, ROWS // CHUNK - 1),
        st.tuples(st.integers(0, len(ERRORS) - 1), st.integers(1, 4)),
        max_size=3,
    ),
    kind=st.sampled_from(["sequential", "buffered", "exact", "chunks", "map_chunks"]),
    retries=st.integers(0, 3),
)
def test_random_faults_give_the_reference_or_a_library_error(
    tmp_path_factory: pytest.TempPathFactory,
    plan: dict[int, tuple[int, int]],
    kind: str,
    retries: int,
) -> None:
    root = tmp_path_factory.mktemp("faults")
    reference = rows_of(list(STREAMS[kind](write(root / "ref"))))
    faults = {f"c/{chunk}/0": [ERRORS[e]() for _ in range(n)] for chunk, (e, n) in plan.items()}
    x, _ = faulty(root, faults)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no warning either: nothing was missing
            got = rows_of(list(STREAMS[kind](x, retries=retries)))
    except dzb.DaskZarrBatchesError:
        return
    np.testing.assert_array_equal(got, reference)


def test_a_failed_checksum_is_a_corrupt_chunk(tmp_path: Path) -> None:
    from zarr.codecs import BytesCodec, Crc32cCodec

    x = zarr.create_array(
        tmp_path / "x.zarr",
        shape=(ROWS, COLS),
        chunks=(CHUNK, COLS),
        dtype="f4",
        serializer=BytesCodec(),
        compressors=[Crc32cCodec()],
    )
    x[:] = np.ones((ROWS, COLS), dtype="f4")
    path = chunk_file(tmp_path, 2)
    raw = bytearray(path.read_bytes())
    raw[0] ^= 0xFF  # one flipped bit pattern in the data: the stored checksum no longer matches
    path.write_bytes(bytes(raw))
    with pytest.raises(dzb.CorruptChunkError, match=r"samples 20:30, key 'c/2/0'"):
        list(dzb.batch_stream(x, 8))
    with pytest.warns(dzb.SkippedChunksWarning):
        got = np.concatenate(list(dzb.batch_stream(x, 8, on_error="skip")))
    assert len(got) == ROWS - CHUNK and np.all(got == 1)  # nothing replaced by garbage


def test_a_corrupt_block_of_a_2d_chunked_array_names_its_own_key(tmp_path: Path) -> None:
    x = zarr.create_array(tmp_path / "x.zarr", shape=(20, 4), chunks=(10, 2), dtype="f4")
    x[:] = 1
    (tmp_path / "x.zarr" / "c" / "1" / "1").write_bytes(b"garbage")
    with pytest.raises(
        dzb.CorruptChunkError, match=r"chunk \(1, 1\) \(samples 10:20, key 'c/1/1'\)"
    ):
        list(dzb.chunk_stream(x))
