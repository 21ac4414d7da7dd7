"""Fixtures shared by the test modules that need a real dask.distributed cluster."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
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
# skipped.  Module-wide: the files below; single tests: the marker of the same name.
OPTIONAL = {
    "torch": ["test_torch.py", "test_training.py"],
    "jax": ["test_jax.py"],
    "peers": ["test_peers.py"],
}
MISSING = {
    name
    for name, module in (("torch", "torch"), ("jax", "jax"), ("peers", "insitubatch"))
    if importlib.util.find_spec(module) is None
}
collect_ignore = [path for name in MISSING for path in OPTIONAL[name]]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the tests marked for an optional framework that is not installed."""
    unusable = [item for item in items if any(item.get_closest_marker(m) for m in MISSING)]
    if unusable:
        config.hook.pytest_deselected(items=unusable)
        items[:] = [item for item in items if item not in unusable]


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
