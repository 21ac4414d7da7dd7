"""The benchmark suite runs end to end in quick mode on a tiny dataset, as a module."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.suite.stores_cases import SUBSET_CHUNKS

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(240)
def test_benchmark_quick_mode(tmp_path: Path) -> None:
    for peer in ("xbatcher", "torch"):
        if importlib.util.find_spec(peer) is None:
            print(f"{peer} is not installed: the benchmark skips it (pip install .[bench])")
    command = [
        sys.executable, "-m", "benchmarks",
        "--quick",
        "--rows", "16384",
        "--cols", "16",
        "--chunk-rows", "1024",
        "--rounds", "1",
        "--out", str(tmp_path / "results"),
        "--data", str(tmp_path / "data"),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=220, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for line in done.stdout.splitlines():
        if "skipping" in line:
            print(line)
    report = (tmp_path / "results" / "results.md").read_text()
    assert "`python -m benchmarks --quick --rows 16384 --cols 16 --chunk-rows 1024`" in report
    assert "| L0: zarr chunk-aligned, 1 thread |" in report
    assert "sequential, batch 256" in report and "exact shuffle" in report
    assert "## Targets" in report and ("PASS" in report or "MISS" in report)
    assert "## Shuffle quality" in report
    # issue 20: cpu-s/GB over the raw-decode floor and the spread of every case, the CPU
    # cases (zarrs, zarr's pipeline, pinned to one core) and their targets
    assert "| cpu-s/GB | x floor | wall s min / med / max |" in report
    assert "\n\n## CPU per GB (issue 20)\n" in report
    assert "| [pinned to 1 core] sequential, batch 256 (zarr's pipeline) |" in report
    assert "| pinned to one core: sequential (zarr's pipeline) >= 1.0x L0 (medians) |" in report
    # issue 10: sharded, latency, loopback S3 and codec-pipeline cases with their targets
    for case in (
        "[sharded (8 chunks/shard)] sequential",
        f"[unsharded, 100 ms, {SUBSET_CHUNKS} chunks] chunk_",
        f"[S3 loopback, {SUBSET_CHUNKS} chunks] zarr x[:]",
        "[zarrs codec pipeline] sequential",
    ):
        assert f"| {case}" in report, case
    assert "| sharded sequential >= 1.0x unsharded (no latency) |" in report
    assert (tmp_path / "results" / "throughput.png").stat().st_size > 1000
    assert "ratios vs L0" in done.stdout


@pytest.mark.timeout(240)
def test_the_standalone_benchmarks_run_at_a_tiny_size(tmp_path: Path) -> None:
    """The quick ones, in one process, so none of them rots (the others: docs/benchmarks.md)."""
    command = [
        sys.executable, "-m", "benchmarks",
        "--only", "latency,shards,ramp-latency,codec-pipelines,compare,big-samples,cpu-profile",
        "--old", "HEAD",
        "--rows", "8192",
        "--cols", "8",
        "--chunk-rows", "1024",
        "--latency", "0.002",
        "--rounds", "1",
        "--data", str(tmp_path / "data"),
        "--fields", "64",
        "--out", str(tmp_path / "results"),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=220, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    names = ("latency", "shards", "ramp-latency", "codec-pipelines", "compare", "big-samples")
    for name in (*names, "cpu-profile"):
        assert f"== {name} ==" in done.stdout
    assert "| old: chunk_stream ordered |" in done.stdout  # latency --old: both libraries
    assert "| 2 ms | sequential |" in done.stdout  # shards, with latency
    assert "buffered, flat" in done.stdout  # ramp-latency
    assert "x[:] (zarrs)" in done.stdout  # codec-pipelines
    assert "| paired, buffered (8 chunks) |" in done.stdout  # compare
    big = (tmp_path / "results" / "big_samples.md").read_text()  # big-samples, 64 fields
    assert "| 32 |" in big and "| fields, 32/chunk: exact shuffle" in big
    profile = (tmp_path / "results" / "cpu-profile.md").read_text()  # issue 20
    assert "| sample ids: `np.asarray(range)` per window (`BatchStream._take`) |" in profile


@pytest.mark.timeout(60)
def test_the_patch_cases_run_on_a_tiny_field(tmp_path: Path) -> None:
    """Issue 16's cases, in process, on a 3 x 96 x 160 field, one round."""
    from benchmarks.suite import patch_cases as pc
    from benchmarks.suite import targets
    from benchmarks.suite.dataset import Dataset
    from benchmarks.suite.measure import SuiteRun

    skipped: dict[str, str] = {}
    results = pc.measure_patches(tmp_path, steps=3, grid=(96, 160), repeats=1, skipped=skipped)
    run = SuiteRun(Dataset(tmp_path, 3, 0, 0), False, 1, results, skipped, {}, {}, [])
    evaluated = targets.evaluate(run, targets.PATCH_TARGETS)
    text = pc.write_outputs(results, evaluated, tmp_path, command="c", steps=3, grid=(96, 160))
    for chunks in pc.CHUNKINGS:
        for kind in (pc.L0_KIND, pc.SEQUENTIAL, pc.BUFFERED, pc.EXACT, pc.PAIRS):
            assert f"| {pc.name(chunks, kind)} |" in text
        # 3 steps: 2 pairs; 1 x 3 patches (origins 0 along lat, 0, 48, 96 along lon) a step
        assert results[pc.name(chunks, pc.PAIRS)].samples == 2
        assert pc.patches_per_step((96, 160)) == 3
        assert results[pc.name(chunks, pc.SEQUENTIAL)].samples == 3 * 3
    rows = {t.what: t for t in evaluated}
    amp = "chunks 8x180x360: forecast pairs, read amplification <= 1.05 (summary)"
    assert rows[amp].status == "PASS"
    assert (tmp_path / "patches.json").exists()


@pytest.mark.timeout(60)
def test_the_mixture_cases_run_at_a_tiny_size(tmp_path: Path) -> None:
    """Issue 18's mixture against its sources alone, in process: 2 tiny stores, one round."""
    from benchmarks.suite import mixture as mx
    from benchmarks.suite import run as suite_run
    from benchmarks.suite import targets
    from benchmarks.suite.measure import SuiteRun

    results = mx.measure(tmp_path, repeats=1, rows=(2048, 1024), chunk_rows=256)
    for kind in mx.KINDS:  # the same bytes both ways: every sample of both sources once
        mixed, alone = results[mx.name(mx.MIXED, kind)], results[mx.name(mx.ALONE, kind)]
        assert mixed.samples == alone.samples == 3072
        assert mixed.bytes == alone.bytes == 3072 * mx.COLS * 4
    run = SuiteRun(None, False, 1, results, {}, {}, {}, [])  # type: ignore[arg-type]
    evaluated = targets.evaluate(run, targets.MIXTURE_TARGETS)
    assert len(evaluated) == len(mx.KINDS)
    text = suite_run.mixture_report(results, evaluated, "c", "now", (0.0,), (0.0,), 1)
    assert f"| {mx.SEQUENTIAL} |" in text and "| mixture of 2 sources: exact shuffle" in text


@pytest.mark.timeout(60)
def test_the_todask_cases_run_at_a_tiny_size(tmp_path: Path) -> None:
    """Issue 31's epoch array against dask's fancy index: 4 chunks, one round."""
    from benchmarks.suite import todask

    results = todask.measure(tmp_path, rows=4000, repeats=1)
    assert results["tasks"][todask.FANCY] > results["tasks"][todask.TO_DASK]
    assert results["windows"][todask.TO_DASK_QUARTER] == 4
    text = todask.report(results, todask.evaluate(results), "c", "now", (0.0, 0.0))
    assert f"| {todask.FANCY} |" in text and "graph >= 50x smaller" in text


@pytest.mark.peers
@pytest.mark.timeout(240)
def test_the_peer_cases_run_at_a_tiny_size(tmp_path: Path) -> None:
    """Issue 27's peers beside this library: two shards of rows, a field of 4 steps, a round.

    Every reader yields every row (pair) once (``measure`` checks it), and each shape that
    a peer supports has its target row.
    """
    from benchmarks.suite import peers

    results = peers.measure(tmp_path, rows=2 * peers.SHARD_ROWS, steps=4, repeats=1)
    assert results["samples"][peers.case_name(peers.ROWS_STORE, "shuffled", peers.ANN)] == (
        2 * peers.SHARD_ROWS
    )
    pairs = peers.case_name(peers.FIELD_STORE, "sequential", peers.INSITU)
    assert results["samples"][pairs] == 3
    two = peers.case_name(peers.FIELD_STORE, "shuffled, epoch two from the cache", peers.THIS)
    assert results["read"][two]["cache hits"] == 4  # epoch two read nothing from the store
    checks = peers.evaluate(results)
    # rows: both peers in sequential and shuffled, insitubatch in epoch two; pairs: insitubatch
    assert len(checks) == 2 + 2 + 1 + 3
    text = peers.report(results, checks, "c", "now", (0.0, 0.0))
    assert "| rows | shuffled |" in text and "ahead of annbatch" in text


@pytest.mark.peers
@pytest.mark.timeout(240)
def test_the_peer_cases_run_from_s3_with_latency_at_a_tiny_size(tmp_path: Path) -> None:
    """Issue 36: the same cases from moto's S3 on loopback (its own process), 20 ms a request,
    every reader through obstore; the server waits before each answer, so L0 of the field
    (one request per step, one thread) takes at least a round trip per step."""
    from benchmarks.suite import peers, peers_s3

    results = peers.measure(tmp_path, rows=2 * peers.SHARD_ROWS, steps=4, repeats=1,
                            stores=("s3",))  # fmt: skip
    tag = peers_s3.tag(peers_s3.LATENCY)
    assert results["tags"] == [tag] and results["s3"]["latency"] == peers_s3.LATENCY
    rows, field = peers.ROWS_STORE + tag, peers.FIELD_STORE + tag
    assert results["samples"][peers.case_name(rows, "shuffled", peers.INSITU)] == peers.SHARD_ROWS
    assert results["samples"][peers.case_name(field, "sequential", peers.THIS)] == 3
    assert results["seconds"][peers.l0_name(field)][0] >= 4 * peers_s3.LATENCY
    checks = peers.evaluate(results)
    assert len(checks) == 6 and all(tag in c["what"] for c in checks)  # no annbatch on S3
    text = peers.report(results, checks, "c", "now", (0.0, 0.0))
    assert f"| {field} | shuffled |" in text and "**S3**" in text


@pytest.mark.peers
@pytest.mark.timeout(240)
def test_the_single_cell_peer_cases_run_at_a_tiny_size(tmp_path: Path) -> None:
    """Issue 37's sparse cells beside annbatch: 600 cells, one round; every reader every cell."""
    from benchmarks.suite import peers_cells

    results = peers_cells.measure(tmp_path, cells=600, repeats=1)
    assert set(results["seconds"]) == {
        peers_cells.L0, peers_cells.SEQ_THIS, peers_cells.SEQ_ANN, peers_cells.AUTO,
        peers_cells.ANN_DEFAULTS, peers_cells.ANN_SPEED,
    }  # fmt: skip
    checks = peers_cells.evaluate(results)
    assert len(checks) == 3
    text = peers_cells.report(results, checks, "c", "now", (0.0, 0.0))
    assert "annbatch defaults >= 1.5x" in text and "batch mixing" in text
