"""map_to_zarr and write_shuffled: per-chunk jobs that write a new Zarr array, resumably.

Properties over shapes and chunk grids (sharded input and output, functions
that change the sample shape and dtype); a job SIGKILLed mid-way in a
subprocess and resumed (identical output, ``func`` called only for the chunks
not written); a truncated output chunk written again; a fingerprint mismatch
refused; the shuffled copy is the seeded permutation, pairs aligned, within a
small memory budget; the same job on a cluster.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
import zarr.storage
from hypothesis import given
from hypothesis import strategies as st

import daskzarr_batches as dzb
from tests.strategies import property_settings

ROOT = Path(__file__).resolve().parents[2]


def _zarr(data: np.ndarray, chunks: tuple[int, ...], shards: tuple[int, ...] | None = None,
          store: Any = None) -> zarr.Array:  # fmt: skip
    array = zarr.create_array(
        store if store is not None else zarr.storage.MemoryStore(),
        shape=data.shape, chunks=chunks, shards=shards, dtype=data.dtype,
    )  # fmt: skip
    array[...] = data
    return array


def _widen(rows: np.ndarray) -> np.ndarray:
    """Changes the sample shape and dtype, row by row."""
    return np.concatenate([rows, rows * 2], axis=1).astype(np.float64) + 0.5


@st.composite
def _cases(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(0, 40))
    width = draw(st.integers(1, 3))
    in_rows = draw(st.integers(1, 12))
    in_shards = draw(st.sampled_from([None, 2, 3]))
    out_rows = draw(st.sampled_from([None, 1, 5, 16]))
    out_shards = draw(st.sampled_from([None, 2]))
    return {"n": n, "width": width, "in_rows": in_rows, "in_shards": in_shards,
            "out_rows": out_rows, "out_shards": out_shards}  # fmt: skip


@given(_cases())
@property_settings(25)
def test_map_to_zarr_equals_func_of_the_whole_array(case: dict[str, Any]) -> None:
    n, width = case["n"], case["width"]
    data = np.arange(n * width, dtype=np.int32).reshape(n, width)
    chunks = (case["in_rows"], width)
    shards = None if case["in_shards"] is None else (case["in_rows"] * case["in_shards"], width)
    x = _zarr(data, chunks, shards)
    out_chunks = case["out_rows"]
    out_shards = None
    if out_chunks is not None and case["out_shards"] is not None:
        out_shards = out_chunks * case["out_shards"]
    stats = dzb.WriteStats()
    y = dzb.map_to_zarr(_widen, x, zarr.storage.MemoryStore(), chunks=out_chunks,
                        shards=out_shards, stats=stats)  # fmt: skip
    assert y.dtype == np.float64 and y.shape == (n, 2 * width)
    np.testing.assert_array_equal(y[...], _widen(data))
    assert y.chunks[0] == (out_chunks or case["in_rows"])
    assert stats.units_written == stats.units == -(-n // (out_shards or y.chunks[0]))
    # a second run finds everything complete and calls func for nothing
    again = dzb.WriteStats()
    dzb.map_to_zarr(_widen, x, y.store, chunks=out_chunks, shards=out_shards, stats=again)
    assert (again.units_skipped, again.units_written, again.func_calls) == (stats.units, 0, 0)


def test_dict_input_dask_and_numpy(tmp_path: Path) -> None:
    import dask.array as da

    x = np.arange(60.0).reshape(20, 3)
    labels = np.arange(20)
    data = {"x": da.from_array(x, chunks=(7, 2)), "y": labels}

    def func(rows: dict[str, np.ndarray]) -> np.ndarray:
        return rows["x"].sum(axis=1) + rows["y"]

    y = dzb.map_to_zarr(func, data, tmp_path / "out.zarr", chunks=4)
    np.testing.assert_array_equal(y[:], x.sum(axis=1) + labels)
    assert y.shape == (20,) and y.chunks == (4,)


def test_wrong_number_of_rows_names_the_chunk() -> None:
    x = _zarr(np.zeros((10, 2), "f4"), (5, 2))
    with pytest.raises(dzb.WindowError, match=r"rows 5:10") as info:
        dzb.map_to_zarr(lambda r: r[:2] if r[0, 0] else r, _rows_marked(x),
                        zarr.storage.MemoryStore(), dtype="f4", sample_shape=(2,))  # fmt: skip
    assert isinstance(info.value.__cause__, dzb.ArgumentValueError)
    with pytest.raises(dzb.ArgumentValueError, match="same number of rows"):
        dzb.map_to_zarr(lambda r: r[:1], x, zarr.storage.MemoryStore())


def _rows_marked(x: zarr.Array) -> zarr.Array:
    x[5:] = 1
    return x


def test_truncated_chunk_is_written_again(tmp_path: Path) -> None:
    x = _zarr(np.arange(40.0).reshape(20, 2), (5, 2))
    out = tmp_path / "y.zarr"
    y = dzb.map_to_zarr(_widen, x, out)
    reference = y[...]
    chunk = out / "c" / "2" / "0"
    chunk.write_bytes(chunk.read_bytes()[:7])
    stats = dzb.WriteStats()
    y = dzb.map_to_zarr(_widen, x, out, stats=stats)
    assert (stats.units_written, stats.units_skipped, stats.func_calls) == (1, 3, 1)
    np.testing.assert_array_equal(y[...], reference)


def test_fingerprint_mismatch_refused(tmp_path: Path) -> None:
    x = _zarr(np.arange(40.0).reshape(20, 2), (5, 2))
    out = tmp_path / "y.zarr"
    dzb.map_to_zarr(_widen, x, out, job_id="normalise")
    with pytest.raises(dzb.ResumeMismatchError, match="job was 'normalise'"):
        dzb.map_to_zarr(_widen, x, out, job_id="embed")
    other = _zarr(np.arange(42.0).reshape(21, 2), (5, 2))
    with pytest.raises(dzb.ResumeMismatchError, match="inputs"):
        dzb.map_to_zarr(_widen, other, out, job_id="normalise")
    with pytest.raises(dzb.ArgumentValueError, match="exists"):
        dzb.map_to_zarr(_widen, x, out, job_id="normalise", resume=False)
    y = dzb.map_to_zarr(_widen, other, out, job_id="embed", overwrite=True)
    assert y.shape == (21, 4)


def test_map_to_zarr_over_chunks_zarr_left_unwritten_does_not_warn(tmp_path: Path) -> None:
    """Zarr's default write_empty_chunks=False leaves a chunk of zeros unwritten: the fill
    value, counted; one warning per chunk before the default became missing="fill"."""
    x = zarr.create_array(str(tmp_path / "zeros.zarr"), shape=(20, 2), chunks=(5, 2),
                          dtype="f4", config={"write_empty_chunks": False})  # fmt: skip
    x[:] = 0
    stats = dzb.WriteStats()
    y = dzb.map_to_zarr(lambda rows: rows + 1, x, tmp_path / "y.zarr", stats=stats)
    np.testing.assert_array_equal(y[...], np.ones((20, 2), dtype="f4"))
    assert stats.input_chunks_missing == 4 and stats.units_written == 4
    stats = dzb.WriteStats()
    dzb.write_shuffled(x, tmp_path / "s.zarr", seed=0, stats=stats)
    assert stats.input_chunks_missing == 4
    with pytest.warns(dzb.MissingChunksWarning, match="absent from the store"):
        dzb.map_to_zarr(lambda rows: rows + 1, x, tmp_path / "w.zarr", missing="warn")


_SCALE = 3.0


def _scaled(rows: np.ndarray) -> np.ndarray:
    return rows * _SCALE


class _Shift:
    def __init__(self, by: float) -> None:
        self.by = by

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        return rows + self.by


def _adder(by: float) -> Any:
    return lambda rows: rows + by


def _with_default(rows: np.ndarray, by: float = 1.0) -> np.ndarray:
    return rows + by


def _kinds(rows: np.ndarray) -> np.ndarray:
    return rows * 2 if rows.dtype.kind in {"f", "i", "u", "c"} else rows  # a frozenset constant


def test_a_changed_func_is_refused_never_reused(tmp_path: Path, monkeypatch: Any) -> None:
    """Code, constants, closures, defaults, partial arguments, an object's state, globals."""
    import functools

    x = np.arange(20.0).reshape(10, 2)
    changes = [
        (lambda rows: rows + 1, lambda rows: rows * 100),  # the README's case: code
        (lambda rows: rows + 1, lambda rows: rows + 2),  # a constant
        (_adder(1.0), _adder(2.0)),  # a closure
        (functools.partial(np.add, 1.0), functools.partial(np.add, 2.0)),
        (_Shift(1.0), _Shift(2.0)),
    ]
    for n, (before, after) in enumerate(changes):
        out = tmp_path / f"y{n}.zarr"
        dzb.map_to_zarr(before, x, out, chunks=5)
        stats = dzb.WriteStats()
        dzb.map_to_zarr(before, x, out, chunks=5, stats=stats)  # the same func resumes
        assert (stats.units_skipped, stats.func_calls) == (2, 0)
        with pytest.raises(dzb.ResumeMismatchError, match=r"func changed.*overwrite=True"):
            dzb.map_to_zarr(after, x, out, chunks=5)
        y = dzb.map_to_zarr(after, x, out, chunks=5, overwrite=True)
        np.testing.assert_array_equal(y[...], np.asarray(after(x)))
    out = tmp_path / "g.zarr"
    dzb.map_to_zarr(_scaled, x, out)
    monkeypatch.setattr(sys.modules[__name__], "_SCALE", 4.0)  # a global it uses
    with pytest.raises(dzb.ResumeMismatchError, match="func changed"):
        dzb.map_to_zarr(_scaled, x, out)
    dzb.map_to_zarr(_with_default, x, tmp_path / "d.zarr")
    monkeypatch.setattr(_with_default, "__defaults__", (2.0,))
    with pytest.raises(dzb.ResumeMismatchError, match="func changed"):
        dzb.map_to_zarr(_with_default, x, tmp_path / "d.zarr")
    # an explicit job_id names func's version (its documented meaning): trusted
    dzb.map_to_zarr(_adder(1.0), x, tmp_path / "j.zarr", job_id="add-v1")
    stats = dzb.WriteStats()
    dzb.map_to_zarr(_adder(1.0), x, tmp_path / "j.zarr", job_id="add-v1", stats=stats)
    assert stats.units_written == 0


def test_func_fingerprints_agree_across_processes() -> None:
    """A resume runs in a new process (another string hash seed): the same fingerprint."""
    import functools

    from daskzarr_batches.fingerprints import func_fingerprint

    funcs = "[_kinds, _scaled, _adder(1.0), _Shift(2.0), functools.partial(_with_default, by=3.0)]"
    paths = [str(Path(__file__).parent), str(ROOT / "tests")]  # this module, the helpers
    script = (f"import functools, sys; sys.path[:0] = {paths!r}; "
              f"from test_writes import _kinds, _scaled, _adder, "
              f"_Shift, _with_default; from daskzarr_batches.fingerprints import "
              f"func_fingerprint; print([func_fingerprint(f) for f in {funcs}])")  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": "12345"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, check=True, timeout=120)  # fmt: skip
    from test_writes import _adder as adder
    from test_writes import _kinds as kinds
    from test_writes import _scaled as scaled
    from test_writes import _Shift as shift
    from test_writes import _with_default as with_default

    here = [func_fingerprint(f) for f in [kinds, scaled, adder(1.0), shift(2.0),
            functools.partial(with_default, by=3.0)]]  # fmt: skip
    assert done.stdout.strip() == repr(here)


def test_a_func_that_cannot_be_fingerprinted_resumes_only_with_a_job_id(tmp_path: Path) -> None:
    import threading

    lock = threading.Lock()

    def locked(rows: np.ndarray) -> np.ndarray:
        with lock:
            return rows + 1

    x = np.arange(20.0).reshape(10, 2)
    with pytest.warns(UserWarning, match=r"cannot be fingerprinted.*lock.*job_id="):
        dzb.map_to_zarr(locked, x, tmp_path / "y.zarr")
    with pytest.raises(dzb.ResumeMismatchError, match=r"cannot be fingerprinted.*'lock'"):
        dzb.map_to_zarr(locked, x, tmp_path / "y.zarr")
    dzb.map_to_zarr(locked, x, tmp_path / "z.zarr", job_id="locked-v1")
    stats = dzb.WriteStats()
    dzb.map_to_zarr(locked, x, tmp_path / "z.zarr", job_id="locked-v1", stats=stats)
    assert stats.units_written == 0


def test_changed_input_contents_are_refused_never_reused(tmp_path: Path) -> None:
    """A numpy input of the same shape (with or without job_id); a Zarr input rewritten in
    place (same shape, dtype and metadata); for map_to_zarr and write_shuffled."""
    x = np.arange(20.0).reshape(10, 2)
    dzb.map_to_zarr(_widen, x, tmp_path / "y.zarr", chunks=5)
    dzb.map_to_zarr(_widen, x.copy(), tmp_path / "y.zarr", chunks=5)  # same contents resume
    dzb.map_to_zarr(_widen, x, tmp_path / "j.zarr", chunks=5, job_id="widen")
    for out, job_id in ((tmp_path / "y.zarr", None), (tmp_path / "j.zarr", "widen")):
        with pytest.raises(dzb.ResumeMismatchError, match=r"input 'array'.*changed.*overwrite"):
            dzb.map_to_zarr(_widen, x + 1, out, chunks=5, job_id=job_id)
    dzb.write_shuffled(x, tmp_path / "s.zarr", seed=1, chunks=5)
    with pytest.raises(dzb.ResumeMismatchError, match=r"input 'array'.*changed"):
        dzb.write_shuffled(x * 2, tmp_path / "s.zarr", seed=1, chunks=5)
    path = str(tmp_path / "x.zarr")
    _zarr(x, (5, 2), store=path)
    dzb.map_to_zarr(_widen, path, tmp_path / "m.zarr")
    dzb.write_shuffled({"x": path, "y": np.arange(10)}, tmp_path / "w.zarr", seed=1)
    stats = dzb.WriteStats()
    dzb.map_to_zarr(_widen, zarr.open_array(path, mode="r"), tmp_path / "m.zarr", stats=stats)
    assert stats.units_skipped == 2
    zarr.open_array(path, mode="r+")[:] = 2  # in place: shape, dtype, metadata unchanged
    with pytest.raises(dzb.ResumeMismatchError, match=r"input 'array'.*changed"):
        dzb.map_to_zarr(_widen, path, tmp_path / "m.zarr")
    with pytest.raises(dzb.ResumeMismatchError, match=r"input 'x'.*changed"):
        dzb.write_shuffled({"x": path, "y": np.arange(10)}, tmp_path / "w.zarr", seed=1)
    y = dzb.map_to_zarr(_widen, path, tmp_path / "m.zarr", overwrite=True)
    np.testing.assert_array_equal(y[...], _widen(np.full((10, 2), 2.0)))


_JOB = """
import os, sys, time
import numpy as np
import daskzarr_batches as dzb
x_path, out, log, slow = sys.argv[1:5]

def func(rows):
    with open(log, "a") as f:
        f.write(f"{int(rows[0, 0]) // 4}\\n")
    time.sleep(float(slow))
    return (rows - 100.0) / 7.0

shards = int(sys.argv[5]) if len(sys.argv) > 5 else None
dzb.map_to_zarr(func, x_path, out, job_id="job", io_concurrency=1, shards=shards)
"""


def test_sigkilled_job_resumes_to_the_same_output(tmp_path: Path) -> None:
    data = np.arange(64 * 4, dtype=np.float32).reshape(64, 4)
    x_path = tmp_path / "x.zarr"
    _zarr(data, (4, 4), store=str(x_path))  # 16 chunks, row 0 of chunk i starts at 16 * i
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(_JOB))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    reference = tmp_path / "ref.zarr"
    subprocess.run([sys.executable, str(script), str(x_path), str(reference),
                    str(tmp_path / "ref.log"), "0"], check=True, env=env, timeout=120)  # fmt: skip
    out, log = tmp_path / "out.zarr", tmp_path / "out.log"
    job = subprocess.Popen([sys.executable, str(script), str(x_path), str(out), str(log), "0.2"],
                           env=env)  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (
        not log.exists() or len(log.read_text().split()) < 9
    ):  # the probe + 8
        time.sleep(0.05)
    job.send_signal(signal.SIGKILL)
    job.wait(timeout=30)
    first = {int(c) // 4 for c in log.read_text().split()}
    assert 8 <= len(first) < 16
    written = {
        i for i in range(16) if (out / "c" / str(i) / "0").exists()
    }  # fmt: skip
    calls: list[int] = []

    def func(rows: np.ndarray) -> np.ndarray:
        calls.append(int(rows[0, 0]) // 16)
        return (rows - 100.0) / 7.0

    stats = dzb.WriteStats()
    y = dzb.map_to_zarr(func, str(x_path), out, job_id="job", stats=stats)
    expected = zarr.open_array(str(reference), mode="r")
    np.testing.assert_array_equal(y[...], expected[...])
    # only chunks not complete were computed: none of those written whole before the kill
    assert len(calls) == len(set(calls)) == stats.units_written
    assert set(calls) | written >= set(range(16))
    assert len(set(calls) & written) <= 1  # at most the chunk being written at the kill
    assert stats.units_skipped >= len(written) - 1 and stats.units_written < 16


def _tear(path: Path) -> None:
    """A torn write: the object cut short, as a writer killed mid-write leaves it."""
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def test_a_torn_shard_is_written_again(tmp_path: Path) -> None:
    """Zarr writes a shard by read-modify-write: a torn one failed every resume (checksum)."""
    x = _zarr(np.arange(200.0, dtype=np.float32).reshape(50, 4), (5, 4))
    out = tmp_path / "y.zarr"
    reference = dzb.map_to_zarr(_widen, x, out, shards=10)[...]
    _tear(out / "c" / "1" / "0")
    _tear(out / "c" / "4" / "0")  # the edge shard as well
    stats = dzb.WriteStats()
    y = dzb.map_to_zarr(_widen, x, out, shards=10, stats=stats)
    assert (stats.units_written, stats.units_skipped) == (2, 3)
    np.testing.assert_array_equal(y[...], reference)
    shuffled = dzb.write_shuffled({"x": x}, tmp_path / "s.zarr", seed=1, chunks=5, shards=10)
    reference = shuffled["x"][...]
    _tear(tmp_path / "s.zarr" / "x" / "c" / "2" / "0")
    stats = dzb.WriteStats()
    shuffled = dzb.write_shuffled({"x": x}, tmp_path / "s.zarr", seed=1, chunks=5, shards=10,
                                  stats=stats)  # fmt: skip
    assert (stats.units_written, stats.units_skipped) == (1, 4)
    np.testing.assert_array_equal(shuffled["x"][...], reference)


def test_sigkilled_sharded_job_with_a_torn_shard_resumes_bit_identical(tmp_path: Path) -> None:
    data = np.arange(64 * 4, dtype=np.float32).reshape(64, 4)
    x_path = tmp_path / "x.zarr"
    _zarr(data, (4, 4), store=str(x_path))
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(_JOB))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out, log = tmp_path / "out.zarr", tmp_path / "out.log"
    job = subprocess.Popen([sys.executable, str(script), str(x_path), str(out), str(log), "0.1",
                            "8"], env=env)  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not log.exists() or len(log.read_text().split()) < 4):
        time.sleep(0.02)
    job.send_signal(signal.SIGKILL)  # mid-run: a shard may be half written
    job.wait(timeout=30)
    shards = sorted((out / "c").iterdir(), key=lambda p: int(p.name))
    assert 0 < len(shards) < 8
    _tear(shards[0] / "0")  # and one certainly torn
    y = dzb.map_to_zarr(lambda rows: (rows - 100.0) / 7.0, str(x_path), out, job_id="job",
                        shards=8)  # fmt: skip
    reference = dzb.map_to_zarr(lambda rows: (rows - 100.0) / 7.0, str(x_path),
                                tmp_path / "ref.zarr", shards=8)  # fmt: skip
    assert y[...].tobytes() == reference[...].tobytes()


def test_write_shuffled_is_the_seeded_permutation_pairs_aligned(tmp_path: Path) -> None:
    n = 203
    x = _zarr(np.arange(n * 3, dtype=np.int64).reshape(n, 3), (16, 3), (32, 3))
    labels = np.arange(n, dtype=np.int32) * 10
    stats = dzb.WriteStats()
    out = dzb.write_shuffled((x, labels), tmp_path / "s.zarr", seed=5, memory_budget="4KiB",
                             chunks=8, stats=stats)  # fmt: skip
    xs, ys = out[0][...], out[1][...]
    order = dzb.shuffle_order(n, 5)
    assert sorted(order.tolist()) == list(range(n))
    np.testing.assert_array_equal(xs[:, 0] // 3, order)
    np.testing.assert_array_equal(ys, order * 10)  # rows aligned
    assert stats.units == stats.units_written == 26 and out[0].chunks == (8, 3)
    other = dzb.write_shuffled(labels, tmp_path / "t.zarr", seed=6)
    assert not np.array_equal(other[...], ys) and sorted(other[...]) == sorted(ys)
    again = dzb.write_shuffled(labels, tmp_path / "u.zarr", seed=5)
    np.testing.assert_array_equal(again[...], ys)
    # resume: one chunk removed, only its unit written again; another seed refused
    (tmp_path / "s.zarr" / "1" / "c" / "3").unlink()
    stats = dzb.WriteStats()
    out = dzb.write_shuffled((x, labels), tmp_path / "s.zarr", seed=5, memory_budget="4KiB",
                             chunks=8, stats=stats)  # fmt: skip
    assert (stats.units_written, stats.units_skipped) == (1, 25)
    np.testing.assert_array_equal(out[1][...], order * 10)
    with pytest.raises(dzb.ResumeMismatchError, match="seed"):
        dzb.write_shuffled((x, labels), tmp_path / "s.zarr", seed=6, chunks=8)


def test_map_to_zarr_on_a_cluster(client: Any, tmp_path: Path) -> None:
    data = np.arange(300.0).reshape(100, 3)
    x = _zarr(data, (10, 3), store=str(tmp_path / "x.zarr"))
    stats = dzb.WriteStats()
    y = dzb.map_to_zarr(_widen, x, str(tmp_path / "y.zarr"), client=client, stats=stats)
    np.testing.assert_array_equal(y[...], _widen(data))
    assert stats.units_written == 10
    s = dzb.write_shuffled(x, str(tmp_path / "s.zarr"), client=client, seed=2)
    np.testing.assert_array_equal(s[...], data[dzb.shuffle_order(100, 2)])


def test_map_to_zarr_on_a_cluster_is_one_task_a_unit_sent_in_batches(
    client: Any, tmp_path: Path
) -> None:
    """Issue 40: each unit's reads, func, write and report are one task (they were three),
    the units sent several per graph; a resume after a lost unit redoes exactly it."""
    import distributed

    data = np.arange(600.0).reshape(200, 3)
    x = _zarr(data, (10, 3), store=str(tmp_path / "x.zarr"))
    with distributed.get_task_stream(client) as tasks:
        y = dzb.map_to_zarr(_widen, x, str(tmp_path / "y.zarr"), client=client)
    np.testing.assert_array_equal(y[...], _widen(data))
    ours = [t for t in tasks.data if "dzb-" in str(t["key"])]
    assert len(ours) == 20  # one a unit
    (tmp_path / "y.zarr" / "c" / "7" / "0").unlink()
    stats = dzb.WriteStats()
    y = dzb.map_to_zarr(_widen, x, str(tmp_path / "y.zarr"), client=client, stats=stats)
    assert (stats.units_written, stats.units_skipped) == (1, 19)
    np.testing.assert_array_equal(y[...], _widen(data))


def test_cli_shuffle_writes_and_resumes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from daskzarr_batches.tools.cli import main

    group = zarr.open_group(str(tmp_path / "in.zarr"), mode="w")
    group.create_array("x", shape=(50, 2), chunks=(8, 2), dtype="f4")[:] = np.arange(100).reshape(
        50, 2
    )
    group.create_array("y", shape=(50,), chunks=(8,), dtype="i8")[:] = np.arange(50)
    argv = [str(tmp_path / "in.zarr"), str(tmp_path / "out.zarr"), "--array", "x",
            "--labels", "y", "--seed", "7", "--memory-budget", "2K"]  # fmt: skip
    assert main(["shuffle", *argv]) == 0
    # a row of chunks holds one chunk of each array: 7 rows, 14 chunks
    assert "7 of 7 rows of chunks written (14 chunks of 2 arrays)" in capsys.readouterr().out
    assert main(["shuffle", *argv]) == 0
    assert "0 of 7 rows of chunks written (0 chunks of 2 arrays), 7 already complete" in (
        capsys.readouterr().out
    )
    order = dzb.shuffle_order(50, 7)
    result = zarr.open_group(str(tmp_path / "out.zarr"), mode="r")
    np.testing.assert_array_equal(result["y"][:], order)
    np.testing.assert_array_equal(result["x"][:, 0], order * 2.0)
    assert main(["shuffle", *argv[:-4], "--seed", "8"]) == 2
    assert "its seed was 7" in capsys.readouterr().err


def test_write_shuffled_stays_within_its_memory_budget(tmp_path: Path) -> None:
    """Python-heap peak (numpy buffers included) under the budget, for 2.5x the budget of data."""
    import tracemalloc

    rows = 40_000  # 10 MiB
    x = zarr.create_array(str(tmp_path / "x.zarr"), shape=(rows, 64), chunks=(1000, 64),
                          dtype="f4")  # fmt: skip
    x[:] = np.random.default_rng(0).random((rows, 64), dtype=np.float32)
    budget = 4 * 2**20
    tracemalloc.start()
    try:
        out = dzb.write_shuffled(x, str(tmp_path / "s.zarr"), memory_budget=budget, chunks=1000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= budget, f"peak {peak / 2**20:.2f} MiB over a {budget / 2**20:.0f} MiB budget"
    np.testing.assert_array_equal(out[:100], x[:][dzb.shuffle_order(rows, 0)[:100]])


def _counted_input(tmp_path: Path, name: str) -> tuple[zarr.Array, np.ndarray, Any]:
    """A 1000 x 6 float32 array in 20 chunks behind a store counting its chunk reads."""
    from tests.stores import NamedCountingStore

    data = np.random.default_rng(3).random((1000, 6), dtype=np.float32)
    _zarr(data, (50, 6), store=str(tmp_path / "in.zarr"))
    store = NamedCountingStore(
        zarr.storage.LocalStore(str(tmp_path / "in.zarr"), read_only=True),
        f"{name}-{tmp_path.name}",
    )
    return zarr.open_array(store=store, mode="r"), data, store


def test_write_shuffled_with_a_cache_reads_each_chunk_once(tmp_path: Path) -> None:
    """A window of a tenth of the data touches every chunk: ~10 reads of each without a
    cache, one with a cache that holds the input (read amplification 1)."""
    x, data, store = _counted_input(tmp_path, "writes-cache")
    budget = data.nbytes // 5  # half for the window's samples, half for decoded chunks
    order = dzb.shuffle_order(1000, 4)
    plain = dzb.write_shuffled(x, str(tmp_path / "a.zarr"), seed=4, memory_budget=budget,
                               chunks=25)  # fmt: skip
    np.testing.assert_array_equal(plain[...], data[order])
    assert len(store.counts) == 20 and min(store.counts.values()) >= 5
    store.counts.clear()
    cache, stats = dzb.ChunkCache("64MiB"), dzb.WriteStats()
    out = dzb.write_shuffled(x, str(tmp_path / "b.zarr"), seed=4, memory_budget=budget,
                             chunks=25, cache=cache, stats=stats)  # fmt: skip
    np.testing.assert_array_equal(out[...], data[order])
    assert dict(store.counts) == {key: 1 for key in store.counts} and len(store.counts) == 20
    assert stats.cache_misses == 20 and stats.cache_hits > 20 * 4
    store.counts.clear()  # map_to_zarr reads through the same cache: nothing from the store
    y = dzb.map_to_zarr(_widen, x, str(tmp_path / "m.zarr"), cache=cache, stats=stats)
    np.testing.assert_array_equal(y[...], _widen(data))
    assert dict(store.counts) == {}


def test_write_shuffled_with_a_cache_on_a_cluster(client: Any, tmp_path: Path) -> None:
    from tests.scheduler_state import our_tasks

    x, data, store = _counted_input(tmp_path, "writes-cache-cluster")
    cache, stats = dzb.ChunkCache("64MiB"), dzb.WriteStats()
    out = dzb.write_shuffled(x, str(tmp_path / "s.zarr"), seed=2, memory_budget=data.nbytes // 5,
                             chunks=25, cache=cache, client=client, stats=stats)  # fmt: skip
    np.testing.assert_array_equal(out[...], data[dzb.shuffle_order(1000, 2)])
    assert dict(store.counts) == {key: 1 for key in store.counts} and len(store.counts) == 20
    assert stats.cache_misses == 20 and stats.cache_hits > 20
    cache.clear()
    assert our_tasks(client) == []


def test_cli_shuffle_reads_a_url_store_with_storage_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--storage-option`` and ``--backend`` reach the opening of STORE, as for info/bench."""
    pytest.importorskip("fsspec")
    from daskzarr_batches.tools.cli import main

    url = f"memory://shuffle-{tmp_path.name}/in.zarr"
    group = zarr.open_group(url, mode="w")
    group.create_array("x", shape=(30, 2), chunks=(8, 2), dtype="i8")[:] = np.arange(60).reshape(
        30, 2
    )
    seen: list[dict[str, Any]] = []
    from_url = zarr.storage.FsspecStore.from_url

    def recording(url: str, **kwargs: Any) -> Any:
        seen.append({"url": url, **kwargs})
        return from_url(url, **kwargs)

    monkeypatch.setattr(zarr.storage.FsspecStore, "from_url", staticmethod(recording))
    argv = ["shuffle", url, str(tmp_path / "out.zarr"), "--array", "x", "--seed", "3",
            "--backend", "fsspec", "--storage-option", "skip_instance_cache=true"]  # fmt: skip
    assert main(argv) == 0
    assert "4 of 4 rows of chunks written (4 chunks of 1 array)" in capsys.readouterr().out
    assert seen and all(s["storage_options"] == {"skip_instance_cache": True} for s in seen)
    result = zarr.open_group(str(tmp_path / "out.zarr"), mode="r")
    np.testing.assert_array_equal(result["x"][:, 0], dzb.shuffle_order(30, 3) * 2)
    local = ["shuffle", str(tmp_path / "out.zarr"), str(tmp_path / "o.zarr"), "--array", "x"]
    assert main([*local, "--storage-option", "a=1"]) == 2
    assert "storage_options" in capsys.readouterr().err  # a local STORE takes none
