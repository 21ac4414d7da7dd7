"""The backend of a URL and fsspec-style storage_options translated for obstore (no I/O)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

import daskzarr_batches as dzb
from daskzarr_batches.store.backends import (
    DEFAULT_OBSTORE_RETRY,
    obstore_options,
    resolve_backend,
)


@pytest.mark.parametrize(
    ("protocol", "options", "config", "client"),
    [
        (
            "s3",
            {
                "key": "K",
                "secret": "S",
                "token": "T",
                "endpoint_url": "http://127.0.0.1:9000",
                "client_kwargs": {"region_name": "eu-west-1"},
                "use_listings_cache": False,  # fsspec's own cache: ignored
            },
            {
                "aws_access_key_id": "K",
                "aws_secret_access_key": "S",
                "aws_session_token": "T",
                "aws_endpoint": "http://127.0.0.1:9000",
                "aws_region": "eu-west-1",
            },
            {"allow_http": True},
        ),
        (
            "s3",
            {"anon": True, "client_kwargs": {"endpoint_url": "https://minio.example"}},
            {"skip_signature": True, "aws_endpoint": "https://minio.example"},
            {},
        ),
        (
            "s3",
            {"aws_region": "us-west-2", "config_kwargs": {"connect_timeout": 1}},
            {"aws_region": "us-west-2"},
            {"connect_timeout": timedelta(seconds=1)},
        ),
        ("gs", {"token": "anon"}, {"skip_signature": True}, {}),
        ("gs", {"token": "/keys/sa.json"}, {"google_service_account": "/keys/sa.json"}, {}),
        (
            "az",
            {"account_name": "acct", "sas_token": "?sv=1"},
            {"account_name": "acct", "sas_key": "sv=1"},
            {},
        ),
        ("https", {"headers": {"A": "b"}}, {}, {"default_headers": {"A": "b"}}),
    ],
    ids=["s3fs keys", "anon endpoint", "obstore key", "gcs anon", "gcs file", "azure", "http"],
)
def test_storage_options_are_translated(
    protocol: str, options: dict[str, Any], config: dict[str, Any], client: dict[str, Any]
) -> None:
    got_config, got_client, retry = obstore_options(protocol, options)
    assert (got_config, got_client) == (config, client)
    assert retry == DEFAULT_OBSTORE_RETRY


def test_botocore_retries_become_obstore_retries() -> None:
    _, _, retry = obstore_options("s3", {"config_kwargs": {"retries": {"max_attempts": 1}}})
    assert retry["max_retries"] == 1
    _, _, retry = obstore_options("s3", {"retry_config": {"max_retries": 7}})
    assert retry["max_retries"] == 7


def test_one_option_given_twice_differently_is_refused() -> None:
    with pytest.raises(dzb.ArgumentValueError, match="aws_access_key_id twice"):
        obstore_options("s3", {"key": "A", "aws_access_key_id": "B"})


def test_http_takes_no_store_config() -> None:
    with pytest.raises(dzb.ArgumentValueError, match="'key'"):
        obstore_options("https", {"key": "A"})


def test_backend_choices() -> None:
    assert resolve_backend("fsspec", "s3") == "fsspec"
    assert resolve_backend("auto", "memory") == "fsspec"  # a protocol obstore does not read
    assert resolve_backend("obstore", None) is None  # not a URL: no backend
    with pytest.raises(dzb.ArgumentValueError, match="backend must be one of"):
        dzb.open_array("s3://bucket/data.zarr", backend="boto")  # type: ignore[arg-type]
    with pytest.raises(dzb.ArgumentValueError, match="not memory://"):
        dzb.open_array("memory://data.zarr", backend="obstore")


@pytest.mark.parametrize(
    ("name", "message", "transient"),
    [
        ("GenericError", "Server returned non-2xx status code: 503 Service Unavailable", True),
        ("GenericError", "Server returned non-2xx status code: 429 Too Many Requests", True),
        ("GenericError", "non-2xx status code: 400 Bad Request: <Code>RequestTimeout</Code>", True),
        ("GenericError", "non-2xx status code: 400 Bad Request: <Code>InvalidRange</Code>", False),
        ("GenericError", "HTTP error: error sending request\n    kind: Connect,", True),
        ("GenericError", "HTTP error: error sending request\n    kind: Timeout,", True),
        ("PermissionDeniedError", "403 Forbidden", False),
        ("UnauthenticatedError", "401", False),
    ],
)
def test_obstore_errors_are_classified(name: str, message: str, transient: bool) -> None:
    exceptions = pytest.importorskip("obstore.exceptions")
    from daskzarr_batches.store.policy import is_transient

    assert is_transient(getattr(exceptions, name)(message)) is transient
