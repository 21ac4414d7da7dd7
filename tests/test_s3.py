"""S3 for real: every stream reads an S3 copy bit for bit like a local one.

The S3 endpoint is moto's server on 127.0.0.1 (``s3_server`` in conftest.py,
helpers in benchmarks/s3_server.py), written and read through s3fs exactly as a bucket on
AWS or MinIO would be; nothing is mocked inside the library, zarr or s3fs.
"""

from __future__ import annotations

import functools
import importlib
import operator
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
import zarr.storage

import daskzarr_batches as dzb
from benchmarks.s3_server import free_port

N, FEATURES = 2000, 8
FEATURE_CHUNK, LABEL_CHUNK = 128, 200  # grids that rarely line up: paired units get split
BATCH = 100
RNG = np.random.default_rng(8)
X = RNG.normal(size=(N, FEATURES)).astype(np.float32)
Y = RNG.integers(0, 10, size=N).astype(np.int64)
CHUNK_BYTES = FEATURE_CHUNK * FEATURES * 4


def write_group(group: zarr.Group) -> None:
    features = group.create_array(
        "features", shape=X.shape, chunks=(FEATURE_CHUNK, FEATURES), dtype=X.dtype
    )
    labels = group.create_array("labels", shape=Y.shape, chunks=(LABEL_CHUNK,), dtype=Y.dtype)
    features[:] = X
    labels[:] = Y


class Copies:
    """The same dataset in a moto bucket and in a local directory store."""

    def __init__(self, server: Any, local: Path) -> None:
        self.server = server
        self.bucket = server.new_bucket("copies")
        self.url = f"s3://{self.bucket}/data.zarr"
        self.options = server.storage_options()
        write_group(zarr.open_group(self.url, mode="w", storage_options=self.options))
        write_group(zarr.open_group(local, mode="w"))
        self.local = local

    @functools.cache  # noqa: B019 - one Copies per module
    def s3(self, how: str) -> tuple[Any, Any]:
        """(features, labels) read from S3: through open_array or as zarr.Arrays."""
        if how == "open_array":
            return tuple(
                dzb.open_array(self.url, name, storage_options=self.options)
                for name in ("features", "labels")
            )
        store = zarr.storage.FsspecStore.from_url(
            self.url, storage_options=self.options, read_only=True
        )
        return tuple(zarr.open_array(store, path=name, mode="r") for name in ("features", "labels"))

    @functools.cache  # noqa: B019
    def expected(self, run: str) -> Any:
        """What ``RUNS[run]`` gives on the local copy."""
        return RUNS[run](*self.local_arrays())

    def local_arrays(self) -> tuple[zarr.Array, zarr.Array]:
        group = zarr.open_group(self.local, mode="r")
        features, labels = group["features"], group["labels"]
        assert isinstance(features, zarr.Array) and isinstance(labels, zarr.Array)
        return features, labels


@pytest.fixture(scope="module")
def copies(s3_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Copies:
    return Copies(s3_server, tmp_path_factory.mktemp("local") / "data.zarr")


def test_the_s3_copy_is_stored_in_the_bucket(copies: Copies) -> None:
    import s3fs

    fs = s3fs.S3FileSystem(**copies.options)
    chunks = fs.ls(f"{copies.bucket}/data.zarr/features/c")
    assert len(chunks) == -(-N // FEATURE_CHUNK)  # one key per chunk row
    assert fs.cat(f"{copies.bucket}/data.zarr/zarr.json").startswith(b"{")


# --------------------------------------------------------------------------
# every stream kind, S3 against local


def parts(result: Any) -> list[np.ndarray]:
    """Everything a stream or job produced, as a flat list of numpy arrays."""
    if isinstance(result, np.ndarray):
        return [result]
    if isinstance(result, int):  # a block index of with_index=True
        return [np.asarray(result)]
    if isinstance(result, dzb.Moments):
        return [np.asarray(result.count), result.mean, result.m2]
    if isinstance(result, dict):
        return [part for key in sorted(result) for part in [np.asarray(key), *parts(result[key])]]
    if isinstance(result, tuple | list):
        return [part for item in result for part in parts(item)]
    raise AssertionError(f"unexpected result {type(result).__name__}")


def assert_bit_identical(got: Any, expected: Any) -> None:
    got_parts, expected_parts = parts(got), parts(expected)
    assert len(got_parts) == len(expected_parts) > 0
    for index, (a, b) in enumerate(zip(got_parts, expected_parts, strict=True)):
        assert (a.dtype, a.shape) == (b.dtype, b.shape), index
        assert a.tobytes() == b.tobytes(), index


def plus_one(chunk: np.ndarray) -> np.ndarray:
    return chunk * 2 + 1


def column_sums(chunk: np.ndarray) -> np.ndarray:
    return chunk.sum(axis=0, dtype=np.float64)


# Three feature chunks per sequential window, two windows in the exact shuffle
# (each reads nearly every chunk).
WINDOW = {"window_bytes": 3 * CHUNK_BYTES}
BUDGET = {"memory_budget": N * (FEATURES * 4 + 8) // 2}

RUNS: dict[str, Callable[[Any, Any], Any]] = {
    "chunk_stream": lambda x, y: list(dzb.chunk_stream(x)),
    "chunk_stream unordered": lambda x, y: dict(
        dzb.chunk_stream(x, ordered=False, with_index=True)
    ),
    "batch_stream": lambda x, y: list(dzb.batch_stream(x, BATCH, **WINDOW)),
    "shuffled exact": lambda x, y: list(dzb.shuffled_batch_stream(x, BATCH, seed=5, **BUDGET)),
    "shuffled buffer": lambda x, y: list(
        dzb.shuffled_batch_stream(x, BATCH, seed=5, shuffle_buffer_size=300)
    ),
    "paired_batch_stream": lambda x, y: list(dzb.paired_batch_stream(x, y, BATCH, **WINDOW)),
    "paired shuffled exact": lambda x, y: list(
        dzb.paired_shuffled_batch_stream(x, y, BATCH, seed=5, **BUDGET)
    ),
    "paired shuffled buffer": lambda x, y: list(
        dzb.paired_shuffled_batch_stream(x, y, BATCH, seed=5, shuffle_buffer_size=300)
    ),
    "map_chunks": lambda x, y: list(dzb.map_chunks(plus_one, x, with_index=True)),
    "map_chunks unordered": lambda x, y: dict(
        dzb.map_chunks(plus_one, x, ordered=False, with_index=True)
    ),
    "reduce_chunks": lambda x, y: dzb.reduce_chunks(column_sums, operator.add, x),
    "feature_moments": lambda x, y: (dzb.feature_moments(x), dzb.feature_moments(y)),
}


@pytest.mark.parametrize("how", ["open_array", "zarr.Array"])
@pytest.mark.parametrize("run", list(RUNS))
def test_every_stream_reads_s3_like_local(copies: Copies, run: str, how: str) -> None:
    assert_bit_identical(RUNS[run](*copies.s3(how)), copies.expected(run))


def test_the_local_copy_holds_the_data(copies: Copies) -> None:
    """The reference is right, so S3 == local means S3 == the data."""
    features, labels = copies.local_arrays()
    assert_bit_identical(np.concatenate(list(dzb.batch_stream(features, BATCH))), X)
    assert_bit_identical(np.concatenate(list(dzb.batch_stream(labels, BATCH))), Y)


def test_workers_read_s3_like_the_local_threads(copies: Copies, client: Any) -> None:
    expected = copies.expected("paired shuffled buffer")
    x, y = copies.s3("open_array")
    with dzb.paired_shuffled_batch_stream(
        x, y, BATCH, seed=5, shuffle_buffer_size=300, client=client
    ) as stream:
        got = list(stream)
        assert stream.stats.chunks_read > 0
    assert_bit_identical(got, expected)
    on_workers = dzb.feature_moments(x, client=client)
    assert_bit_identical(on_workers, dzb.feature_moments(copies.local_arrays()[0]))


# --------------------------------------------------------------------------
# open_array: library errors for remote sources


def test_without_s3fs_open_array_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    # fsspec imports s3fs the first time the protocol is used and keeps the class
    # in its registry: forget both, and make the import fail as if not installed.
    registry = importlib.import_module("fsspec.registry")
    for protocol in ("s3", "s3a"):
        monkeypatch.delitem(registry._registry, protocol, raising=False)
    monkeypatch.setitem(sys.modules, "s3fs", None)
    with pytest.raises(dzb.ArgumentValueError) as info:
        dzb.open_array("s3://bucket/data.zarr", "features", storage_options={"anon": True})
    message = str(info.value)
    assert "pip install 'daskzarr-batches[s3]'" in message
    assert "'s3://bucket/data.zarr'" in message
    assert isinstance(info.value.__cause__, ImportError)


@pytest.mark.parametrize(
    "where, path",
    [("{other}/data.zarr", "features"), ("{bucket}/nothing.zarr", "features")],
    ids=["no such bucket", "no such key"],
)
def test_nothing_there_is_array_not_found(copies: Copies, where: str, path: str) -> None:
    url = "s3://" + where.format(bucket=copies.bucket, other=copies.bucket + "-missing")
    with pytest.raises(dzb.ArrayNotFoundError, match=url):
        dzb.open_array(url, path, storage_options=copies.options)


def test_no_array_at_the_path_lists_the_arrays(copies: Copies) -> None:
    with pytest.raises(dzb.ArrayNotFoundError, match="'features', 'labels'"):
        dzb.open_array(copies.url, "nothing", storage_options=copies.options)


def test_an_unreachable_endpoint_fails_fast_naming_the_url(copies: Copies) -> None:
    options = copies.server.storage_options(endpoint_url=f"http://127.0.0.1:{free_port()}")
    start = time.monotonic()
    with pytest.raises(dzb.ArgumentValueError) as info:
        dzb.open_array(copies.url, "features", storage_options=options)
    assert time.monotonic() - start < 10
    assert repr(copies.url) in str(info.value)
    assert "EndpointConnectionError" in str(info.value)


def test_wrong_credentials_fail_naming_the_url(copies: Copies) -> None:
    import boto3
    from moto.core.authorization import enable_iam_authentication

    # moto accepts any key unless IAM authentication is on; then only keys of its
    # IAM users work, so make one with read access to everything.
    iam = boto3.client(
        "iam",
        endpoint_url=copies.server.endpoint_url,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="eu-west-1",
    )
    user = f"reader-{copies.bucket}"
    iam.create_user(UserName=user)
    iam.put_user_policy(
        UserName=user,
        PolicyName="read",
        PolicyDocument='{"Version": "2012-10-17", "Statement": '
        '[{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}',
    )
    key = iam.create_access_key(UserName=user)["AccessKey"]
    good = copies.server.storage_options(key=key["AccessKeyId"], secret=key["SecretAccessKey"])
    with enable_iam_authentication():
        opened = dzb.open_array(copies.url, "features", storage_options=good)
        assert_bit_identical(opened.compute(), X)
        for wrong in ({"secret": "not-the-secret"}, {"key": "AKIANOTAKEY0000000"}):
            start = time.monotonic()
            with pytest.raises(dzb.ArgumentValueError) as info:
                dzb.open_array(copies.url, "features", storage_options={**good, **wrong})
            assert time.monotonic() - start < 10
            assert repr(copies.url) in str(info.value)
            assert isinstance(info.value.__cause__, PermissionError)


# --------------------------------------------------------------------------
# the server goes away mid-epoch


def test_a_server_stopped_mid_epoch_fails_the_stream(s3_server_to_stop: Any) -> None:
    server = s3_server_to_stop
    url = f"s3://{server.new_bucket('stop')}/data.zarr"
    options = server.storage_options()
    written = zarr.open_group(url, mode="w", storage_options=options)
    written.create_array("features", data=X, chunks=(FEATURE_CHUNK, FEATURES))
    x = dzb.open_array(url, "features", storage_options=options)
    group = zarr.open_group(url, mode="r", storage_options=options)
    # one chunk per window, so most windows are read after the stop
    stream = dzb.batch_stream(x, BATCH, window_bytes=CHUNK_BYTES, prefetch=1, timeout=5)
    got = [next(stream)]
    server.stop()
    start = time.monotonic()
    with pytest.raises(dzb.ChunkReadError) as info, stream:
        got.extend(stream)
    elapsed = time.monotonic() - start
    assert elapsed < 20
    assert len(got) < len(stream)
    assert_bit_identical(np.concatenate(got), X[: len(got) * BATCH])
    assert "chunk" in str(info.value)
    # opening an array of a group opened before the stop fails as a library error too
    with pytest.raises(dzb.ArgumentValueError, match="EndpointConnectionError"):
        dzb.open_array(group, "features")


@pytest.mark.parametrize("what", ["bucket", "array"])
def test_a_bucket_or_array_deleted_mid_epoch_is_an_outage(s3_server: Any, what: str) -> None:
    import s3fs

    bucket = s3_server.new_bucket("gone")
    url = f"s3://{bucket}/data.zarr"
    options = s3_server.storage_options()
    written = zarr.open_group(url, mode="w", storage_options=options)
    written.create_array("features", data=X, chunks=(FEATURE_CHUNK, FEATURES))
    x = dzb.open_array(url, "features", storage_options=options)
    stream = dzb.batch_stream(x, BATCH, window_bytes=CHUNK_BYTES, prefetch=0)
    got = [next(stream)]
    fs = s3fs.S3FileSystem(**options)
    fs.rm(f"{bucket}/data.zarr/features", recursive=True)
    if what == "bucket":
        fs.rm(bucket, recursive=True)
        assert not fs.exists(bucket)
    with pytest.raises(dzb.StoreGoneError, match=r"'features/zarr\.json' is no longer in"), stream:
        got.extend(stream)  # missing="warn": it was 1,750 rows of zeros
    assert len(got) < len(stream)
    assert_bit_identical(np.concatenate(got), X[: len(got) * BATCH])
