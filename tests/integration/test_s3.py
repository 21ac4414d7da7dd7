"""S3 for real: every stream reads an S3 copy bit for bit like a local one.

The S3 endpoint is moto's server on 127.0.0.1 (``s3_server`` in conftest.py,
helpers in benchmarks/s3_server.py), written through s3fs and read through both
backends of ``open_array`` (s3fs and obstore) exactly as a bucket on AWS or MinIO
would be; nothing is mocked inside the library, zarr, s3fs or obstore.  Faults are
real HTTP answers of the server (``S3Server.fail``).  The tests that exercise
backend-specific code run on both backends: opening and its errors, every stream
kind once, transient and permanent faults, a missing chunk, a store gone.  obstore
does its own networking in Rust, which the loopback guard cannot see: its stores
are only ever given the server's endpoint and explicit credentials.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import operator
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
import zarr.storage

import daskzarr_batches as dzb
from benchmarks.s3_server import free_port

NEEDS_OBSTORE = pytest.mark.skipif(
    importlib.util.find_spec("obstore") is None, reason="obstore is not installed"
)
BACKENDS = ["fsspec", pytest.param("obstore", marks=NEEDS_OBSTORE)]

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
        """(features, labels) read from S3: through open_array (on a backend) or as
        zarr.Arrays (``"open_array"`` is open_array's default backend)."""
        if how.startswith("open_array"):
            backend = how.partition(" ")[2] or "auto"
            return tuple(
                dzb.open_array(self.url, name, storage_options=self.options, backend=backend)
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


@pytest.mark.parametrize(
    "how",
    [
        "open_array fsspec",
        "zarr.Array",  # zarr's own FsspecStore
        pytest.param("open_array obstore", marks=NEEDS_OBSTORE),
    ],
)
@pytest.mark.parametrize("run", list(RUNS))
def test_every_stream_reads_s3_like_local(copies: Copies, run: str, how: str) -> None:
    assert_bit_identical(RUNS[run](*copies.s3(how)), copies.expected(run))


def test_the_local_copy_holds_the_data(copies: Copies) -> None:
    """The reference is right, so S3 == local means S3 == the data."""
    features, labels = copies.local_arrays()
    assert_bit_identical(np.concatenate(list(dzb.batch_stream(features, BATCH))), X)
    assert_bit_identical(np.concatenate(list(dzb.batch_stream(labels, BATCH))), Y)


@pytest.mark.parametrize("backend", BACKENDS)
def test_workers_read_s3_like_the_local_threads(copies: Copies, client: Any, backend: str) -> None:
    expected = copies.expected("paired shuffled buffer")
    x, y = copies.s3(f"open_array {backend}")
    with dzb.paired_shuffled_batch_stream(
        x, y, BATCH, seed=5, shuffle_buffer_size=300, client=client
    ) as stream:
        got = list(stream)
        assert stream.stats.chunks_read > 0
    assert_bit_identical(got, expected)
    on_workers = dzb.feature_moments(x, client=client)
    assert_bit_identical(on_workers, dzb.feature_moments(copies.local_arrays()[0]))


@pytest.mark.parametrize("backend", BACKENDS)
def test_open_array_uses_the_backend_asked_for(copies: Copies, backend: str) -> None:
    x = dzb.open_array(copies.url, "features", storage_options=copies.options, backend=backend)
    store = type(zarr_array(x).store).__name__
    assert store == {"fsspec": "FsspecStore", "obstore": "ObjectStore"}[backend]


@NEEDS_OBSTORE
def test_auto_is_obstore_when_installed_else_fsspec(
    copies: Copies, monkeypatch: pytest.MonkeyPatch
) -> None:
    x = dzb.open_array(copies.url, "features", storage_options=copies.options)
    assert type(zarr_array(x).store).__name__ == "ObjectStore"
    monkeypatch.setitem(sys.modules, "obstore", None)  # find_spec raises: as not installed
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    x = dzb.open_array(copies.url, "features", storage_options=copies.options)
    assert type(zarr_array(x).store).__name__ == "FsspecStore"
    with pytest.raises(dzb.ArgumentValueError, match=r"pip install 'daskzarr-batches\[obstore\]'"):
        dzb.open_array(copies.url, "features", storage_options=copies.options, backend="obstore")


def zarr_array(x: Any) -> zarr.Array:
    """The zarr.Array a dask array from open_array reads."""
    from daskzarr_batches.store.sources import as_source

    array = as_source(x, "x").array
    assert isinstance(array, zarr.Array)
    return array


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
        dzb.open_array(
            "s3://bucket/data.zarr", "features", storage_options={"anon": True}, backend="fsspec"
        )
    message = str(info.value)
    assert "pip install 'daskzarr-batches[s3]'" in message
    assert "'s3://bucket/data.zarr'" in message
    assert isinstance(info.value.__cause__, ImportError)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "where, path",
    [("{other}/data.zarr", "features"), ("{bucket}/nothing.zarr", "features")],
    ids=["no such bucket", "no such key"],
)
def test_nothing_there_is_array_not_found(
    copies: Copies, where: str, path: str, backend: str
) -> None:
    url = "s3://" + where.format(bucket=copies.bucket, other=copies.bucket + "-missing")
    with pytest.raises(dzb.ArrayNotFoundError, match=url):
        dzb.open_array(url, path, storage_options=copies.options, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_array_at_the_path_lists_the_arrays(copies: Copies, backend: str) -> None:
    with pytest.raises(dzb.ArrayNotFoundError, match="'features', 'labels'"):
        dzb.open_array(copies.url, "nothing", storage_options=copies.options, backend=backend)


# What each backend's error says when nothing listens at the endpoint.
REFUSED = {"fsspec": "EndpointConnectionError", "obstore": "error sending request"}


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_unreachable_endpoint_fails_fast_naming_the_url(copies: Copies, backend: str) -> None:
    options = copies.server.storage_options(endpoint_url=f"http://127.0.0.1:{free_port()}")
    start = time.monotonic()
    with pytest.raises(dzb.ArgumentValueError) as info:
        dzb.open_array(copies.url, "features", storage_options=options, backend=backend)
    assert time.monotonic() - start < 10
    assert repr(copies.url) in str(info.value)
    assert REFUSED[backend] in str(info.value)
    assert "Debug source" not in str(info.value)  # obstore's dump stays in the __cause__


@pytest.mark.parametrize("backend", BACKENDS)
def test_wrong_credentials_fail_naming_the_url(copies: Copies, backend: str) -> None:
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
    user = f"reader-{copies.bucket}-{backend}"
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
        opened = dzb.open_array(copies.url, "features", storage_options=good, backend=backend)
        assert_bit_identical(opened.compute(), X)
        for wrong in ({"secret": "not-the-secret"}, {"key": "AKIANOTAKEY0000000"}):
            start = time.monotonic()
            with pytest.raises(dzb.ArgumentValueError) as info:
                dzb.open_array(
                    copies.url, "features", storage_options={**good, **wrong}, backend=backend
                )
            assert time.monotonic() - start < 10
            assert repr(copies.url) in str(info.value)
            cause = info.value.__cause__
            if backend == "fsspec":
                assert isinstance(cause, PermissionError)
            else:
                assert type(cause).__name__ == "PermissionDeniedError"


@NEEDS_OBSTORE
@pytest.mark.parametrize(
    "options, named",
    [
        ({"bogus": 1, "profile": "dev"}, "'bogus', 'profile'"),
        ({"client_kwargs": {"region_name": "eu-west-1", "proxies": {}}}, "'proxies'"),
        ({"config_kwargs": {"signature_version": "s3v4"}}, "'signature_version'"),
    ],
    ids=["top level", "client_kwargs", "config_kwargs"],
)
def test_storage_options_obstore_cannot_use_are_named(
    copies: Copies, options: dict[str, Any], named: str
) -> None:
    with pytest.raises(dzb.ArgumentValueError, match=named) as info:
        dzb.open_array(copies.url, "features", storage_options=options, backend="obstore")
    assert "backend='fsspec'" in str(info.value)


@NEEDS_OBSTORE
def test_obstore_config_keys_work_as_they_are(copies: Copies) -> None:
    options = {
        "aws_access_key_id": "testing",
        "aws_secret_access_key": "testing",
        "aws_endpoint": copies.server.endpoint_url,
        "aws_region": "eu-west-1",
        "client_options": {"allow_http": True},
        "retry_config": {"max_retries": 0},
    }
    x = dzb.open_array(copies.url, "features", storage_options=options, backend="obstore")
    assert_bit_identical(x.compute(), X)


# --------------------------------------------------------------------------
# faults answered by the server: the read policy on both backends


# Read-policy retries a fault must cause: obstore retries as config_kwargs says (once),
# so the policy sees the third answer; s3fs also retries some errors on its own loop
# (its retries=5), which may absorb all three.
CLIENT_PASSES_FAULTS_ON = {"fsspec": 0, "obstore": 1}


def fresh_array(server: Any, prefix: str, backend: str) -> tuple[str, Any]:
    """A bucket of its own holding ``X`` as ``features``: (url, array opened on backend)."""
    url = f"s3://{server.new_bucket(prefix)}/data.zarr"
    options = server.storage_options()
    written = zarr.open_group(url, mode="w", storage_options=options)
    written.create_array("features", data=X, chunks=(FEATURE_CHUNK, FEATURES))
    return url, dzb.open_array(url, "features", storage_options=options, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "fault",
    [{"status": 503, "code": "SlowDown"}, {"status": 500, "code": "InternalError"}],
    ids=["throttled", "server error"],
)
def test_transient_answers_are_retried(s3_server: Any, backend: str, fault: Any) -> None:
    url, x = fresh_array(s3_server, "flaky", backend)
    # more answers than the client retries itself (config_kwargs: one retry), so the
    # read policy sees the fault and retries it
    s3_server.fail(url[5:] + "/features/c/3/", times=3, **fault)
    with dzb.batch_stream(x, BATCH, window_bytes=CHUNK_BYTES, retries=3) as stream:
        got = np.concatenate(list(stream))
        assert stream.stats.retries >= CLIENT_PASSES_FAULTS_ON[backend]
    assert_bit_identical(got, X)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_slow_answer_times_out_and_is_retried(s3_server: Any, backend: str) -> None:
    url, x = fresh_array(s3_server, "slow", backend)
    # read_timeout is 2 s (FAIL_FAST): two answers 3 s late are two timeouts
    s3_server.fail(url[5:] + "/features/c/2/", times=2, status=200, delay=3)
    with dzb.batch_stream(x, BATCH, window_bytes=CHUNK_BYTES, retries=3) as stream:
        got = np.concatenate(list(stream))
        assert stream.stats.retries >= CLIENT_PASSES_FAULTS_ON[backend]
    assert_bit_identical(got, X)


@pytest.mark.parametrize("backend", BACKENDS)
def test_access_denied_is_not_retried_and_names_the_chunk(s3_server: Any, backend: str) -> None:
    url, x = fresh_array(s3_server, "denied", backend)
    s3_server.fail(url[5:] + "/features/c/3/", times=50, status=403, code="AccessDenied")
    stream = dzb.batch_stream(x, BATCH, window_bytes=CHUNK_BYTES, retries=3)
    chunk_3 = r"axis-0 chunk 3 .*key 'features/c/3/0'"
    with pytest.raises(dzb.ChunkReadError, match=chunk_3) as info, stream:
        list(stream)
    assert stream.stats.retries == 0
    assert "Debug source" not in str(info.value)  # obstore's dump stays in the __cause__


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_missing_chunk_is_filled_and_reported(s3_server: Any, backend: str) -> None:
    import s3fs

    url, x = fresh_array(s3_server, "holes", backend)
    s3fs.S3FileSystem(**s3_server.storage_options()).rm(url[5:] + "/features/c/4/0")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with dzb.batch_stream(x, BATCH, missing="warn") as stream:
            got = np.concatenate(list(stream))
            assert stream.stats.chunks_missing == 1
    assert any(issubclass(w.category, dzb.MissingChunksWarning) for w in caught)
    expected = X.copy()
    expected[4 * FEATURE_CHUNK : 5 * FEATURE_CHUNK] = 0
    assert_bit_identical(got, expected)
    with pytest.raises(dzb.MissingChunkError, match="features/c/4/0"):
        list(dzb.batch_stream(x, BATCH, missing="error"))


# --------------------------------------------------------------------------
# the server goes away mid-epoch


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_server_stopped_mid_epoch_fails_the_stream(s3_server_to_stop: Any, backend: str) -> None:
    server = s3_server_to_stop
    url, x = fresh_array(server, "stop", backend)
    group = zarr.open_group(url, mode="r", storage_options=server.storage_options())
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


@pytest.mark.parametrize(
    "what, backend",
    [
        ("bucket", "fsspec"),
        ("array", "fsspec"),
        pytest.param("bucket", "obstore", marks=NEEDS_OBSTORE),
    ],
)
def test_a_bucket_or_array_deleted_mid_epoch_is_an_outage(
    s3_server: Any, what: str, backend: str
) -> None:
    import s3fs

    url, x = fresh_array(s3_server, "gone", backend)
    bucket = url[5:].split("/")[0]
    options = s3_server.storage_options()
    stream = dzb.batch_stream(x, BATCH, window_bytes=CHUNK_BYTES, prefetch=0)
    got = [next(stream)]
    fs = s3fs.S3FileSystem(**options)
    fs.rm(f"{bucket}/data.zarr/features", recursive=True)
    if what == "bucket":
        fs.rm(bucket, recursive=True)
        assert not fs.exists(bucket)
    with pytest.raises(dzb.StoreGoneError, match=r"'features/zarr\.json' is no longer in"), stream:
        got.extend(stream)  # it was 1,750 rows of zeros, silently (missing="fill")
    assert len(got) < len(stream)
    assert_bit_identical(np.concatenate(got), X[: len(got) * BATCH])


@pytest.mark.parametrize("backend", ["obstore", "fsspec"])
def test_writes_go_to_an_s3_url_on_either_backend(s3_server: Any, backend: str) -> None:
    """map_to_zarr and write_shuffled write an ``out`` URL through open_array's backends."""
    x = np.arange(40 * 3, dtype="f4").reshape(40, 3)
    bucket = s3_server.new_bucket()
    options = s3_server.storage_options()
    url = f"s3://{bucket}/double.zarr"
    out = dzb.map_to_zarr(
        lambda rows: rows * 2, x, url, chunks=16, storage_options=options, backend=backend
    )
    np.testing.assert_array_equal(out[:], x * 2)
    stats = dzb.WriteStats()
    again = dzb.map_to_zarr(  # a resume: every chunk is there, nothing is computed
        lambda rows: rows * 2, x, url, chunks=16, storage_options=options, backend=backend,
        stats=stats,
    )  # fmt: skip
    np.testing.assert_array_equal(again[:], x * 2)
    assert stats.units_skipped == stats.units
    shuffled = dzb.write_shuffled(
        x, f"s3://{bucket}/shuffled.zarr", seed=3, storage_options=options, backend=backend
    )
    np.testing.assert_array_equal(shuffled[:], x[dzb.shuffle_order(40, 3)])


@pytest.mark.parametrize("read_with", BACKENDS)
@pytest.mark.parametrize("write_with", BACKENDS)
def test_a_write_onto_its_own_bucket_path_is_refused(
    s3_server: Any, read_with: str, write_with: str
) -> None:
    """The same bucket and path, read through one backend and written through the other (a
    trailing slash, the group that holds it): refused, the input intact."""
    options = s3_server.storage_options()
    url = f"s3://{s3_server.new_bucket()}/g.zarr"
    data = np.arange(24, dtype="f4").reshape(12, 2)
    group = zarr.open_group(url, mode="w", storage_options=options)
    group.create_array("x", shape=data.shape, chunks=(4, 2), dtype="f4")[:] = data
    source = dzb.open_array(url, "x", storage_options=options, backend=read_with)
    for out in (f"{url}/x", f"{url}/x/", url):
        with pytest.raises(dzb.ArgumentValueError, match="never writes onto its own input"):
            dzb.write_shuffled(
                source, out, overwrite=True, storage_options=options, backend=write_with
            )
    again = dzb.open_array(url, "x", storage_options=options, backend="fsspec")
    np.testing.assert_array_equal(again.compute(), data)
