"""Opening: a Zarr array (path, URL, store, group) as a dask array of its stored chunk grid.

:func:`open_array` is the public entry point; when it cannot open an array it
says why (a missing path, unreadable metadata, an endpoint it cannot reach)."""

from __future__ import annotations

import asyncio
import json
import os
import warnings
import zipfile
from collections.abc import Sequence
from typing import Any

import dask.array as da
import zarr
import zarr.abc.store

from ..errors import (
    ArgumentTypeError,
    ArgumentValueError,
    ArrayNotFoundError,
    InvalidMetadataError,
    install_hint,
)
from .backends import Backend, backend_of, check_url, error_text, resolve_backend, url_store
from .layout import (
    METADATA_DOCUMENTS,
    V2_ARRAY_METADATA,
    V2_ATTRIBUTES,
    V2_GROUP_METADATA,
    V3_METADATA,
)
from .pipelines import (
    CodecPipelineChoice,
    resolve_codec_pipeline,
    with_codec_pipeline,
)
from .sparse import CategoricalArray, CsrArray, anndata_node
from .zarr_adapter import make_store_path, parse_array_metadata, sync

__all__ = ["open_array"]


def open_array(
    source: Any,
    path: str | None = None,
    *,
    storage_options: dict[str, Any] | None = None,
    codec_pipeline: CodecPipelineChoice | None = None,
    backend: Backend = "auto",
) -> da.Array:
    """Open a Zarr array as a dask array whose chunks are the stored chunks.

    Parameters
    ----------
    source : zarr.Array, zarr.Group, zarr store, str or os.PathLike
        Where the array lives: an open array, a group (then ``path`` names the
        array inside it), a store object, or a path/URL to a directory store,
        a ``.zip`` store or a URL such as ``"s3://bucket/data.zarr"`` (``s3://``,
        ``gs://``, ``az://``, ``https://``, or any fsspec URL).
    path : str, optional
        Path of the array inside a group or store.
    storage_options : dict, optional
        Options of a URL source (credentials, endpoint, ...), fsspec style
        (s3fs: ``key``, ``secret``, ``token``, ``anon``, ``endpoint_url``,
        ``client_kwargs={"endpoint_url": ..., "region_name": ...}``, ...).  On
        the obstore backend they are translated to obstore's configuration
        (``key`` -> ``aws_access_key_id``, ``anon`` -> ``skip_signature``, an
        ``http://`` endpoint allows plain http, ...), and obstore's own config
        keys (``aws_region``, ``google_service_account``, ...) and
        ``client_options`` / ``retry_config`` dicts are accepted too; the table
        is in docs/reading.md.
    backend : {"auto", "obstore", "fsspec"}
        What reads a URL source.  ``"obstore"``: zarr's
        ``zarr.storage.ObjectStore`` over an obstore store (``s3``, ``gs``,
        ``az``/``abfs``, ``http(s)`` URLs; the ``[obstore]`` extra, ``pip
        install '.[obstore]'`` from a clone); ``"fsspec"``: zarr's
        ``FsspecStore`` (any fsspec URL); ``"auto"`` (default): obstore when it is installed
        and reads the URL's protocol, else fsspec.  Ignored for other sources.
    codec_pipeline : {"auto", "zarrs", "zarr"}, optional
        What decodes the array's chunks.  ``"zarrs"``: the Rust pipeline of
        the ``zarrs`` package (the ``[zarrs]`` extra),
        which reads stores it supports natively (a local directory) itself;
        ``"zarr"``: zarr-python's own pipeline (the off switch); ``"auto"``:
        zarrs when it is installed, else zarr's.  An array zarrs cannot read
        natively (another store, a non-native byte order, a data type or
        codec it lacks) is read with zarr's pipeline whatever the choice.
        None (default): the environment variable
        ``DASKZARR_BATCHES_CODEC_PIPELINE`` if set, else ``"auto"``.  Also
        applies to a ``zarr.Array`` passed as ``source`` (a new array object
        over the same store; the one passed is not changed).

    Returns
    -------
    dask.array.Array, CsrArray or CategoricalArray
        ``.chunks`` equals the Zarr chunk grid with edge chunks cropped, and
        ``.dtype`` the Zarr dtype.  Nothing is read until computed.  An
        anndata group is the array it encodes: a ``csr_matrix`` group a
        [`CsrArray`][daskzarr_batches.CsrArray] (rows streamed as
        ``scipy.sparse`` CSR batches; ``indptr`` read now), a categorical
        column (``"obs/cell_type"``) a
        ``CategoricalArray`` (its codes, a zarr array, and its ``categories``;
        ``np.asarray(column)`` reads the codes).

    Raises
    ------
    ArrayNotFoundError
        No array at ``source``/``path`` (or no such ``.zip`` file); the
        message lists the arrays that do exist.
    ArgumentTypeError
        ``source`` is not something Zarr can open, or ``path`` is not a str.
    ArgumentValueError
        ``path`` has a ``..`` or ``.`` segment (a Zarr path only goes down),
        or a ``.zip`` path is not a zip file; a URL whose filesystem package
        is not installed (the message says which extra to install, e.g.
        ``pip install '.[s3]'`` from a clone); a store that cannot be
        reached or refuses the credentials (the message names the source,
        the original error is the ``__cause__``); a ``codec_pipeline`` (or
        environment variable) that is not one of the choices, or
        ``"zarrs"`` when the zarrs package is not installed (the message
        says how to install it); a ``backend`` that is not one of the choices,
        ``"obstore"`` when obstore is not installed or does not read the
        URL's protocol, or ``storage_options`` the obstore backend can
        neither translate nor pass on (the message names them).
    """
    choice = resolve_codec_pipeline(codec_pipeline)
    node = _open_zarr(source, path, storage_options, backend)
    if isinstance(node, CsrArray):  # anndata's sparse rows: read with the pipeline chosen
        return CsrArray(node.group, choice)  # type: ignore[return-value]
    if isinstance(node, CategoricalArray):
        return node  # type: ignore[return-value]
    return da.from_zarr(with_codec_pipeline(node, choice))


def _open_zarr(
    source: Any, path: str | None, storage_options: dict[str, Any] | None, backend: object = "auto"
) -> zarr.Array | CsrArray | CategoricalArray:
    _check_path(path)
    chosen = resolve_backend(backend, _url_protocol(source))
    if chosen is not None:
        check_url(source)
    if isinstance(source, zarr.Array):
        if path not in (None, ""):
            raise ArgumentValueError(
                f"path={path!r} was given but source is already an array ({source.store_path})"
            )
        return source
    if isinstance(source, zarr.Group):
        return _array_in_group(source, path, where=str(source.store_path))
    if isinstance(source, os.PathLike):
        source = os.fspath(source)
    named = source  # how messages refer to it (a zip path rather than its ZipStore)
    if isinstance(source, str) and source.endswith(".zip") and not os.path.isdir(source):
        source = _zip_store(source)
    elif chosen == "obstore":
        source = url_store(source, storage_options, "obstore")
        storage_options = None  # translated into the store
    elif storage_options and isinstance(source, str) and source.startswith(_FSSPEC_LOCAL):
        # fsspec's store made here: zarr >= 3.4 refuses storage_options for memory://
        # and file:// URLs, which it routes to fsspec all the same
        source = url_store(source, storage_options, "fsspec")
        storage_options = None
    if not isinstance(source, str | zarr.abc.store.Store | dict):
        raise ArgumentTypeError(
            "source must be a zarr.Array, zarr.Group, zarr store, path or URL, "
            f"got {type(source).__name__}"
        )
    kwargs: dict[str, Any] = {"mode": "r"}
    if storage_options:  # zarr rejects even {} for local paths and store objects
        kwargs["storage_options"] = storage_options
    try:
        node = zarr.open(store=source, **kwargs)
    except Exception as exc:
        # A missing filesystem package, an unreachable store or refused credentials:
        # looking at the documents would only repeat the failing request.
        _raise_if_unreadable(exc, repr(named), _url_protocol(named))
        # Zarr reports a broken metadata document as anything from "not found"
        # to a JSONDecodeError: look at the documents before believing it.
        root = _root_store_path(source, storage_options)
        _raise_if_invalid_metadata(root, [""], repr(named), exc)
        if isinstance(exc, FileNotFoundError | KeyError):
            raise ArrayNotFoundError(f"no Zarr array or group at {named!r}") from exc
        if isinstance(exc, zipfile.BadZipFile):  # passed is_zipfile, but its directory is broken
            raise ArgumentValueError(f"{named!r} is not a zip file Zarr can read: {exc}") from exc
        if isinstance(exc, TypeError):  # e.g. storage_options for a local path
            raise ArgumentTypeError(f"cannot open {named!r} as Zarr: {exc}") from exc
        if isinstance(exc, ValueError):  # e.g. an unknown URL protocol
            raise ArgumentValueError(f"cannot open {named!r} as Zarr: {exc}") from exc
        raise
    if isinstance(node, zarr.Array):
        if path not in (None, ""):
            raise ArrayNotFoundError(
                f"{named!r} holds a single array, not a group; there is nothing at path {path!r}"
            )
        return node
    return _array_in_group(node, path, where=repr(named))


# The extra of this package that installs the filesystem of a URL protocol.
_PROTOCOL_EXTRAS = {"s3": "s3", "s3a": "s3"}


# Packages whose exceptions say a remote store could not be reached or refused the
# request (botocore's are not OSErrors).
_NETWORK_PACKAGES = frozenset({"aiobotocore", "aiohttp", "botocore", "obstore", "s3fs", "urllib3"})


def _raise_if_unreadable(error: BaseException, where: str, protocol: str | None) -> None:
    """Library errors for a store that cannot be read at all, naming it (``where``).

    ``protocol`` is the URL protocol of a remote store (None for a local one).
    A URL whose fsspec filesystem is not installed (fsspec raises a bare
    ImportError), and a store that is unreachable or refuses the credentials
    (PermissionError, timeouts, botocore's connection errors, ...) raise
    :class:`ArgumentValueError`, with the original error as ``__cause__``;
    anything else is left to the caller.
    """
    if protocol is not None and isinstance(error, ImportError):
        extra = _PROTOCOL_EXTRAS.get(protocol)
        hint = (
            f"install it with {install_hint(extra)}"
            if extra is not None
            else "install the fsspec filesystem package for it"
        )
        raise ArgumentValueError(
            f"cannot open {where}: {protocol}:// URLs need a package that is not installed "
            f"({error}); {hint}"
        ) from error
    if not _is_access_failure(error, remote=protocol is not None):
        return
    raise ArgumentValueError(
        f"cannot read {where}: {error_text(error)}; check the credentials and "
        "endpoint in storage_options and that this machine can reach the store"
    ) from error


def _url_protocol(source: Any) -> str | None:
    """The protocol of an fsspec URL such as ``s3://bucket/data.zarr``, or None."""
    if isinstance(source, str) and "://" in source:
        return source.split("://", 1)[0].lower()
    return None


def _is_remote(group: zarr.Group) -> bool:
    """Whether ``group`` lives in a remote (fsspec or obstore) store."""
    return backend_of(group.store_path.store) is not None


def _is_access_failure(error: BaseException, *, remote: bool) -> bool:
    """Whether ``error`` says the store could not be reached or refused access.

    "Not found" is not one of them (it becomes ArrayNotFoundError).  For a URL
    any other OSError counts (s3fs turns an unexpected S3 error into
    ``OSError(EIO)``); for a local store only permissions, connections and
    timeouts do, so that local errors keep their meaning.
    """
    if isinstance(error, FileNotFoundError):
        return False
    if isinstance(error, PermissionError | ConnectionError | TimeoutError):
        return True
    if remote and isinstance(error, OSError):
        return True
    packages = {cls.__module__.split(".")[0] for cls in type(error).__mro__}
    return bool(packages & _NETWORK_PACKAGES)


def _check_path(path: object) -> None:
    """A path inside a group or store: None, or a str whose segments only go down."""
    if path is None:
        return
    if not isinstance(path, str):
        raise ArgumentTypeError(
            "path must be a str naming an array inside the group or store (such as "
            f"'images' or 'train/images'), got {type(path).__name__} {path!r}"
        )
    for segment in path.strip("/").split("/"):
        if segment in (".", ".."):
            raise ArgumentValueError(
                f"path {path!r} has a {segment!r} segment; a Zarr path names a node below "
                "the group or store and cannot go up (or name the same node): open the "
                "parent group or store and give the path from there"
            )


#: URL schemes zarr >= 3.4 routes to fsspec but refuses ``storage_options`` for.
_FSSPEC_LOCAL = ("memory://", "file://")


def _zip_store(path: str) -> zarr.storage.ZipStore:
    """Open ``path`` as a read-only zip store, with library errors for non-zip files."""
    if not os.path.exists(path):
        raise ArrayNotFoundError(f"no Zarr array or group at {path!r}: no such file")
    if not zipfile.is_zipfile(path):
        raise ArgumentValueError(
            f"{path!r} is not a zip file; a path ending in .zip is opened as a zipped Zarr "
            "store (zarr.storage.ZipStore)"
        )
    return zarr.storage.ZipStore(path, mode="r")


def _array_in_group(
    group: zarr.Group, path: str | None, where: str
) -> zarr.Array | CsrArray | CategoricalArray:
    inner = "" if path is None else path.strip("/")
    node: Any = None
    error: Exception | None = None
    if inner:
        try:
            node = group[inner]
        except Exception as exc:  # KeyError when missing; anything when metadata is broken
            error = exc
        if isinstance(node, zarr.Array):
            return node
    else:
        node = group
    encoded = anndata_node(node)  # an anndata csr_matrix or categorical group
    if encoded is not None:
        return encoded
    # Nothing usable: a broken document on the way explains it better than "not found".
    parts = inner.split("/") if inner else []
    on_the_way = ["", *("/".join(parts[: i + 1]) for i in range(len(parts)))]
    if error is not None:  # e.g. the connection failed between two requests
        _raise_if_unreadable(error, where, "remote" if _is_remote(group) else None)
    _raise_if_invalid_metadata(group.store_path, on_the_way, where, error)
    if error is not None and not isinstance(error, KeyError):
        raise error
    listing = _list_arrays(group)
    if not inner:
        raise ArrayNotFoundError(
            f"{where} is a group; pass path= to choose one of its arrays: {listing}"
        )
    what = "a group" if isinstance(node, zarr.Group) else "no array"
    raise ArrayNotFoundError(f"{what} at path {path!r} in {where}; arrays that exist: {listing}")


# Fields an array document must have (the format 3 and format 2 specifications;
# zarr-python requires every one of them too).
_ARRAY_FIELDS = {
    V3_METADATA: (
        "shape",
        "data_type",
        "chunk_grid",
        "chunk_key_encoding",
        "fill_value",
        "codecs",
    ),
    V2_ARRAY_METADATA: ("shape", "chunks", "dtype", "fill_value", "order"),
}


def _document_problem(key: str, raw: bytes) -> str | None:
    """What is wrong with the metadata document ``key`` holding ``raw``, or None."""
    try:
        document = json.loads(raw)
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        return f"not valid JSON ({exc})"
    if not isinstance(document, dict):
        return f"not a JSON object but a JSON {type(document).__name__}"
    if key == V2_ATTRIBUTES:
        return None
    expected_format = 3 if key == V3_METADATA else 2
    required = ["zarr_format", "node_type"] if key == V3_METADATA else ["zarr_format"]
    if key != V2_GROUP_METADATA and document.get("node_type", "array") == "array":
        required += _ARRAY_FIELDS[key]
    missing = [name for name in required if name not in document]
    if missing:
        return (
            "missing required field"
            + ("s " if len(missing) > 1 else " ")
            + ", ".join(repr(name) for name in missing)
        )
    if document["zarr_format"] != expected_format:
        return f"zarr_format is {document['zarr_format']!r}, expected {expected_format}"
    if key == V2_GROUP_METADATA or document.get("node_type") == "group":
        return None
    if key == V3_METADATA and document["node_type"] != "array":
        return f"node_type is {document['node_type']!r}, expected 'array' or 'group'"
    try:
        with warnings.catch_warnings():  # e.g. dtypes without a stable specification
            warnings.simplefilter("ignore")
            parse_array_metadata(document, 3 if key == V3_METADATA else 2)
    except Exception as exc:
        return f"Zarr cannot parse it ({type(exc).__name__}: {exc})"
    return None


def _node_problem(path: str, documents: dict[str, bytes]) -> str | None:
    """``'<path>/<key>': <problem>`` for the first invalid document, or None."""
    for key, raw in documents.items():
        problem = _document_problem(key, raw)
        if problem is not None:
            return f"{(path + '/' + key if path else key)!r}: {problem}"
    return None


def _metadata_problem(store_path: Any, paths: Sequence[str]) -> str | None:
    """The first invalid metadata document of the nodes at ``paths``, or None.

    Best effort: only called to explain a failure, so a store that cannot be
    read here gives None and the original error stands.
    """

    async def first() -> str | None:
        for path in paths:
            problem = _node_problem(path, await _node_documents(store_path, path))
            if problem is not None:
                return problem
        return None

    try:
        return sync(first())
    except Exception:
        return None


def _raise_if_invalid_metadata(
    store_path: Any, paths: Sequence[str], where: str, error: Exception | None
) -> None:
    if store_path is None:
        return
    problem = _metadata_problem(store_path, paths)
    if problem is not None:
        raise InvalidMetadataError(f"invalid metadata in {where} at {problem}") from error


def _root_store_path(source: Any, storage_options: dict[str, Any] | None) -> Any:
    """The StorePath zarr.open made of ``source``, to look at its documents, or None."""
    try:
        return sync(make_store_path(source, storage_options=storage_options or None))
    except Exception:
        return None


def _list_arrays(group: zarr.Group) -> str:
    """The arrays below ``group`` for an error message, with members Zarr cannot parse."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            arrays = sorted(
                name for name, node in group.members(max_depth=None) if isinstance(node, zarr.Array)
            )
            failure: Exception | None = None
        except Exception as exc:  # a member's metadata is broken
            arrays, failure = [], exc
    if failure is not None or caught:  # zarr skips (with a warning) what it cannot parse
        walked = _walk_arrays(group.store_path)
        if walked is not None and (walked[1] or failure is not None):
            arrays, problems = walked
            listing = ", ".join(repr(a) for a in arrays) if arrays else "none"
            return "; ".join([listing, *(f"invalid metadata at {p}" for p in problems)])
    for warning in caught:
        warnings.warn(warning.message, warning.category, stacklevel=3)
    if failure is not None:
        return f"none could be listed ({type(failure).__name__}: {failure})"
    return ", ".join(repr(a) for a in arrays) if arrays else "none"


def _walk_arrays(store_path: Any) -> tuple[list[str], list[str]] | None:
    """Arrays and invalid metadata documents below a group, by listing its store.

    Used only when ``Group.members`` fails or skips members; None if the store
    cannot be listed.
    """
    arrays: list[str] = []
    problems: list[str] = []

    async def walk(path: str) -> None:
        prefix = (store_path / path).path if path else store_path.path
        names = sorted([name async for name in store_path.store.list_dir(prefix)])
        for name in names:
            if name in METADATA_DOCUMENTS:
                continue
            child = f"{path}/{name}" if path else name
            documents = await _node_documents(store_path, child)
            problem = _node_problem(child, documents)
            if problem is not None:
                problems.append(problem)
            elif V3_METADATA in documents:
                node_type = json.loads(documents[V3_METADATA])["node_type"]
                if node_type == "array":
                    arrays.append(child)
                else:
                    await walk(child)
            elif V2_ARRAY_METADATA in documents:
                arrays.append(child)
            elif V2_GROUP_METADATA in documents:
                await walk(child)

    try:
        sync(walk(""))
    except Exception:
        return None
    return arrays, problems


async def _node_documents(store_path: Any, path: str) -> dict[str, bytes]:
    """The metadata documents stored for the node at ``path`` below ``store_path``."""
    node = store_path / path if path else store_path
    found = await asyncio.gather(*((node / key).get() for key in METADATA_DOCUMENTS))
    return {
        key: buffer.to_bytes()
        for key, buffer in zip(METADATA_DOCUMENTS, found, strict=True)
        if buffer is not None
    }
