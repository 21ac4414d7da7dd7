"""Fixtures shared by the test modules that need a real dask.distributed cluster."""

from __future__ import annotations

import importlib.util
import inspect
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zarr
from hypothesis import HealthCheck, settings
from scheduler_state import our_tasks

# Property tests draw the same examples on every run and every machine (derandomize, no
# example database): a suite that passes here passes in CI.  DZB_HYPOTHESIS=random
# explores new examples (with DZB_EXAMPLES_SCALE=20 to hunt harder); a failure it finds
# becomes a test of its own.
settings.register_profile(
    "fixed",
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("random", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("DZB_HYPOTHESIS", "fixed"))

# Optional frameworks: a test that needs one is not collected where it is not installed
# (the newest CI leg has no torch: the registry offers only CUDA builds there), rather than
# skipped.  Module-wide: the files below (relative to tests/); single tests: the marker of
# the same name.
OPTIONAL = {
    "torch": ["loader/test_torch.py", "loader/test_training.py", "loader/test_torch_sparse.py"],
    "peers": ["integration/test_peers.py", "integration/test_sparse_peers.py"],
    "jax": ["loader/test_jax.py"],
}
MISSING = {
    name
    for name, module in (("torch", "torch"), ("jax", "jax"), ("peers", "insitubatch"))
    if importlib.util.find_spec(module) is None
}
collect_ignore = [path for name in MISSING for path in OPTIONAL[name]]
JAX_MODULES = {path.rpartition("/")[2] for path in OPTIONAL["jax"]}


#: markers given by what a test starts (``pytest -m cluster``, ``-m "not s3"``): found in
#: the source of the test, of the fixtures it uses (``client`` -> ``cluster`` starts a
#: LocalCluster) and of the files it takes as parameters (notebooks); or by module name
STARTS = {
    "cluster": re.compile(r"LocalCluster\(|\bClient\(|\"--local-cluster\", \"[1-9]"),
    "s3": re.compile(r"\bS3Server\("),
    "torch": re.compile(r"^\s*import torch\b|importorskip\([\"']torch", re.M),
    "jax": re.compile(r"^\s*import jax\b|importorskip\([\"']jax", re.M),
}


#: ``slow``: the slowest tests (10 s and more each on the 2-core CI machine, from
#: ``pytest --durations``), by module and by test name (with every parameter), so they
#: keep their marker when a file moves
SLOW_MODULES = {"test_notebooks.py", "test_benchmark_smoke.py", "test_exit.py"}
SLOW = {
    "test_a_long_epoch_is_sized_by_its_expected_figure",
    "test_any_state_loads_to_a_valid_continuation_or_raises_a_library_error",
    "test_cache_on_process_workers_reads_each_chunk_once",
    "test_cluster_giving_up_raises_window_error_and_leaves_nothing",
    "test_crash_mid_epoch_and_resume_in_a_new_process",
    "test_ddp_two_ranks_step_together_over_disjoint_shares",
    "test_demo_on_a_local_cluster_matches_the_local_run",
    "test_main_process_state_and_set_epoch_with_persistent_workers",
    "test_map_to_zarr_survives_a_killed_worker",
    "test_ranks_and_elastic_resume",
    "test_resume_after_skipped_chunks_is_exact_and_ranks_keep_their_steps",
    "test_same_batches_on_a_cluster_of_processes",
    "test_same_seed_same_batches_across_processes",
    "test_sigkilled_job_resumes_to_the_same_output",
    "test_source_entropy_equals_a_direct_computation",
    "test_the_site_builds_strictly",
    "test_workers_finish_an_epoch_resumed_from_a_loader_state",
    "test_workers_yield_the_rank_share_once",
    "test_zarr_windows_in_plan_order_hold_the_plans_samples",
}


def _source(obj: Any) -> str:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return ""


def _code(item: pytest.Item) -> str:
    """The test's source, its fixtures' and that of the files it takes as parameters."""
    parts = [_source(getattr(item, "function", None))]
    info = getattr(item, "_fixtureinfo", None)
    for definitions in getattr(info, "name2fixturedefs", {}).values():
        parts += [_source(getattr(definition, "func", None)) for definition in definitions]
    for value in getattr(getattr(item, "callspec", None), "params", {}).values():
        if isinstance(value, Path) and value.is_file() and value.stat().st_size < 2**20:
            parts.append(value.read_text(encoding="utf-8", errors="replace"))
    return "\n".join(parts)


def _relative(item: pytest.Item) -> str:
    """The test's file relative to tests/ (``loader/test_jax.py``), as :data:`OPTIONAL`."""
    return item.path.relative_to(Path(__file__).parent).as_posix()


def mark_by_use(items: list[pytest.Item]) -> None:
    """Add the markers of :data:`STARTS` (a test module may set ``pytestmark`` itself too)."""
    for item in items:
        if item.path.name in SLOW_MODULES or getattr(item, "originalname", "") in SLOW:
            item.add_marker("slow")
        code = _code(item)
        for marker, starts in STARTS.items():
            if starts.search(code) or _relative(item) in OPTIONAL.get(marker, ()):
                item.add_marker(marker)


def _starts_jax(item: pytest.Item) -> bool:
    return item.path.name in JAX_MODULES or item.get_closest_marker("jax") is not None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests by what they start; deselect those of a framework not installed.

    The tests that may start JAX in this process run last: once JAX's backend is up, every
    ``os.fork()`` warns that JAX is multithreaded (an error under ``filterwarnings``), and
    the tests of forked DataLoader workers, cache writers and zarrs readers would fail for
    JAX's sake, not their own.  The slow tests run first, so that under ``pytest -n 2``
    (pytest-xdist, as CI runs) the last minutes are not one worker's long test alone;
    xdist hands tests out in this order, so a worker that started JAX gets no other.
    """
    mark_by_use(items)
    unusable = [item for item in items if any(item.get_closest_marker(m) for m in MISSING)]
    if unusable:
        config.hook.pytest_deselected(items=unusable)
        items[:] = [item for item in items if item not in unusable]
    items.sort(key=lambda item: (_starts_jax(item), item.get_closest_marker("slow") is None))


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """An in-process LocalCluster of two single-threaded workers on loopback."""
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0"
    ) as cluster:
        yield cluster


@pytest.fixture
def client(cluster: Any) -> Iterator[Any]:
    """A client of ``cluster`` that must leave no library task behind."""
    import distributed

    with distributed.Client(cluster, set_as_default=False) as client:
        yield client
        assert our_tasks(client) == []


# Every chunk a test writes is stored, even one equal to the fill value (zarr 3 skips those
# by default), so that the tests' counts of chunks read and absent are the ones they planned.
# Tests of absent chunks delete keys themselves, or pass write_empty_chunks=False.
zarr.config.set({"array.write_empty_chunks": True})


@pytest.fixture(scope="module")
def s3_server() -> Iterator[Any]:
    """moto's S3 on 127.0.0.1 (a free port) for the module, stopped at its end.

    Reach it with ``s3_server.storage_options()`` (fake credentials, its
    endpoint, a region and fail-fast timeouts; no ``AWS_*`` environment
    needed); ``s3_server.new_bucket()`` makes a bucket of one's own.  While it
    runs, a connection or name lookup for anything but loopback fails and fails
    the module (``loopback_only`` of benchmarks/s3_server.py, asserted at teardown): no test
    talks to AWS or to the EC2 metadata service.
    """
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")  # moto[server]: flask and werkzeug
    from benchmarks.s3_server import S3Server, loopback_only

    with loopback_only() as outside:
        server = S3Server().start()
        try:
            yield server
        finally:
            server.stop()
    assert outside == [], f"tests tried to reach beyond loopback: {outside}"


@pytest.fixture
def s3_server_to_stop(s3_server: Any) -> Iterator[Any]:
    """A second moto server of one's own, for a test that stops it (stopped at the end).

    Needs ``s3_server`` for the loopback guard; moto's buckets are process-wide,
    so make a bucket with ``new_bucket()`` on this one.
    """
    from benchmarks.s3_server import S3Server

    server = S3Server().start()
    try:
        yield server
    finally:
        server.stop()
