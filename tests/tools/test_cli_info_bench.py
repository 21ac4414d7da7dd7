"""``daskzarr-batches info`` and ``bench``: tables, JSON, checks, errors, bars."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

import daskzarr_batches as dzb
from daskzarr_batches.store.layout import object_keys
from daskzarr_batches.tools import cli as _cli
from daskzarr_batches.tools.cli import main

ROOT = Path(__file__).resolve().parents[2]
#: A generated bench dataset small enough for a test: 2,000 x 4 in 256-row chunks.
SMALL = ["--rows", "2000", "--features", "4", "--chunk-rows", "256"]


def make_group(path: Path) -> Path:
    """A v3 group holding a v3 array, a v2 array and a sharded v3 array in a subgroup.

    Every value is non-zero, so every chunk is stored (Zarr skips chunks that
    hold only the fill value).
    """
    root = zarr.open_group(str(path), mode="w")
    v3 = root.create_array("v3", shape=(10, 4), chunks=(4, 4), dtype="f4")
    v3[:] = np.arange(1, 41, dtype=np.float32).reshape(10, 4)
    sharded = root.create_array(
        "sub/sharded", shape=(20, 3), chunks=(2, 3), shards=(8, 3), dtype="i8"
    )
    sharded[:] = np.arange(1, 61).reshape(20, 3)
    v2 = zarr.create_array(
        store=str(path / "v2"), shape=(10,), chunks=(4,), dtype="f8", zarr_format=2
    )
    v2[:] = np.arange(1, 11, dtype=np.float64)
    return path


def make_training_store(path: Path, n: int = 1000) -> Path:
    root = zarr.open_group(str(path), mode="w")
    x = root.create_array("features", shape=(n, 3), chunks=(128, 3), dtype="f4")
    y = root.create_array("labels", shape=(n,), chunks=(100,), dtype="i8")
    x[:] = np.arange(1, 3 * n + 1, dtype=np.float32).reshape(n, 3)
    y[:] = np.arange(1, n + 1)
    return path


def rows_by_path(out: str) -> dict[str, str]:
    """Table lines of ``info`` by their first column."""
    return {line.split()[0]: line for line in out.splitlines()[2:] if line.strip()}


def assert_one_line_error(err: str) -> None:
    assert err.startswith("daskzarr-batches: error: "), err
    assert err.count("\n") == 1, err
    assert "Traceback" not in err


# --------------------------------------------------------------------------
# info


def test_info_lists_every_array_with_shards_codecs_and_counts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = make_group(tmp_path / "g.zarr")
    (store / "v3" / "c" / "1" / "0").unlink()
    assert main(["info", str(store)]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert out.splitlines()[0] == f"{store}: a Zarr group with 3 arrays"
    assert out.splitlines()[1].split() == [
        "path",
        "zarr",
        "shape",
        "dtype",
        "chunks",
        "shards",
        "codecs",
        "stored/expected",
        "stored",
        "decoded",
    ]
    rows = rows_by_path(out)
    assert set(rows) == {"sub/sharded", "v2", "v3", "total"}
    sharded, v2, v3 = (rows[p].split("  ") for p in ("sub/sharded", "v2", "v3"))
    sharded, v2, v3 = ([cell.strip() for cell in row if cell.strip()] for row in (sharded, v2, v3))
    assert sharded[1:8] == [
        "v3",
        "(20, 3)",
        "int64",
        "(2, 3)",
        "(8, 3): 4 chunks",
        "bytes, zstd",
        "3/3 shards",
    ]
    assert v2[1:8] == ["v2", "(10,)", "float64", "(4,)", "-", "zstd", "3/3 chunks"]
    assert v3[1:8] == ["v3", "(10, 4)", "float32", "(4, 4)", "-", "bytes, zstd", "2/3 chunks"]
    assert v3[9] == "160 B"  # decoded: 10 x 4 float32


def test_info_json_has_every_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = make_group(tmp_path / "g.zarr")
    (store / "sub" / "sharded" / "c" / "0" / "0").unlink()
    assert main(["info", str(store), "--json"]) == 0
    reports = {report["path"]: report for report in json.loads(capsys.readouterr().out)}
    assert list(reports) == ["sub/sharded", "v2", "v3"]
    sharded = reports["sub/sharded"]
    assert sharded["shards"] == {"shape": [8, 3], "chunks_per_shard": 4}
    assert (sharded["stored_objects"], sharded["expected_objects"]) == (2, 3)
    assert sharded["object"] == "shard"
    assert sharded["absent"] == ["c/0/0"]
    assert reports["v2"]["zarr_format"] == 2
    assert reports["v2"]["codecs"] == ["zstd"]
    assert reports["v3"]["codecs"] == ["bytes", "zstd"]
    assert reports["v3"]["shards"] is None
    assert "corrupt" not in reports["v3"]  # only with --check
    for path, report in reports.items():
        array = zarr.open_array(str(store / path), mode="r")
        assert report["stored_bytes"] == array.nbytes_stored()
        assert report["nbytes"] == array.nbytes
        assert report["shape"] == list(array.shape)


def test_info_check_names_absent_and_corrupt_chunks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = make_group(tmp_path / "g.zarr")
    (store / "v3" / "c" / "1" / "0").unlink()
    (store / "v2" / "1").write_bytes(b"not a zstd frame" * 3)
    (store / "sub" / "sharded" / "c" / "2" / "0").write_bytes(b"garbage!" * 9)
    assert main(["info", str(store), "--check"]) == 1
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert "absent   v3  chunk c/1/0" in lines
    assert any(line.startswith("corrupt  v2  chunk 1: ") for line in lines)
    assert any(line.startswith("corrupt  sub/sharded  shard c/2/0: ") for line in lines)
    assert "check: read 5 chunks and 3 shards of 3 arrays: 2 corrupt, 1 absent" in lines
    assert main(["info", str(store), "--check", "--json"]) == 1
    reports = {report["path"]: report for report in json.loads(capsys.readouterr().out)}
    assert reports["v3"]["absent"] == ["c/1/0"] and reports["v3"]["corrupt"] == []
    assert [c["key"] for c in reports["v2"]["corrupt"]] == ["1"]
    assert [c["key"] for c in reports["sub/sharded"]["corrupt"]] == ["c/2/0"]
    assert "checksum" in reports["sub/sharded"]["corrupt"][0]["error"]


def test_info_check_of_a_sound_store_exits_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = make_group(tmp_path / "g.zarr")
    assert main(["info", str(store), "--check"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == (
        "check: read 6 chunks and 3 shards of 3 arrays: all decode, none absent"
    )


def test_info_check_of_chunks_zarr_left_unwritten_exits_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Zarr's default write_empty_chunks=False: absent chunks are the fill value, not errors."""
    path = tmp_path / "zeros.zarr"
    zarr.create_array(str(path), shape=(12, 2), chunks=(4, 2), dtype="f4",
                      config={"write_empty_chunks": False})[:] = 0  # fmt: skip
    assert not (path / "c").exists()  # nothing stored: all three chunks absent
    assert main(["info", str(path), "--check"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line for line in lines if line.startswith("absent")] == [
        f"absent   /  chunk c/{i}/0" for i in range(3)
    ]
    assert lines[-2] == "check: read 0 chunks of 1 array: all decode, 3 absent"
    assert lines[-1].startswith("note: an absent chunk reads as the fill value")
    assert main(["info", str(path), "--check", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["absent"] == ["c/0/0", "c/1/0", "c/2/0"]


def test_info_on_a_single_array_and_a_zip_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    array = zarr.create_array(str(tmp_path / "a.zarr"), shape=(5,), chunks=(2,), dtype="u1")
    array[:] = 1
    assert main(["info", str(tmp_path / "a.zarr"), "--check"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].endswith(": a single Zarr array")
    assert rows_by_path(out)["/"].split()[1:3] == ["v3", "(5,)"]
    zipped = zarr.storage.ZipStore(tmp_path / "d.zip", mode="w")
    root = zarr.group(store=zipped)
    root.create_array("x", shape=(4, 2), chunks=(2, 2), dtype="f4")[:] = 2.0
    zipped.close()
    assert main(["info", str(tmp_path / "d.zip"), "--json", "--check"]) == 0
    (report,) = json.loads(capsys.readouterr().out)
    assert (report["path"], report["stored_objects"], report["corrupt"]) == ("x", 2, [])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["info", "{tmp}/missing.zarr"], "no Zarr array or group at"),
        (["info", "{tmp}"], "no Zarr array or group at"),
        (["info", "{tmp}/file.txt"], "is a file but not a zip file"),
        (["info", "{tmp}", "--storage-option", "anon=true"], "applies to URLs"),
    ],
)
def test_info_errors_are_one_line_with_status_2(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file.txt").write_text("hello")
    assert main([arg.format(tmp=tmp_path) for arg in argv]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert_one_line_error(err)
    assert message in err


def test_info_error_as_a_process_has_no_traceback(tmp_path: Path) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    result = subprocess.run(
        [
            sys.executable,
            "-W",
            "error",
            "-m",
            "daskzarr_batches",
            "info",
            str(tmp_path / "missing.zarr"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert_one_line_error(result.stderr)
    assert "missing.zarr" in result.stderr


# --------------------------------------------------------------------------
# bench


def test_bench_without_a_store_generates_data_and_prints_the_summary(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["bench", "--batch-size", "64", "--epochs", "2", *SMALL]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    lines = out.splitlines()
    assert lines[0].startswith("data:         generated 2,000 x 4 float32 features + int64 labels")
    assert "stream:       paired_batch_stream(batch_size=64), 32 batches per epoch" in lines
    assert "computing on: local threaded scheduler" in lines
    table = lines[lines.index("") + 1 :]
    assert table[0].split() == [
        "epoch",
        "batches",
        "samples",
        "seconds",
        "samples/s",
        "MB/s",
        "cpu-s/GB",
        "read",
        "amp",
        "wait",
        "first",
        "batch",
    ]
    assert all(row.endswith(" ms") for row in table[1:4])  # time to first batch
    assert [row.split()[:3] for row in table[1:4]] == [
        ["0", "32", "2,000"],
        ["1", "32", "2,000"],
        ["total", "64", "4,000"],
    ]
    assert all(float(row.split()[6]) > 0 for row in table[1:4])  # cpu-s/GB
    assert all(row.split()[7] == "1.00" for row in table[1:4])
    # two epochs: the spread of their wall times; what the CPU counts
    assert lines[-3].startswith("epoch seconds: min ") and "x the fastest)" in lines[-3]
    assert lines[-4].startswith("bottleneck: ") and "change: " in lines[-4]
    assert lines[-2] == (
        "cpu-s/GB:     CPU seconds of this process (all threads) per GB handed out"
    )
    assert lines[-1] == "counters: retries=0 chunks_missing=0 skipped=0"


def test_bench_json_has_throughput_and_read_amplification(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["bench", "--batch-size", "100", "--exact", "--seed", "3", "--json", *SMALL]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["stream"]["function"] == "paired_shuffled_batch_stream"
    assert summary["stream"]["shuffle"] == "exact"
    assert summary["stream"]["seed"] == 3
    assert summary["data"]["store"] is None
    assert summary["data"]["features"]["shape"] == [2000, 4]
    (epoch,) = summary["epochs"]
    total = summary["total"]
    for record in (epoch, total):
        assert record["samples"] == 2000
        assert record["samples_per_second"] > 0
        assert record["mb_per_second"] > 0
        assert record["read_amplification"] == pytest.approx(1.0)  # all fits the budget
        assert 0 <= record["wait_share"] <= 1
        assert (record["retries"], record["chunks_missing"], record["skipped"]) == (0, 0, [])
        assert 0 < record["time_to_first_batch"] < record["seconds"]
        assert record["cpu_seconds"] > 0
        assert record["cpu_s_per_gb"] == pytest.approx(
            record["cpu_seconds"] / (record["bytes_yielded"] / 1e9)
        )
    assert epoch["bytes_yielded"] == 2000 * (4 * 4 + 8)
    assert summary["cpu_of"] == "this process"
    assert summary["spread"] is None  # one epoch: no spread


def test_bench_on_a_client_counts_the_workers_cpu_once(client: Any) -> None:
    """The in-process workers share this process: their CPU is not counted twice."""
    from daskzarr_batches.tools import bench
    from daskzarr_batches.tools.bench import BenchSettings, run_bench

    out = io.StringIO()
    settings = BenchSettings(batch_size=64, epochs=2, client=client)
    summary = run_bench(out, settings, rows=1024, features=4, chunk_rows=256, as_json=True)
    assert summary["cpu_of"] == "this process and the client's workers"
    assert all(e["cpu_seconds"] > 0 for e in summary["epochs"])
    assert summary["spread"]["min"] <= summary["spread"]["median"] <= summary["spread"]["max"]

    class Workers:  # two in this process, two threads of another worker process
        def run(self, function: Any) -> dict[str, Any]:
            return {"a": (os.getpid(), 100.0), "b": (os.getpid(), 100.0),
                    "c": (-1, 5.0), "d": (-1, 5.0)}  # fmt: skip

    before = bench._cpu_now(None)
    assert before <= bench._cpu_now(Workers()) - 5.0 <= bench._cpu_now(None)


def test_bench_on_a_store_with_labels_and_a_shuffle_buffer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = make_training_store(tmp_path / "t.zarr")
    argv = ["bench", str(store), "--array", "features", "--labels", "labels"]
    argv += ["--batch-size", "64", "--shuffle-buffer", "300", "--epochs", "2", "--json"]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["stream"]["call"] == (
        "paired_shuffled_batch_stream(batch_size=64, shuffle_buffer_size=300, seed=0)"
    )
    assert summary["data"]["labels"] == {
        "path": "labels",
        "shape": [1000],
        "dtype": "int64",
        "chunks": [100],
    }
    assert [e["samples"] for e in summary["epochs"]] == [1000, 1000]
    assert [e["batches"] for e in summary["epochs"]] == [16, 16]
    assert summary["total"]["samples"] == 2000
    # Chunk boundaries of features (128) and labels (100) rarely meet: some re-reads.
    x = dzb.open_array(store, "features")
    y = dzb.open_array(store, "labels")
    plan = dzb.plan_epoch(x, 64, labels=y, shuffle=True, seed=0, shuffle_buffer_size=300)
    assert summary["epochs"][0]["read_amplification"] == pytest.approx(plan.read_amplification)


def test_bench_exact_shuffle_reports_the_planned_read_amplification(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = make_training_store(tmp_path / "t.zarr")
    argv = ["bench", str(store), "--array", "features", "--batch-size", "50"]
    assert main([*argv, "--exact", "--memory-budget", "3K", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    x = dzb.open_array(store, "features")
    plan = dzb.plan_epoch(x, 50, shuffle=True, seed=1, memory_budget=3 * 1024)
    assert plan.read_amplification > 1
    assert "shuffled_batch_stream(batch_size=50, memory_budget=3072, seed=1)" in out
    total = next(line for line in out.splitlines() if line.startswith("total"))
    assert total.split()[7] == f"{plan.read_amplification:.2f}"
    assert main(argv) == 0  # sequential, one array
    assert "stream:       batch_stream(batch_size=50), 20 batches per epoch" in (
        capsys.readouterr().out
    )


def test_bench_counts_missing_and_skipped_chunks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = make_training_store(tmp_path / "t.zarr", n=400)  # 4 chunks of features
    keys = sorted(p for p in (store / "features" / "c").rglob("*") if p.is_file())
    keys[0].unlink()  # one chunk missing
    keys[1].write_bytes(b"garbage")  # one chunk that does not decode
    argv = ["bench", str(store), "--array", "features", "--batch-size", "8", "--json"]
    with pytest.warns(dzb.SkippedChunksWarning):
        assert main([*argv, "--missing", "fill", "--on-error", "skip"]) == 0
    total = json.loads(capsys.readouterr().out)["total"]
    assert total["chunks_missing"] == 1 and len(total["skipped"]) == 1
    assert total["retries"] == 0
    assert main([*argv, "--missing", "error"]) == 2
    assert "is missing from the store" in capsys.readouterr().err


def test_bench_reports_missing_chunks_as_one_line_in_its_own_words(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = make_training_store(tmp_path / "t.zarr", n=400)  # 4 chunks of features
    for chunk in (1, 2):
        (store / "features" / "c" / str(chunk) / "0").unlink()
    argv = ["bench", str(store), "--array", "features", "--batch-size", "8", "--exact"]
    assert main([*argv, "--epochs", "2", "--json", "--missing", "warn"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["total"]["chunks_missing"] == 4  # 2 per epoch, each counted once
    assert err.count("\n") == 1, err
    assert err.startswith(
        "daskzarr-batches: warning: 2 chunks were missing from the store in each epoch and "
        "read as the fill value (first: 'features/c/"
    ), err
    assert "--missing fill (the default)" in err and "--missing error" in err
    assert "missing='fill'" not in err and "Warning" not in err
    assert main([*argv, "--json"]) == 0  # the default: the fill value, counted, silently
    out, err = capsys.readouterr()
    assert err == "" and json.loads(out)["total"]["chunks_missing"] == 2


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--batch-size", "0", *SMALL], "batch_size must be a positive integer, got 0"),
        (["--batch-size", "8", "--shuffle-buffer", "0", *SMALL], "shuffle_buffer_size"),
        (["{store}", "--array", "nope", "--batch-size", "8"], "no array at path 'nope'"),
        (["{store}", "--batch-size", "8"], "is a group; pass --array to choose"),
        (["{store}", "--array", "features", "--labels", "x", "--batch-size", "8"], "'x'"),
    ],
)
def test_bench_library_errors_are_one_line_with_status_2(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = make_training_store(tmp_path / "t.zarr", n=10)
    assert main(["bench", *(arg.format(store=store) for arg in argv)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert_one_line_error(err)
    assert message in err


def test_bench_with_a_cache_reads_later_epochs_and_runs_from_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = make_training_store(tmp_path / "t.zarr")
    argv = ["bench", str(store), "--array", "features", "--batch-size", "64", "--epochs", "2"]
    argv += ["--cache-dir", str(tmp_path / "cache")]
    assert main([*argv, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["stream"]["cache"] == {
        "memory": 2**30, "directory": str(tmp_path / "cache"), "disk": None
    }  # fmt: skip
    first, second = summary["epochs"]
    chunks = first["cache_misses"]
    assert chunks > 0 and first["cache_hits"] == 0 and first["bytes_from_cache"] == 0
    assert (second["cache_hits"], second["cache_misses"]) == (chunks, 0)
    assert second["bytes_from_cache"] == chunks * 128 * 3 * 4  # decoded chunks (edge: whole)
    assert summary["total"]["cache_hits"] == chunks
    # a new run (a new cache over the directory, memory 0): every chunk from the files
    assert main([*argv, "--cache-memory", "0"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(
        line.startswith("cache:        ChunkCache, memory 0 bytes, directory") for line in lines
    )
    table = lines[lines.index("") + 1 :]
    assert table[0].split()[-5:] == ["cache", "hits", "MB", "from", "cache"]
    assert [row.split()[-2] for row in table[1:4]] == [f"{chunks}/{chunks}"] * 2 + [
        f"{2 * chunks}/{2 * chunks}"
    ]
    assert main(["bench", "--batch-size", "64", "--json", *SMALL]) == 0  # no cache: no columns
    assert "cache_hits" not in json.loads(capsys.readouterr().out)["total"]


def test_bench_names_a_bad_cache_size(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--batch-size", "8", "--cache-memory", "lots", *SMALL]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert_one_line_error(err)
    assert "memory='lots'" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "the following arguments are required: --batch-size"),
        (["--batch-size", "4", "--array", "x"], "--array names an array in STORE"),
        (["--batch-size", "4", "--seed", "1"], "--seed seeds a shuffle"),
        (["--batch-size", "4", "--memory-budget", "1M"], "it needs --exact"),
        (["--batch-size", "4", "--shuffle-buffer", "9", "--exact"], "not allowed with"),
        (["--batch-size", "4", "--exact", "--memory-budget", "lots"], "expected a size"),
        (["--batch-size", "4", "--epochs", "0"], "expected a positive integer"),
        (["--batch-size", "4", "--storage-option", "novalue"], "expected KEY=VALUE"),
        (["--batch-size", "4", "--backend", "fsspec"], "--backend needs a STORE"),
        (["s.zarr", "--batch-size", "4", "--rows", "10"], "cannot go with STORE"),
    ],
)
def test_bench_usage_errors_exit_with_status_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["bench", *argv])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "usage: daskzarr-batches bench" in err
    assert message in err


# --------------------------------------------------------------------------
# options and progress bars


class FakeTerminal(io.StringIO):
    """A stderr that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def test_bars_go_to_a_terminal_unless_quiet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    store = make_group(tmp_path / "g.zarr")
    terminal = FakeTerminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setattr("daskzarr_batches.tools.bench.POSTFIX_INTERVAL", 0.0)
    assert main(["bench", "--batch-size", "16", *SMALL]) == 0
    bars = terminal.getvalue()
    assert "epoch 0" in bars and "samples/s" in bars and "MB/s" in bars and "wait" in bars
    assert main(["info", str(store), "--check"]) == 0
    assert "checking" in terminal.getvalue()[len(bars) :]
    capsys.readouterr()
    terminal.seek(0)
    terminal.truncate()
    assert main(["bench", "--batch-size", "16", "--quiet", *SMALL]) == 0
    assert main(["info", str(store), "--check", "-q"]) == 0
    assert terminal.getvalue() == ""


def test_storage_options_and_sizes_parse() -> None:
    assert _cli._key_value("anon=true") == ("anon", True)
    assert _cli._key_value("endpoint_url=http://x:9000") == ("endpoint_url", "http://x:9000")
    assert _cli._key_value('client_kwargs={"region_name": "eu"}') == (
        "client_kwargs",
        {"region_name": "eu"},
    )
    assert _cli._key_value("token=") == ("token", "")
    assert [_cli._size(t) for t in ("100", "2K", "3MiB", "1G", "5 mb")] == [
        100,
        2048,
        3 * 2**20,
        2**30,
        5 * 2**20,
    ]


def test_options_reach_fsspec(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def from_url(url: str, storage_options: Any = None, read_only: bool = False) -> Any:
        seen.update(url=url, storage_options=storage_options, read_only=read_only)
        raise ValueError("stop here")

    monkeypatch.setattr(zarr.storage.FsspecStore, "from_url", staticmethod(from_url))
    argv = ["info", "memory://x.zarr", "--storage-option", "anon=true"]
    assert main([*argv, "--storage-option", "n=3"]) == 2
    assert seen == {
        "url": "memory://x.zarr",
        "storage_options": {"anon": True, "n": 3},
        "read_only": True,
    }


@pytest.mark.parametrize("block_bytes", [1, 100, 2**20])
def test_check_by_blocks_names_the_same_chunks(tmp_path: Path, block_bytes: int) -> None:
    from daskzarr_batches.tools import check as _check
    from daskzarr_batches.tools import info as _info

    store_path = make_group(tmp_path / "g.zarr")
    (store_path / "v2" / "2").write_bytes(b"\x00" * 7)
    (store_path / "v3" / "c" / "0" / "0").write_bytes(b"\x00" * 7)
    (store_path / "v3" / "c" / "1" / "0").unlink()
    store = _info.open_store(str(store_path), None)
    arrays = _info.find_arrays(store, str(store_path))
    reports = [_info.describe_array(array, path, store) for path, array in arrays]
    _check.check_arrays(arrays, reports, threads=1, block_bytes=block_bytes)
    assert [(r.path, [key for key, _ in r.corrupt], r.absent) for r in reports] == [
        ("sub/sharded", [], []),
        ("v2", ["2"], []),
        ("v3", ["c/0/0"], ["c/1/0"]),
    ]
    assert all(r.checked for r in reports)


def test_blocks_tile_the_object_grid() -> None:
    from daskzarr_batches.tools import check as _check

    array = zarr.create_array(zarr.storage.MemoryStore(), shape=(10, 6), chunks=(2, 3), dtype="f4")
    # 5 x 2 chunks of 24 bytes
    for block_bytes, regions in [
        (24, 10),  # one chunk per block
        (48, 5),  # a row of chunks
        (120, 3),  # two rows: rows 0-1, 2-3, 4
    ]:
        blocks = list(_check._object_blocks(array, block_bytes))
        assert len(blocks) == regions
        keys = [key for _, objects in blocks for key, _ in objects]
        assert sorted(keys) == sorted(object_keys(array))
    region, objects = blocks[-1]
    assert region == (slice(8, 10), slice(0, 6))
    assert [key for key, _ in objects] == ["c/4/0", "c/4/1"]


def test_backend_reaches_open(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("obstore")
    argv = ["info", "s3://bucket/x.zarr", "--backend", "obstore", "--storage-option", "bogus=1"]
    assert main(argv) == 2  # obstore's backend names the key it cannot use; nothing is sent
    assert "'bogus'" in capsys.readouterr().err
