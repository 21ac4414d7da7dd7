"""The peers step's stores on S3 (issue 36): moto on loopback, a round trip added to each request.

``python -m benchmarks --only peers`` runs its cases twice: from the local directories,
then (``--store s3`` alone, ``--store local`` without) from copies uploaded to moto's S3
server on ``127.0.0.1`` that waits :data:`LATENCY` (20 ms; ``--latency``) before answering
each request, as an object store's round trip.  The server runs in a process of its own
(``python -m benchmarks.s3_server``), so that moto's Python answering requests does not
compete for the GIL of the readers measured.  Every reader goes through obstore: L0 is
zarr-python over ``zarr.storage.ObjectStore``, this library ``open_array(url, ...,
backend="obstore")`` (zarr's pipeline: zarrs does not read obstore stores), insitubatch its
own ``obstore_store(url, ...)``; annbatch reads local files only and has no S3 row.

The S3 copies of the rows are smaller (:data:`ROWS_PART`: half the rows; the field keeps
every step), so that the step stays a few minutes on a small machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import zarr

import daskzarr_batches as dzb

from . import ROOT

#: seconds the server waits before answering each request (``--latency``)
LATENCY = 0.020
#: the S3 copies: ``rows // ROWS_PART`` rows and ``steps // STEPS_PART`` time steps (half the
#: rows, every step: the same pair shapes, shuffled blocks included)
ROWS_PART, STEPS_PART = 2, 1


def tag(latency: float) -> str:
    """What the S3 stores' names carry: ``rows, S3 20 ms``."""
    return f", S3 {latency * 1000:.0f} ms"


def sizes(rows: int, steps: int) -> tuple[int, int]:
    """The rows and time steps of the S3 copies."""
    return max(rows // ROWS_PART, 1), max(steps // STEPS_PART, 2)


@contextlib.contextmanager
def served(latency: float) -> Iterator[dict[str, Any]]:
    """moto's S3 in a child process waiting ``latency`` s a request: its endpoint and bucket."""
    path = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    with subprocess.Popen(
        [sys.executable, "-m", "benchmarks.s3_server", "--latency", str(latency)],
        cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    ) as process:  # fmt: skip
        assert process.stdin is not None and process.stdout is not None
        try:
            line = process.stdout.readline()
            if not line:
                raise RuntimeError(f"the S3 server did not start (exit status {process.poll()})")
            yield json.loads(line)
        finally:
            process.stdin.close()  # the server stops when its input closes
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()


def obstore_config(server: dict[str, Any]) -> dict[str, Any]:
    """obstore's ``from_url`` keywords that reach the server (fake credentials, plain http)."""
    from ..s3_server import REGION

    return {
        "endpoint": server["endpoint_url"], "access_key_id": "testing",
        "secret_access_key": "testing", "region": REGION,
        "client_options": {"allow_http": True},
    }  # fmt: skip


def upload(path: Path, server: dict[str, Any], name: str) -> str:
    """Every file under ``path`` put to ``s3://<bucket>/<name>``; that URL."""
    import obstore
    import obstore.store

    store = obstore.store.from_url(f"s3://{server['bucket']}", **obstore_config(server))
    for file in sorted(path.rglob("*")):
        if file.is_file():
            obstore.put(store, f"{name}/{file.relative_to(path).as_posix()}", file.read_bytes())
    return f"s3://{server['bucket']}/{name}"


def on_s3(
    rows_path: Path, field_path: Path, server: dict[str, Any]
) -> tuple[zarr.Array, zarr.Array, Any, Any, str, str, dict[str, Any]]:
    """The two stores uploaded and opened by each reader through obstore: L0's arrays, this
    library's, the URLs and obstore's keywords for insitubatch (``peers.Where``'s fields)."""
    import obstore.store

    config = obstore_config(server)
    rows_url = upload(rows_path, server, "rows.zarr")
    field_url = upload(field_path, server, "field.zarr")

    def array(url: str, name: str) -> zarr.Array:
        store = zarr.storage.ObjectStore(obstore.store.from_url(url, **config), read_only=True)
        found = zarr.open_group(store, mode="r")[name]
        assert isinstance(found, zarr.Array)
        return found

    def ours(url: str, name: str) -> Any:
        options = server["storage_options"]
        return dzb.open_array(url, name, storage_options=options, backend="obstore")

    return (
        array(rows_url, "X"), array(field_url, "field"), ours(rows_url, "X"),
        ours(field_url, "field"), rows_url, field_url, config,
    )  # fmt: skip
