"""Object-store backends of a URL: obstore (zarr's ``ObjectStore``) or fsspec.

``open_array("s3://...", backend=...)`` reads through obstore when it is
installed (``"auto"``) and through fsspec otherwise; :func:`resolve_backend`
makes that choice, :func:`url_store` builds the store, and
:func:`obstore_options` translates the fsspec-style ``storage_options`` users
already pass (s3fs, gcsfs, adlfs keys) into obstore's configuration, so the
same options open the same data on either backend.  :func:`obstore_fault`
classifies obstore's exceptions (which carry no status attribute, only their
message) as transient or not, for :func:`store.policy.is_transient`.
"""

from __future__ import annotations

import importlib.util
import json
import re
from datetime import timedelta
from typing import Any, Literal, get_args

import zarr.abc.store
import zarr.storage

from ..errors import ArgumentTypeError, ArgumentValueError, install_hint

__all__ = [
    "BACKENDS",
    "DEFAULT_OBSTORE_RETRY",
    "OBSTORE_PROTOCOLS",
    "Backend",
    "backend_of",
    "error_text",
    "obstore_fault",
    "obstore_installed",
    "obstore_options",
    "resolve_backend",
    "url_store",
]

Backend = Literal["auto", "obstore", "fsspec"]
BACKENDS: tuple[str, ...] = get_args(Backend)

#: URL protocols obstore reads, and the store family of each.
OBSTORE_PROTOCOLS = {
    "s3": "s3",
    "s3a": "s3",
    "gs": "gcs",
    "gcs": "gcs",
    "az": "azure",
    "azure": "azure",
    "abfs": "azure",
    "abfss": "azure",
    "http": "http",
    "https": "http",
}

#: obstore's own retries of one request when ``storage_options`` sets none: two,
#: within 20 s (obstore's default is 10 within 3 minutes).  The read policy
#: (``retries=``, counted in ``stats.retries``) is the retry layer of chunk reads;
#: this keeps a dead store from stalling each request for minutes before the
#: policy sees it, and still retries the metadata requests of ``open_array``.
DEFAULT_OBSTORE_RETRY: dict[str, Any] = {"max_retries": 2, "retry_timeout": timedelta(seconds=20)}


def obstore_installed() -> bool:
    """Whether the obstore package can be imported."""
    return importlib.util.find_spec("obstore") is not None


def resolve_backend(backend: object, protocol: str | None) -> Literal["obstore", "fsspec"] | None:
    """The backend that opens a URL of ``protocol`` (None: not a URL, no backend).

    ``"auto"``: obstore for a protocol it reads when it is installed, else
    fsspec; ``"obstore"`` requires both (an :class:`ArgumentValueError`
    otherwise); ``"fsspec"``: fsspec.
    """
    if not isinstance(backend, str):
        raise ArgumentTypeError(
            f"backend must be one of {', '.join(map(repr, BACKENDS))}, got "
            f"{type(backend).__name__} {backend!r}"
        )
    if backend not in BACKENDS:
        raise ArgumentValueError(
            f"backend must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}"
        )
    if protocol is None:
        return None
    if backend == "fsspec":
        return "fsspec"
    supported = protocol in OBSTORE_PROTOCOLS
    if backend == "auto":
        return "obstore" if supported and obstore_installed() else "fsspec"
    if not supported:
        raise ArgumentValueError(
            f"backend='obstore' reads {', '.join(sorted(OBSTORE_PROTOCOLS))} URLs, not "
            f"{protocol}://; pass backend='fsspec' (or 'auto')"
        )
    if not obstore_installed():
        raise ArgumentValueError(
            "backend='obstore' needs the obstore package, which is not installed; install it "
            f"with {install_hint('obstore')} (or pass backend='fsspec')"
        )
    return "obstore"


def backend_of(store: Any) -> str | None:
    """``"obstore"`` or ``"fsspec"`` for a remote Zarr store, else None."""
    if isinstance(store, zarr.storage.ObjectStore):
        return "obstore"
    if isinstance(store, zarr.storage.FsspecStore):
        return "fsspec"
    return None


def check_url(url: str) -> None:
    """An object-store or http URL names its bucket (container, host), or raise naming it."""
    protocol, rest = url.split("://", 1)
    family = OBSTORE_PROTOCOLS.get(protocol.lower())
    if family is not None and not rest.strip("/"):
        what = {"http": "host", "azure": "container"}.get(family, "bucket")
        raise ArgumentValueError(
            f"the URL {url!r} names no {what}: give one, as in {protocol}://{what}/data.zarr"
        )


def url_store(
    url: str,
    storage_options: dict[str, Any] | None,
    backend: Literal["obstore", "fsspec"],
    read_only: bool = True,
) -> zarr.abc.store.Store:
    """A Zarr store for ``url`` on ``backend`` (see :func:`resolve_backend`); read-only unless
    ``read_only=False`` (an output).

    Raises
    ------
    ArgumentValueError
        ``url`` names no bucket or host (``"s3://"``), or obstore cannot
        build a store of it (the message names the URL; obstore's error
        chained).
    """
    check_url(url)
    if backend == "fsspec":
        return zarr.storage.FsspecStore.from_url(
            url, storage_options=storage_options or None, read_only=read_only
        )
    from obstore.store import from_url

    protocol = url.split("://", 1)[0].lower()
    config, client, retry = obstore_options(protocol, storage_options)
    kwargs: dict[str, Any] = {"client_options": client, "retry_config": retry}
    if config:
        kwargs["config"] = config
    try:
        upstream = from_url(url, **kwargs)
    except Exception as exc:
        error = _config_error(exc, protocol, config, client, retry)
        if error is exc:  # nothing is fetched here: a URL obstore cannot make a store of
            error = ArgumentValueError(f"cannot open {url!r}: {error_text(exc)}")
        raise error from exc
    return zarr.storage.ObjectStore(upstream, read_only=read_only)


# --------------------------------------------------------------------------
# storage_options: fsspec-style keys -> obstore's config, client options, retries

# fsspec keys that tune fsspec's own caches and loops: nothing to translate, ignored.
_FSSPEC_ONLY = frozenset(
    {
        "asynchronous",
        "cache_regions",
        "default_block_size",
        "default_cache_type",
        "default_fill_cache",
        "listings_expiry_time",
        "loop",
        "max_paths",
        "skip_instance_cache",
        "use_listings_cache",
    }
)

# s3fs / botocore names -> obstore S3 config keys
_S3_KEYS = {
    "key": "aws_access_key_id",
    "secret": "aws_secret_access_key",
    "token": "aws_session_token",
    "aws_access_key_id": "aws_access_key_id",
    "aws_secret_access_key": "aws_secret_access_key",
    "aws_session_token": "aws_session_token",
    "region_name": "aws_region",
    "endpoint_url": "aws_endpoint",
}


def obstore_options(
    protocol: str, storage_options: dict[str, Any] | None
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """``(config, client_options, retry_config)`` for obstore from ``storage_options``.

    fsspec-style keys (s3fs: ``key``, ``secret``, ``token``, ``anon``,
    ``endpoint_url``, ``client_kwargs={"endpoint_url", "region_name"}``,
    ``config_kwargs={"connect_timeout", "read_timeout", "retries"}``,
    ``requester_pays``; gcsfs: ``token``; adlfs: ``account_name``,
    ``account_key``, ``sas_token``, ...; any: ``anon``) are translated;
    obstore's own config keys pass through, as do ``client_options`` and
    ``retry_config`` dicts; fsspec's cache settings are ignored.  An http
    endpoint allows plain http.  Keys that mean nothing to obstore raise
    :class:`ArgumentValueError` naming them (when the store is built).
    """
    options = dict(storage_options or {})
    family = OBSTORE_PROTOCOLS[protocol]
    config: dict[str, Any] = {}
    client = dict(_dict_option(options.pop("client_options", None), "client_options"))
    retry = dict(_dict_option(options.pop("retry_config", None), "retry_config"))

    def put(key: str, value: Any, given: str) -> None:
        if key in config and config[key] != value:
            raise ArgumentValueError(
                f"storage_options sets {key} twice with different values (also as {given!r})"
            )
        config[key] = value

    for name in _FSSPEC_ONLY:
        options.pop(name, None)
    anon = options.pop("anon", None)
    if anon:
        put("skip_signature", True, "anon")
    if family == "s3":
        _s3_options(options, put, client, retry)
    elif family == "gcs":
        _gcs_options(options, put)
    elif family == "azure":
        if "sas_token" in options:
            put("sas_key", options.pop("sas_token").lstrip("?"), "sas_token")
    elif family == "http":
        headers = options.pop("headers", None)
        if headers is not None:
            client["default_headers"] = dict(_dict_option(headers, "headers"))
        if options:  # HTTPStore takes no config
            raise ArgumentValueError(
                f"storage_options {_names(options)} mean nothing to obstore's HTTP store "
                "(it takes client_options, retry_config and headers); pass backend='fsspec' "
                "to use fsspec's HTTP filesystem"
            )
    for key, value in options.items():  # obstore's own keys; the store checks them
        put(key, value, key)
    endpoint = next(
        (config[k] for k in ("aws_endpoint", "endpoint", "aws_endpoint_url") if k in config), None
    )
    if isinstance(endpoint, str) and endpoint.startswith("http://"):
        client.setdefault("allow_http", True)
    return config, client, {**DEFAULT_OBSTORE_RETRY, **retry}


def _s3_options(options: dict[str, Any], put: Any, client: dict[str, Any], retry: Any) -> None:
    for name in list(options):
        if name in _S3_KEYS:
            put(_S3_KEYS[name], options.pop(name), name)
    if options.pop("requester_pays", False):
        put("aws_request_payer", True, "requester_pays")
    use_ssl = options.pop("use_ssl", None)
    if use_ssl is False:
        client["allow_http"] = True
    kwargs = dict(_dict_option(options.pop("client_kwargs", None), "client_kwargs"))
    for name in list(kwargs):
        if name in _S3_KEYS:
            put(_S3_KEYS[name], kwargs.pop(name), f"client_kwargs[{name!r}]")
    if kwargs.pop("verify", True) is False:
        client["allow_invalid_certificates"] = True
    if kwargs:
        raise ArgumentValueError(
            f"storage_options client_kwargs {_names(kwargs)} have no obstore equivalent "
            "(translated: endpoint_url, region_name, aws_access_key_id, "
            "aws_secret_access_key, aws_session_token, verify); pass backend='fsspec' to "
            "use s3fs"
        )
    botocore = dict(_dict_option(options.pop("config_kwargs", None), "config_kwargs"))
    for name, target in (("connect_timeout", "connect_timeout"), ("read_timeout", "timeout")):
        if name in botocore:
            client.setdefault(target, timedelta(seconds=float(botocore.pop(name))))
    if "region_name" in botocore:
        put("aws_region", botocore.pop("region_name"), "config_kwargs['region_name']")
    addressing = dict(botocore.pop("s3", None) or {})
    style = addressing.pop("addressing_style", None)
    if style is not None:
        put("aws_virtual_hosted_style_request", style == "virtual", "addressing_style")
    retries = dict(botocore.pop("retries", None) or {})
    retries.pop("mode", None)
    if "total_max_attempts" in retries:
        retry.setdefault("max_retries", max(0, int(retries.pop("total_max_attempts")) - 1))
    if "max_attempts" in retries:  # botocore: retries after the first attempt
        retry.setdefault("max_retries", int(retries.pop("max_attempts")))
    unknown = {**botocore, **({"s3": addressing} if addressing else {}), **retries}
    if unknown:
        raise ArgumentValueError(
            f"storage_options config_kwargs {_names(unknown)} have no obstore equivalent "
            "(translated: connect_timeout, read_timeout, region_name, retries, "
            "s3.addressing_style); pass backend='fsspec' to use s3fs"
        )


def _gcs_options(options: dict[str, Any], put: Any) -> None:
    options.pop("project", None)  # gcsfs bills listing buckets to it; reads need no project
    token = options.pop("token", None)
    if token == "anon":
        put("skip_signature", True, "token")
    elif isinstance(token, dict):
        put("google_service_account_key", json.dumps(token), "token")
    elif isinstance(token, str) and token not in ("google_default", "cloud"):
        put("google_service_account", token, "token")  # a service account JSON file
    elif token not in (None, "google_default", "cloud"):
        raise ArgumentValueError(
            f"storage_options token={token!r} has no obstore equivalent (translated: 'anon', "
            "a service account file or dict, 'google_default'); pass backend='fsspec'"
        )
    if "endpoint_url" in options:
        put("google_base_url", options.pop("endpoint_url"), "endpoint_url")


def _dict_option(value: Any, name: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ArgumentTypeError(
            f"storage_options {name} must be a dict, got {type(value).__name__}"
        )
    return value


def _names(keys: Any) -> str:
    return ", ".join(repr(k) for k in sorted(keys))


def _config_error(
    exc: Exception, protocol: str, config: dict[str, Any], client: Any, retry: Any
) -> Exception:
    """A library error for a store obstore refused to build, naming every unknown key."""
    if type(exc).__name__ != "UnknownConfigurationKeyError" and not isinstance(
        exc, ValueError | TypeError
    ):
        return exc
    from obstore.store import from_url

    url = f"{protocol}://bucket" if OBSTORE_PROTOCOLS[protocol] != "http" else "https://host"
    if OBSTORE_PROTOCOLS[protocol] == "azure":
        url = f"{protocol}://container"
    unknown = []
    for key, value in config.items():
        try:
            from_url(url, config={key: value}, client_options=client, retry_config=retry)  # type: ignore[call-overload]
        except Exception as probe:
            if type(probe).__name__ == "UnknownConfigurationKeyError":
                unknown.append(key)
    if unknown:
        return ArgumentValueError(
            f"storage_options {_names(unknown)} are neither fsspec options obstore's backend "
            f"translates nor obstore config keys of its {OBSTORE_PROTOCOLS[protocol]} store "
            "(docs/reading.md lists both); pass backend='fsspec' for other fsspec options"
        )
    return ArgumentValueError(f"storage_options obstore cannot use: {exc}")


# --------------------------------------------------------------------------
# obstore's errors: transient or not


def error_text(error: BaseException) -> str:
    """``"<class name>: <message>"`` for an error message, without obstore's debug dump.

    obstore appends a multi-line ``Debug source:`` (Rust's debug print of the
    error) to every message; the first part says it all, and the whole error
    stays the ``__cause__``.
    """
    text = str(error).split("\n\nDebug source:", 1)[0].rstrip()
    return f"{type(error).__name__}: {text}"


# obstore's error classes that a retry never fixes.
_OBSTORE_NEVER = frozenset(
    {
        "AlreadyExistsError",
        "InvalidPathError",
        "JoinError",
        "NotFoundError",
        "NotModifiedError",
        "NotSupportedError",
        "PermissionDeniedError",
        "PreconditionError",
        "UnauthenticatedError",
        "UnknownConfigurationKeyError",
    }
)
# object_store's HTTP error kinds that may pass: connection refused or reset, timeouts,
# a body cut short.
_TRANSIENT_KINDS = frozenset({"Connect", "Decode", "Interrupted", "Request", "Timeout"})
_STATUS = re.compile(r"(?:status code: |status: )(\d{3})")
_KIND = re.compile(r"kind: (\w+)")
_CODE = re.compile(r"<Code>(\w+)</Code>")


def obstore_fault(error: BaseException, transient_codes: frozenset[str] | set[str]) -> bool | None:
    """Whether obstore's ``error`` may pass if retried; None if it is not obstore's.

    obstore raises the builtin ``FileNotFoundError`` for a missing object and its
    own classes otherwise; a ``GenericError`` says only in its message what
    happened: an HTTP status (5xx and 429 are transient, as is an S3 error code
    in ``transient_codes`` such as ``SlowDown``), or an HTTP error of a kind in
    ``_TRANSIENT_KINDS`` (connection refused, timeout, ...).
    """
    cls = type(error)
    if not cls.__module__.startswith("obstore"):
        return None
    if cls.__name__ in _OBSTORE_NEVER:
        return False
    text = str(error)
    status = _STATUS.search(text)
    if status is not None:
        code = int(status.group(1))
        if code >= 500 or code == 429:
            return True
        found = _CODE.search(text)
        return found is not None and found.group(1) in transient_codes
    return any(kind in _TRANSIENT_KINDS for kind in _KIND.findall(text))
