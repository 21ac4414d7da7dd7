"""The ``daskzarr-batches demo`` command: in-process, as ``python -m``, on a cluster."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from daskzarr_batches.tools import cli as _cli
from daskzarr_batches.tools.cli import main

ROOT = Path(__file__).resolve().parents[2]


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines()]


def check_demo_output(text: str) -> None:
    """The lines that carry the demo's three views of the example."""
    lines = _lines(text)
    chunks = [line for line in lines if line.startswith("chunk (")]
    assert chunks == [
        "chunk (0, 0): shape (4, 4)  rows 0..3",
        "chunk (1, 0): shape (4, 4)  rows 4..7",
        "chunk (2, 0): shape (2, 4)  rows 8..9  (edge chunk, cropped to the array)",
    ]
    batches = [line for line in lines if re.match(r"batch \d: shape", line)]
    assert batches == [
        "batch 0: shape (3, 4)  rows 0..2  inside chunk 0",
        "batch 1: shape (3, 4)  rows 3..5  crosses the chunk boundary at row 4 (chunks 0 and 1)",
        "batch 2: shape (3, 4)  rows 6..8  crosses the chunk boundary at row 8 (chunks 1 and 2)",
    ]
    assert "10 samples // 3 = 3 batches; drop_remainder left out rows [9]" in lines
    pairs = [line for line in lines if re.match(r"batch \d: features", line)]
    assert pairs == [
        "batch 0: features (4, 4) / labels (4,)",
        "batch 1: features (4, 4) / labels (4,)",
        "batch 2: features (2, 4) / labels (2,)",
    ]
    # Every printed feature row sits next to its own label, and all 10 appear once.
    shown = [
        (float(match[1]), float(match[2]))
        for line in lines
        if (match := re.match(r"features \[\s*([\d.]+) .*\]  ->  label ([\d.]+)$", line))
    ]
    assert sorted(label for _, label in shown) == [float(i) for i in range(10)]
    assert all(first == 4 * label for first, label in shown)
    assert lines.count("every feature row sits next to its own label: True") == 2
    stats = [line for line in lines if line.startswith("stats: ")]
    assert stats[0] == (
        "stats: chunks_read=3 bytes_read=160 bytes_yielded=160 "
        "read_amplification=1.00 windows_read=3"
    )
    assert len(stats) == 4
    assert all("read_amplification=1.00" in line for line in stats[2:])


def test_demo_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo"]) == 0
    captured = capsys.readouterr()
    check_demo_output(captured.out)
    assert "computing on: local threaded scheduler" in captured.out
    assert captured.err == ""


def test_demo_output_is_deterministic(capsys: pytest.CaptureFixture[str]) -> None:
    main(["demo"])
    first = capsys.readouterr().out
    main(["demo"])
    assert capsys.readouterr().out == first


def test_demo_as_module() -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    result = subprocess.run(
        [sys.executable, "-W", "error", "-m", "daskzarr_batches", "demo"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    check_demo_output(result.stdout)


@pytest.mark.timeout(120)
def test_demo_on_a_local_cluster_matches_the_local_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["demo"]) == 0
    local = capsys.readouterr().out
    assert main(["demo", "--local-cluster", "2"]) == 0
    on_cluster = capsys.readouterr().out
    check_demo_output(on_cluster)
    assert "computing on: LocalCluster of 2 process workers on 127.0.0.1" in on_cluster
    # Same seeds, same bytes: only the "computing on" line differs.
    differ = [
        (a, b) for a, b in zip(local.splitlines(), on_cluster.splitlines(), strict=True) if a != b
    ]
    assert [a for a, _ in differ] == ["computing on: local threaded scheduler"]


def test_unreachable_scheduler_is_a_clear_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    monkeypatch.setattr(_cli, "CONNECT_TIMEOUT", 2.0)  # distributed retries until then
    with socket.socket() as sock:  # a loopback port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert main(["demo", "--scheduler", f"tcp://127.0.0.1:{port}"]) == 1
    err = capsys.readouterr().err
    assert f"could not connect to the scheduler at 'tcp://127.0.0.1:{port}'" in err


@pytest.mark.parametrize(
    "argv",
    [[], ["demo", "--local-cluster", "0"], ["demo", "--local-cluster", "two"], ["nope"]],
)
def test_bad_arguments_exit_with_status_2(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert "usage: daskzarr-batches" in capsys.readouterr().err


def test_scheduler_and_local_cluster_exclude_each_other(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["demo", "--scheduler", "tcp://127.0.0.1:1", "--local-cluster", "1"])
    assert "not allowed with argument" in capsys.readouterr().err


@pytest.mark.timeout(120)
def test_demo_on_an_existing_scheduler(capsys: pytest.CaptureFixture[str]) -> None:
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(
        n_workers=1,
        threads_per_worker=2,
        processes=False,
        protocol="tcp",
        host="127.0.0.1",
        dashboard_address=":0",  # never 8787: another cluster may hold it
    ) as cluster:
        assert main(["demo", "--scheduler", cluster.scheduler_address]) == 0
    out = capsys.readouterr().out
    check_demo_output(out)
    assert f"computing on: distributed scheduler {cluster.scheduler_address} (1 worker)" in out
