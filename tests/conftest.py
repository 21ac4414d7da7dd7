"""Fixtures shared by the test modules that need a real dask.distributed cluster."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import zarr
from scheduler_state import our_tasks


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
# by default): otherwise the read policy's default missing="warn" would warn about chunks of
# zeros the tests never meant to leave out.  Tests of missing chunks delete keys themselves.
zarr.config.set({"array.write_empty_chunks": True})
