"""The chunk cache never serves a wrong, stale or foreign chunk (issue 26, items 3 to 6).

Damaged cache files (any header byte, sampled data bytes) are dropped and read again;
arrays rewritten in place, and in-memory arrays made and dropped in a loop, are read
from their store; processes forked or spawned on one directory keep writing; odd cache
directories are served read-only, named at construction, or fail one entry alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
import zarr.storage

import daskzarr_batches as dzb
from daskzarr_batches.errors import CacheWarning, DaskZarrBatchesError
from daskzarr_batches.store import cache as cache_module
from daskzarr_batches.store import cache_tiers
from daskzarr_batches.store.cache import ChunkCache

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path.cwd()), *sys.path])}


def make(path: Path, value: Any = None) -> np.ndarray:
    """An array of 4 chunks (40 x 3 float32) at ``path``: distinct values, or all ``value``."""
    data = np.arange(120, dtype="f4").reshape(40, 3) + 0.5
    if value is not None:
        data[:] = value
    array = zarr.create_array(
        zarr.storage.LocalStore(str(path)), shape=(40, 3), chunks=(10, 3), dtype="f4",
        overwrite=True,
    )  # fmt: skip
    array[:] = data
    return data


def read(array: Any, cache: ChunkCache, **options: Any) -> tuple[np.ndarray, Any]:
    stream = dzb.batch_stream(array, 16, cache=cache, **options)
    return np.concatenate(list(stream)), stream.stats


# ------------------------------------------------------------------ item 3: damaged files


def test_every_header_byte_and_sampled_data_bytes_damaged_are_dropped(tmp_path: Path) -> None:
    data = make(tmp_path / "a.zarr")
    array = zarr.open_array(str(tmp_path / "a.zarr"), mode="r")
    directory = tmp_path / "cache"
    read(array, ChunkCache(0, directory=directory))
    files = sorted(directory.glob("*.chunk"))
    assert len(files) == 4
    path = files[0]
    good = path.read_bytes()
    key = path.stem
    expected = ChunkCache(0, directory=directory).get(key)
    assert expected is not None
    start = len(cache_module.MAGIC) + 4
    (length,) = cache_module._HEADER.unpack(good[len(cache_module.MAGIC) : start])
    header_end = start + length
    rng = np.random.default_rng(0)
    data_bytes = sorted(set(rng.integers(header_end, len(good) - 4, 48).tolist()))
    positions = [*range(header_end), *data_bytes, *range(len(good) - 4, len(good))]
    cache = ChunkCache(0, directory=directory)
    for position in positions:
        for flip in (0x01, 0x80, 0xFF):
            raw = bytearray(good)
            raw[position] ^= flip
            path.write_bytes(bytes(raw))
            counts = cache_module.CacheCounts()
            found = cache.get(key, counts)  # never raises, never a wrong value
            assert found is None, (position, flip)
            assert counts.damaged == 1 and not path.exists(), (position, flip)
    for cut in (1, 4, length, len(good) - 1):  # truncated, and one byte too many
        for raw in (good[:cut], good + b"\0"):
            path.write_bytes(raw)
            counts = cache_module.CacheCounts()
            assert cache.get(key, counts) is None and counts.damaged == 1
    path.write_bytes(b"DZBCACHE1\n" + good[len(cache_module.MAGIC) :])  # an earlier version's
    counts = cache_module.CacheCounts()
    assert cache.get(key, counts) is None and counts.damaged == 0 and not path.exists()
    path.write_bytes(good)
    again = cache.get(key)
    assert again is not None and again.dtype == expected.dtype
    np.testing.assert_array_equal(again, expected)
    # through a stream skipping undecodable chunks: read again from the store, nothing skipped
    header = good[start:header_end]
    for damaged in (
        header.replace(b'"<f4"', b'">f4"'),  # the byte order: valid JSON, a valid dtype
        header.replace(b'"shape": [', b'"shape": ['[:-1] + b"{"),  # no JSON any more
        header.replace(b'"key"', b'"kez"'),
        json.dumps([1, 2]).encode().ljust(len(header)),  # JSON, not a header
    ):
        assert len(damaged) == len(header)
        path.write_bytes(good[:start] + damaged + good[header_end:])
        got, stats = read(array, ChunkCache(0, directory=directory), on_error="skip")
        np.testing.assert_array_equal(got, data)
        assert stats.cache_damaged == 1 and stats.cache_misses == 1 and stats.cache_hits == 3
        assert stats.skipped == [] and stats.samples_yielded == 40


# ------------------------------------------------------------------ item 4: stale data


def test_rewritten_in_place_is_not_served_by_the_memory_cache(tmp_path: Path) -> None:
    make(tmp_path / "a.zarr", 1)
    cache = ChunkCache("64MiB")
    first, _ = read(zarr.open_array(str(tmp_path / "a.zarr"), mode="r"), cache)
    assert (first == 1).all()
    zarr.open_array(str(tmp_path / "a.zarr"), mode="r+")[:] = 2  # the same metadata
    got, stats = read(zarr.open_array(str(tmp_path / "a.zarr"), mode="r"), cache)
    assert (got == 2).all() and stats.cache_hits == 0
    again, stats = read(zarr.open_array(str(tmp_path / "a.zarr"), mode="r"), cache)
    assert (again == 2).all() and stats.cache_misses == 0  # unchanged since: served


def test_rewritten_in_place_is_not_served_by_the_disk_cache_to_a_new_process(
    tmp_path: Path,
) -> None:
    make(tmp_path / "a.zarr", 1)
    array = zarr.open_array(str(tmp_path / "a.zarr"), mode="r")
    read(array, ChunkCache(0, directory=tmp_path / "cache"))  # every chunk has its file
    zarr.open_array(str(tmp_path / "a.zarr"), mode="r+")[:] = 2
    script = (
        "import sys, numpy as np, zarr, daskzarr_batches as dzb\n"
        "c = dzb.ChunkCache(0, directory=sys.argv[2])\n"
        "s = dzb.batch_stream(zarr.open_array(sys.argv[1], mode='r'), 16, cache=c)\n"
        "x = np.concatenate(list(s))\n"
        "print(s.stats.cache_hits, s.stats.cache_misses, sorted(set(x.ravel().tolist())))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "a.zarr"), str(tmp_path / "cache")],
        capture_output=True, text=True, check=True, env=ENV,
    )  # fmt: skip
    assert done.stdout.strip() == "0 4 [2.0]"  # a new process: read again, not the old files
    got, stats = read(array, ChunkCache(0, directory=tmp_path / "cache"))
    assert (got == 2).all() and (stats.cache_hits, stats.cache_misses) == (4, 0)


def test_one_chunk_rewritten_in_place_through_an_object_store(tmp_path: Path) -> None:
    obstore = pytest.importorskip("obstore")
    make(tmp_path / "a.zarr", 1)

    def opened(read_only: bool = True) -> Any:
        inner = obstore.store.LocalStore(str(tmp_path / "a.zarr"))
        store = zarr.storage.ObjectStore(inner, read_only=read_only)
        return zarr.open_array(store, mode="r" if read_only else "r+")

    cache = ChunkCache("64MiB", directory=tmp_path / "cache")
    first, _ = read(opened(), cache)
    assert (first == 1).all()
    opened(read_only=False)[10:20] = 2  # one chunk
    got, stats = read(opened(), cache)
    assert (got[10:20] == 2).all() and (got[:10] == 1).all() and (got[20:] == 1).all()
    assert stats.cache_hits == 0


def test_in_memory_arrays_made_and_dropped_never_get_anothers_chunks() -> None:
    def made(value: int) -> Any:
        array = zarr.create_array(
            zarr.storage.MemoryStore(), shape=(40, 3), chunks=(10, 3), dtype="f4"
        )
        array[:] = value
        return array

    tokens = set()
    for i in range(50):  # each dropped at once: its id is reused (most of them), tokens never
        tokens.add(cache_module.array_token(made(i)))
    assert len(tokens) == 50
    cache = ChunkCache("64MiB")
    for i in range(8):
        array = made(i)
        got, stats = read(array, cache)
        assert (got == i).all() and stats.cache_hits == 0, i
        if i % 4 == 0:  # the same array again: served from the cache
            again, stats = read(array, cache)
            assert (again == i).all() and stats.cache_misses == 0
        del array


# ------------------------------------------------------------------ item 5: processes

SHARING = """
import os, subprocess, sys, numpy as np
from daskzarr_batches.store.cache import ChunkCache
directory, role = sys.argv[1], sys.argv[2]

def work():
    cache = ChunkCache(0, directory=directory)
    chunks = [np.full((64,), k, dtype="f8") for k in range(6)]
    for round in range(150):
        for k, chunk in enumerate(chunks):
            cache.put(f"chunk{k}", chunk)
    problem = cache.take_write_error()
    for k in range(6):
        found = ChunkCache(0, directory=directory).get(f"chunk{k}")
        assert found is not None and (found == k).all(), k
    return problem

if role == "parent":  # a spawned process, then three forked ones, all at once
    spawned = subprocess.Popen(
        [sys.executable, "-c", sys.argv[3], directory, "spawned"],
        stdout=subprocess.PIPE, text=True,
    )
    children = []
    for _ in range(3):
        pid = os.fork()
        if pid == 0:
            os._exit(0 if work() is None else 3)
        children.append(pid)
    codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children]
    out, _ = spawned.communicate()
    print(codes, spawned.returncode, out.strip())
else:
    print(work())
"""


def test_forked_and_spawned_processes_sharing_a_directory_keep_writing(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", SHARING, str(tmp_path / "cache"), "parent", SHARING],
        capture_output=True, text=True, env=ENV, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[0, 0, 0] 0 None", done.stderr
    assert not list((tmp_path / "cache").glob("*.tmp"))


def test_the_process_token_is_new_after_a_fork() -> None:
    before = cache_module._PROCESS
    reading, writing = os.pipe()
    with warnings.catch_warnings():  # fork of a process with threads (pytest's): the child
        warnings.simplefilter("ignore", DeprecationWarning)  # only writes a line and exits
        pid = os.fork()
    if pid == 0:
        os.write(writing, cache_module._PROCESS.encode())
        os._exit(0)
    os.close(writing)
    child = os.read(reading, 200).decode()
    os.close(reading)
    os.waitpid(pid, 0)
    assert child and child != before and before == cache_module._PROCESS


# ------------------------------------------------------------------ item 6: directories


def test_a_read_only_directory_serves_its_files_and_warns_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = make(tmp_path / "a.zarr")
    array = zarr.open_array(str(tmp_path / "a.zarr"), mode="r")
    directory = tmp_path / "cache"
    read(array, ChunkCache(0, directory=directory))
    (next(directory.glob("*.chunk"))).unlink()  # one chunk to write: it cannot be
    directory.chmod(0o555)
    try:
        if os.geteuid() == 0:  # root writes anyway: the directory refuses as it would

            def refuse(*args: Any, **kwargs: Any) -> Any:
                raise PermissionError(13, "Permission denied", str(args[0]))

            real_open = open

            def opener(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
                if "w" in mode and str(directory) in str(file):
                    refuse(file)
                return real_open(file, mode, *args, **kwargs)

            monkeypatch.setattr(cache_module.os, "utime", refuse)
            monkeypatch.setattr(cache_tiers, "open", opener, raising=False)  # the disk tier's
        cache = ChunkCache(0, directory=directory)
        with pytest.warns(CacheWarning, match="cannot write") as caught:
            got, stats = read(array, cache)
        assert len(caught) == 1
        np.testing.assert_array_equal(got, data)
        assert (stats.cache_hits, stats.cache_misses, stats.cache_damaged) == (3, 1, 0)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got, stats = read(array, cache)  # warned once
        np.testing.assert_array_equal(got, data)
        assert (stats.cache_hits, stats.cache_damaged) == (3, 0)
    finally:
        directory.chmod(0o755)


def test_a_directory_that_cannot_be_one_is_named_at_construction(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    for where in (tmp_path / "file", tmp_path / "file" / "below"):
        with pytest.raises(dzb.ArgumentValueError, match=str(where)) as raised:
            ChunkCache(0, directory=where)
        assert isinstance(raised.value, DaskZarrBatchesError)


def test_a_directory_in_place_of_one_file_fails_that_entry_alone(tmp_path: Path) -> None:
    data = make(tmp_path / "a.zarr")
    array = zarr.open_array(str(tmp_path / "a.zarr"), mode="r")
    directory = tmp_path / "cache"
    read(array, ChunkCache(0, directory=directory))
    files = sorted(directory.glob("*.chunk"))
    for path in files:
        path.unlink()
    (files[0] / "inside").mkdir(parents=True)  # a directory where one chunk's file belongs
    cache = ChunkCache(0, directory=directory)
    with pytest.warns(CacheWarning, match=str(files[0])):
        got, stats = read(array, cache)
    np.testing.assert_array_equal(got, data)
    assert all(path.is_file() for path in files[1:])  # the others are written
    got, stats = read(array, cache)  # warned once
    np.testing.assert_array_equal(got, data)
    assert (stats.cache_hits, stats.cache_misses, stats.cache_damaged) == (3, 1, 1)


@pytest.mark.parametrize("backend", ["fsspec", "obstore"])
def test_rewritten_in_place_on_s3_is_read_again(s3_server: Any, backend: str) -> None:
    if backend == "obstore":
        pytest.importorskip("obstore")
    options = s3_server.storage_options()
    url = f"s3://{s3_server.new_bucket('cache')}/a.zarr"
    written = zarr.create_array(
        url, shape=(40, 3), chunks=(10, 3), dtype="f4", storage_options=options
    )
    written[:] = 1
    cache = ChunkCache("64MiB")

    def opened() -> Any:
        return dzb.open_array(url, storage_options=options, backend=backend)

    got, stats = read(opened(), cache)
    assert (got == 1).all() and stats.cache_misses == 4
    got, stats = read(opened(), cache)  # unchanged: served (the listing names the same)
    assert (got == 1).all() and stats.cache_hits == 4
    zarr.open_array(url, mode="r+", storage_options=options)[:] = 2
    got, stats = read(opened(), cache)
    assert (got == 2).all() and stats.cache_hits == 0
