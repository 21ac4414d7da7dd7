"""Sources: anything array-like as a dask array whose chunks are the stored chunks.

:func:`open_array` is the public entry point.  Internally every stream works on
a :class:`Source`: a description of one array (name, shape, dtype, chunk
grid) and what a worker needs to read it.  Sources know nothing of tasks or
graphs; the read layer (``_read``) builds those from them.

Two kinds exist:

:class:`SliceSource`
    Zarr arrays and numpy arrays, read by slicing the array object inside a
    task, so the error for a chunk that cannot be decoded names the array and
    the chunk.  A dask array made by :func:`open_array` (or ``da.from_zarr``
    without rechunking) is recognised and read this way too.
:class:`DaskSource`
    Any other dask array, read through its own (optimised) graph.
"""

from __future__ import annotations

import asyncio
import copy
import importlib
import itertools
import json
import math
import os
import sys
import warnings
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, get_args

import dask.array as da
import numpy as np
import zarr
import zarr.abc.store
from dask.tokenize import normalize_token

from ..errors import (
    ArgumentTypeError,
    ArgumentValueError,
    ArrayNotFoundError,
    InvalidMetadataError,
)

__all__ = [
    "CODEC_PIPELINE_ENV",
    "CodecPipelineChoice",
    "DaskSource",
    "SliceSource",
    "Source",
    "as_source",
    "codec_pipeline_of",
    "open_array",
    "resolve_codec_pipeline",
    "with_codec_pipeline",
    "zarr_pipeline",
]

Chunks = tuple[tuple[int, ...], ...]

#: Values of ``open_array(..., codec_pipeline=)``.
CodecPipelineChoice = Literal["auto", "zarrs", "zarr"]
#: The environment variable read when ``codec_pipeline`` is None.
CODEC_PIPELINE_ENV = "DASKZARR_BATCHES_CODEC_PIPELINE"


def open_array(
    source: Any,
    path: str | None = None,
    *,
    storage_options: dict[str, Any] | None = None,
    codec_pipeline: CodecPipelineChoice | None = None,
) -> da.Array:
    """Open a Zarr array as a dask array whose chunks are the stored chunks.

    Parameters
    ----------
    source : zarr.Array, zarr.Group, zarr store, str or os.PathLike
        Where the array lives: an open array, a group (then ``path`` names the
        array inside it), a store object, or a path/URL to a directory store,
        a ``.zip`` store or an fsspec URL such as ``"s3://bucket/data.zarr"``.
    path : str, optional
        Path of the array inside a group or store.
    storage_options : dict, optional
        Passed to fsspec for URL sources (credentials, endpoint, ...).
    codec_pipeline : {"auto", "zarrs", "zarr"}, optional
        What decodes the array's chunks.  ``"zarrs"``: the Rust pipeline of
        the ``zarrs`` package (``pip install 'daskzarr-batches[zarrs]'``),
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
    dask.array.Array
        ``.chunks`` equals the Zarr chunk grid with edge chunks cropped, and
        ``.dtype`` the Zarr dtype.  Nothing is read until computed.

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
        ``pip install 'daskzarr-batches[s3]'``); a store that cannot be
        reached or refuses the credentials (the message names the source,
        the original error is the ``__cause__``); a ``codec_pipeline`` (or
        environment variable) that is not one of the choices, or
        ``"zarrs"`` when the zarrs package is not installed (the message
        says how to install it).
    """
    choice = resolve_codec_pipeline(codec_pipeline)
    array = with_codec_pipeline(_open_zarr(source, path, storage_options), choice)
    return da.from_zarr(array)


# --------------------------------------------------------------------------
# Codec pipelines: zarr-python's own, or the Rust one of the zarrs package


def resolve_codec_pipeline(value: object) -> Literal["zarrs", "zarr"]:
    """The pipeline ``open_array(..., codec_pipeline=value)`` reads with.

    None reads :data:`CODEC_PIPELINE_ENV` (unset or empty: ``"auto"``);
    ``"auto"`` is ``"zarrs"`` when the zarrs package imports, else ``"zarr"``.
    """
    where = "codec_pipeline"
    if value is None:
        env = os.environ.get(CODEC_PIPELINE_ENV, "").strip()
        where = f"the environment variable {CODEC_PIPELINE_ENV}"
        value = env.lower() if env else "auto"
    if not isinstance(value, str):
        raise ArgumentTypeError(
            f"codec_pipeline must be one of {get_args(CodecPipelineChoice)} or None, "
            f"got {type(value).__name__} {value!r}"
        )
    if value not in get_args(CodecPipelineChoice):
        raise ArgumentValueError(
            f"{where} must be one of {get_args(CodecPipelineChoice)}, got {value!r}"
        )
    if value == "zarr":
        return "zarr"
    problem = _zarrs_import_problem()
    if problem is None:
        return "zarrs"
    if value == "zarrs":
        raise ArgumentValueError(
            f"{where} is 'zarrs' but the zarrs package cannot be imported ({problem}); "
            "install it with pip install 'daskzarr-batches[zarrs]', or choose 'auto' "
            "(zarrs when installed) or 'zarr'"
        )
    return "zarr"


def _zarrs_import_problem() -> str | None:
    """Why the zarrs package cannot be used here, or None if it can."""
    try:
        importlib.import_module("zarrs.pipeline")
    except Exception as exc:  # not installed, or built for another zarr
        return f"{type(exc).__name__}: {exc}"
    return None


#: zarrs decodes on process-wide Rust threads, started as soon as a zarrs pipeline is
#: built; a process forked after that inherits them as dead threads, and a zarrs read
#: there waits forever (measured with zarrs 0.2.3: a forked child of a process that only
#: opened an array with zarrs hangs on its first read).  Such a child reads with zarr's
#: pipeline instead: ``"used"`` is set in a process that built or met a zarrs pipeline,
#: ``"forked"`` in its forked children.
_zarrs_state = {"used": False, "forked": False}


def _zarrs_after_fork() -> None:
    if _zarrs_state["used"]:
        _zarrs_state["forked"] = True


os.register_at_fork(after_in_child=_zarrs_after_fork)


def codec_pipeline_of(array: Any) -> Literal["zarrs", "zarr"]:
    """``"zarrs"`` if zarrs' Rust pipeline reads ``array`` natively here, else ``"zarr"``.

    A zarrs pipeline that could not be set up for the array (zarrs warned
    and falls back to Python codecs) counts as ``"zarr"``, and so does any
    zarrs pipeline in a process forked after zarrs was used (its threads
    did not survive the fork: such a process reads with zarr's pipeline).
    """
    pipeline = getattr(getattr(array, "_async_array", None), "codec_pipeline", None)
    if not _is_zarrs(pipeline) or getattr(pipeline, "impl", None) is None:
        return "zarr"
    _zarrs_state["used"] = True
    return "zarr" if _zarrs_state["forked"] else "zarrs"


def _is_zarrs(pipeline: object) -> bool:
    return type(pipeline).__module__.split(".")[0] == "zarrs" and hasattr(pipeline, "impl")


def with_codec_pipeline(array: zarr.Array, choice: Literal["zarrs", "zarr"]) -> zarr.Array:
    """``array`` read with ``choice`` (a new array object, the same store and metadata).

    ``"zarrs"`` falls back to zarr's pipeline for an array zarrs cannot read
    natively; ``"zarr"`` replaces only a zarrs pipeline (any other pipeline
    the array was built with is kept).  No I/O, no warning, and zarr.config
    is not touched (the pipeline object is built directly).
    """
    inner = array._async_array
    if choice == "zarrs" and codec_pipeline_of(array) == "zarrs":
        return array
    pipeline = _zarrs_pipeline(array) if choice == "zarrs" else None
    if pipeline is None:
        if not _is_zarrs(inner.codec_pipeline):
            return array
        pipeline = zarr_pipeline(inner.metadata)
    view = copy.copy(inner)
    object.__setattr__(view, "codec_pipeline", pipeline)
    return zarr.Array(view)


def zarr_pipeline(metadata: Any) -> Any:
    """zarr-python's own codec pipeline for an array's ``metadata``."""
    from zarr.codecs._v2 import V2Codec
    from zarr.core.codec_pipeline import BatchedCodecPipeline
    from zarr.core.metadata import ArrayV3Metadata

    if isinstance(metadata, ArrayV3Metadata):
        return BatchedCodecPipeline.from_codecs(metadata.codecs)
    return BatchedCodecPipeline.from_codecs(
        [V2Codec(filters=metadata.filters, compressor=metadata.compressor)]
    )


@normalize_token.register_lazy("zarrs")
def _register_zarrs_token() -> None:
    """Tokenize a zarrs pipeline by what it pickles (its metadata and store).

    dask tokenizes graph values (a distributed client does, deterministically),
    walking dataclass fields; the Rust object a zarrs pipeline holds cannot be
    tokenized, but it is rebuilt from the metadata and store when unpickled.
    """
    import zarrs.pipeline

    @normalize_token.register(zarrs.pipeline.ZarrsCodecPipeline)
    def _(pipeline: Any) -> Any:
        return type(pipeline).__name__, normalize_token(pipeline.__getstate__())


# Kinds of numpy dtypes zarrs' pipeline hands back to Python codecs (or refuses).
_ZARRS_UNSUPPORTED_KINDS = frozenset("VSUMmOT")


def _zarrs_pipeline(array: zarr.Array) -> Any:
    """A zarrs pipeline reading ``array`` natively, or None if zarrs cannot."""
    dtype = np.dtype(array.dtype)
    if not dtype.isnative or dtype.kind in _ZARRS_UNSUPPORTED_KINDS:
        return None  # zarrs raises for a non-native byte order
    if _zarrs_state["forked"]:
        return None
    _zarrs_state["used"] = True
    try:
        import zarrs
        from zarrs.pipeline import get_codec_pipeline_fallback, get_codec_pipeline_impl

        inner = array._async_array
        store = inner.store_path.store
        # strict: an unsupported array raises instead of warning; an unsupported
        # store raises NotImplementedError
        impl = get_codec_pipeline_impl(inner.metadata, store, strict=True)
        if impl is None:
            return None
        fallback = get_codec_pipeline_fallback(inner.metadata, strict=False)
    except Exception:
        return None
    return zarrs.ZarrsCodecPipeline(
        metadata=inner.metadata, store=store, impl=impl, python_impl=fallback
    )


def _open_zarr(source: Any, path: str | None, storage_options: dict[str, Any] | None) -> zarr.Array:
    _check_path(path)
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
            raise ArrayNotFoundError(f"no Zarr array or group at {source!r}") from exc
        if isinstance(exc, zipfile.BadZipFile):  # passed is_zipfile, but its directory is broken
            raise ArgumentValueError(f"{named!r} is not a zip file Zarr can read: {exc}") from exc
        if isinstance(exc, TypeError):  # e.g. storage_options for a local path
            raise ArgumentTypeError(f"cannot open {source!r} as Zarr: {exc}") from exc
        if isinstance(exc, ValueError):  # e.g. an unknown URL protocol
            raise ArgumentValueError(f"cannot open {source!r} as Zarr: {exc}") from exc
        raise
    if isinstance(node, zarr.Array):
        if path not in (None, ""):
            raise ArrayNotFoundError(
                f"{source!r} holds a single array, not a group; there is nothing at path {path!r}"
            )
        return node
    return _array_in_group(node, path, where=repr(named))


# The extra of this package that installs the filesystem of a URL protocol.
_PROTOCOL_EXTRAS = {"s3": "s3", "s3a": "s3"}
# Packages whose exceptions say a remote store could not be reached or refused the
# request (botocore's are not OSErrors).
_NETWORK_PACKAGES = frozenset({"aiobotocore", "aiohttp", "botocore", "s3fs", "urllib3"})


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
            f"install it with pip install 'daskzarr-batches[{extra}]'"
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
        f"cannot read {where}: {type(error).__name__}: {error}; check the credentials and "
        "endpoint in storage_options and that this machine can reach the store"
    ) from error


def _url_protocol(source: Any) -> str | None:
    """The protocol of an fsspec URL such as ``s3://bucket/data.zarr``, or None."""
    if isinstance(source, str) and "://" in source:
        return source.split("://", 1)[0].lower()
    return None


def _is_remote(group: zarr.Group) -> bool:
    """Whether ``group`` lives in an fsspec (remote) store."""
    return isinstance(group.store_path.store, zarr.storage.FsspecStore)


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


def _array_in_group(group: zarr.Group, path: str | None, where: str) -> zarr.Array:
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


# Metadata documents of a node: Zarr format 3, then format 2.
_METADATA_DOCUMENTS = ("zarr.json", ".zarray", ".zgroup", ".zattrs")
# Fields an array document must have (the format 3 and format 2 specifications;
# zarr-python requires every one of them too).
_ARRAY_FIELDS = {
    "zarr.json": (
        "shape",
        "data_type",
        "chunk_grid",
        "chunk_key_encoding",
        "fill_value",
        "codecs",
    ),
    ".zarray": ("shape", "chunks", "dtype", "fill_value", "order"),
}


def _document_problem(key: str, raw: bytes) -> str | None:
    """What is wrong with the metadata document ``key`` holding ``raw``, or None."""
    try:
        document = json.loads(raw)
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        return f"not valid JSON ({exc})"
    if not isinstance(document, dict):
        return f"not a JSON object but a JSON {type(document).__name__}"
    if key == ".zattrs":
        return None
    expected_format = 3 if key == "zarr.json" else 2
    required = ["zarr_format", "node_type"] if key == "zarr.json" else ["zarr_format"]
    if key != ".zgroup" and document.get("node_type", "array") == "array":
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
    if key == ".zgroup" or document.get("node_type") == "group":
        return None
    if key == "zarr.json" and document["node_type"] != "array":
        return f"node_type is {document['node_type']!r}, expected 'array' or 'group'"
    from zarr.core.metadata.v2 import ArrayV2Metadata
    from zarr.core.metadata.v3 import ArrayV3Metadata

    parse = ArrayV3Metadata.from_dict if key == "zarr.json" else ArrayV2Metadata.from_dict
    try:
        with warnings.catch_warnings():  # e.g. dtypes without a stable specification
            warnings.simplefilter("ignore")
            parse(dict(document))
    except Exception as exc:
        return f"Zarr cannot parse it ({type(exc).__name__}: {exc})"
    return None


async def _node_documents(store_path: Any, path: str) -> dict[str, bytes]:
    """The metadata documents stored for the node at ``path`` below ``store_path``."""
    node = store_path / path if path else store_path
    found = await asyncio.gather(*((node / key).get() for key in _METADATA_DOCUMENTS))
    return {
        key: buffer.to_bytes()
        for key, buffer in zip(_METADATA_DOCUMENTS, found, strict=True)
        if buffer is not None
    }


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
    from zarr.core.sync import sync

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
        from zarr.core.sync import sync
        from zarr.storage._common import make_store_path

        return sync(make_store_path(source, mode="r", storage_options=storage_options or None))
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
    from zarr.core.sync import sync

    arrays: list[str] = []
    problems: list[str] = []

    async def walk(path: str) -> None:
        prefix = (store_path / path).path if path else store_path.path
        names = sorted([name async for name in store_path.store.list_dir(prefix)])
        for name in names:
            if name in _METADATA_DOCUMENTS:
                continue
            child = f"{path}/{name}" if path else name
            documents = await _node_documents(store_path, child)
            problem = _node_problem(child, documents)
            if problem is not None:
                problems.append(problem)
            elif "zarr.json" in documents:
                node_type = json.loads(documents["zarr.json"])["node_type"]
                if node_type == "array":
                    arrays.append(child)
                else:
                    await walk(child)
            elif ".zarray" in documents:
                arrays.append(child)
            elif ".zgroup" in documents:
                await walk(child)

    try:
        sync(walk(""))
    except Exception:
        return None
    return arrays, problems


# --------------------------------------------------------------------------
# Sources used by the read layer


@dataclass(frozen=True)
class Source:
    """An array the streams can read, with its chunk grid.

    Attributes
    ----------
    name : str
        How errors refer to the array (store path for Zarr arrays).
    shape : tuple of int
    dtype : numpy.dtype
    chunks : tuple of tuple of int
        Dask-style chunk sizes per axis, edge chunks cropped.
    """

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    chunks: Chunks

    @property
    def n_samples(self) -> int:
        """Length of axis 0."""
        return self.shape[0]

    @property
    def row_bytes(self) -> int:
        """Decoded bytes of one sample (one row of axis 0)."""
        return math.prod(self.shape[1:]) * self.dtype.itemsize

    def blocks(self) -> Iterator[tuple[int, ...]]:
        """Block indices of every non-empty stored chunk, in C order."""
        return itertools.product(
            *([i for i, size in enumerate(sizes) if size > 0] for sizes in self.chunks)
        )

    def block_slices(self, block: tuple[int, ...]) -> tuple[slice, ...]:
        """Index of ``block`` in array coordinates."""
        slices = []
        for axis, i in enumerate(block):
            start = sum(self.chunks[axis][:i])
            slices.append(slice(start, start + self.chunks[axis][i]))
        return tuple(slices)


@dataclass(frozen=True)
class SliceSource(Source):
    """A Zarr or numpy array, read by slicing it inside a task.

    ``token`` is unique per source object: graphs hold the array under a key
    made from it, so two arrays never share a key.  ``shards`` is the shard
    shape of a sharded Zarr array (each shard one stored object holding
    several chunks and an index of their byte ranges), ``None`` otherwise.
    """

    array: Any = field(repr=False, default=None)
    token: str = field(repr=False, default="")
    shards: tuple[int, ...] | None = None

    @property
    def stored(self) -> bool:
        """Whether the array is read from a Zarr store (not a numpy array)."""
        return isinstance(self.array, zarr.Array)

    @property
    def shard_rows(self) -> int | None:
        """Samples (axis-0 rows) per shard; ``None`` for unsharded or non-Zarr arrays."""
        return None if self.shards is None else self.shards[0]

    @property
    def chunk_keys_per_row(self) -> int:
        """Stored objects (chunks or shards) per axis-0 chunk or shard row.

        1 unless the array is also split along other axes.
        """
        grid = self.shards or tuple(sizes[0] if sizes else 0 for sizes in self.chunks)
        return math.prod(
            -(-size // step) if step else 1
            for size, step in zip(self.shape[1:], grid[1:], strict=True)
        )

    @property
    def inner_per_key(self) -> int:
        """Chunks along the other axes inside one shard (1 when unsharded)."""
        if self.shards is None:
            return 1
        inner = [sizes[0] for sizes in self.chunks[1:]]
        return math.prod(
            max(1, shard // chunk) if chunk else 1
            for shard, chunk in zip(self.shards[1:], inner, strict=True)
        )

    @property
    def carries_data(self) -> bool:
        """Whether pickling the array copies its data (numpy, Zarr in memory).

        Such a source is sent to a cluster's workers once per stream instead
        of inside every graph.
        """
        if isinstance(self.array, np.ndarray):
            return True
        store = getattr(self.array, "store", None)
        while isinstance(store, zarr.storage.WrapperStore):  # a latency or logging wrapper
            store = store._store
        return isinstance(store, zarr.storage.MemoryStore)


@dataclass(frozen=True)
class DaskSource(Source):
    """A general dask array, read through its own graph."""

    array: da.Array = field(repr=False, default=None)  # type: ignore[assignment]
    graph: dict[Any, Any] = field(repr=False, default_factory=dict)


def as_source(array: Any, role: str = "array") -> Source:
    """Validate ``array`` and wrap it as a :class:`Source`.

    ``role`` ("array", "features", "labels") names it in error messages.

    An ``xarray.DataArray`` stands for its data (see :func:`_xarray_data`),
    samples along its first dimension; errors name it after its ``.name``.

    Raises
    ------
    ArgumentTypeError
        ``array`` is not an array, is a masked array (whose mask would be
        dropped), or has a dtype that is not fixed-size numbers (strings,
        bytes, Python objects; see :func:`_check_dtype`).
    ArgumentValueError
        ``array`` is 0-d, or a dask array with unknown chunk sizes.
    """
    if isinstance(array, Source):
        return array
    if is_xarray(array, "DataArray"):
        label = None if array.name is None else f"DataArray {str(array.name)!r}"
        if label is not None and str(array.name) != role:
            role = f"{role} ({label})"
        source = _as_source(_xarray_data(array), role)
        return source if label is None else replace(source, name=f"{label} ({source.name})")
    return _as_source(array, role)


def is_xarray(obj: Any, kind: str) -> bool:
    """Whether ``obj`` is an ``xarray.<kind>`` (``"DataArray"``, ``"Dataset"``).

    Never imports xarray: an object of it exists only if it is imported.
    """
    xarray = sys.modules.get("xarray")
    cls = getattr(xarray, kind, None) if xarray is not None else None
    return isinstance(cls, type) and isinstance(obj, cls)


def _xarray_data(array: Any) -> Any:
    """The array behind an ``xarray.DataArray``, keeping dask chunks.

    A dask-backed DataArray (``xr.open_zarr``, ``open_dataset(chunks={})``,
    ``.chunk()``) gives its dask array, whose chunks the streams read; one in
    memory gives its numpy array.  One lazily backed without dask (e.g.
    ``xr.open_zarr(..., chunks=None)``) gives ``.data``, which xarray loads
    into memory.
    """
    inner = array.variable._data
    if isinstance(inner, da.Array | np.ndarray):
        return inner
    return array.data


def _as_source(array: Any, role: str) -> Source:
    _check_not_masked(role, array)
    if isinstance(array, da.Array):
        behind = _zarr_behind(array)
        if behind is not None:
            array = behind
    if isinstance(array, zarr.Array):
        shape = tuple(array.shape)
        _check_dims(role, shape)
        dtype = np.dtype(array.dtype)
        _check_dtype(role, dtype)
        chunks = da.core.normalize_chunks(array.chunks, shape)
        name = str(array.store_path)
        shards = None if array.shards is None else tuple(array.shards)
        return SliceSource(name, shape, dtype, chunks, array, _token(array), shards)
    if isinstance(array, np.ndarray):
        shape = array.shape
        _check_dims(role, shape)
        _check_dtype(role, array.dtype)
        if array.size == 0:  # dask's auto chunking divides by the row size
            chunks = tuple((size,) for size in shape)
        else:
            auto = {0: "auto", **{axis: -1 for axis in range(1, array.ndim)}}
            chunks = da.core.normalize_chunks(auto, shape, dtype=array.dtype)
        name = f"<numpy {role} shape={shape} dtype={array.dtype}>"
        return SliceSource(name, shape, array.dtype, chunks, array, _token(array))
    if isinstance(array, da.Array):
        shape = tuple(array.shape)
        _check_dims(role, shape)
        _check_dtype(role, array.dtype)
        if any(math.isnan(size) for sizes in array.chunks for size in sizes):
            raise ArgumentValueError(
                f"{role} has unknown chunk sizes {array.chunks}; "
                "call .compute_chunk_sizes() on it first"
            )
        graph = dict(array.__dask_optimize__(array.__dask_graph__(), array.__dask_keys__()))
        return DaskSource(array.name, shape, array.dtype, array.chunks, array, graph)
    raise ArgumentTypeError(
        f"{role} must be a zarr.Array, dask.array.Array, numpy.ndarray or xarray.DataArray, "
        f"got {type(array).__name__}"
    )


def _check_dims(role: str, shape: tuple[int, ...]) -> None:
    if len(shape) == 0:
        raise ArgumentValueError(
            f"{role} is a 0-d array (shape ()); streams need at least one "
            "dimension, with samples along axis 0"
        )


# Kinds of fixed-size numbers: bool, signed and unsigned integers, floats,
# complex, timedelta64, datetime64.  Structured dtypes ("V" with fields) are
# checked field by field; raw fixed-size bytes ("V" without fields) are opaque
# records and stream like numbers.
_FIXED_SIZE_KINDS = frozenset("biufcmMV")
_KIND_NAMES = {
    "U": "fixed-width strings",
    "S": "fixed-width byte strings",
    "T": "variable-width strings",
    "O": "Python objects",
}


def _check_dtype(role: str, dtype: np.dtype[Any]) -> None:
    """Refuse dtypes whose elements are not fixed-size numbers.

    Strings, byte strings and Python objects have no meaningful fixed row
    size (window sizing and memory budgets rely on ``itemsize``), dask cannot
    chunk object arrays, and they are not what a training batch holds; they
    are refused for every stream and chunk job, from numpy, dask and Zarr
    alike.
    """
    bad, where = _first_unsupported(dtype, "")
    if bad is None:
        return
    what = _KIND_NAMES.get(bad.kind, f"kind {bad.kind!r}")
    field_note = f" (field {where!r} has dtype {bad}: {what})" if where else f" ({what})"
    raise ArgumentTypeError(
        f"{role} has dtype {dtype}{field_note}, which cannot be streamed; use a fixed-size "
        "numeric dtype (bool, integer, float, complex, datetime64, timedelta64) or a "
        "structured dtype of those, e.g. encode strings as integer ids first"
    )


def _first_unsupported(dtype: np.dtype[Any], where: str) -> tuple[np.dtype[Any] | None, str]:
    """The first (sub)dtype of ``dtype`` that is not fixed-size numbers, and its field path."""
    if dtype.subdtype is not None:  # a sub-array field such as ("y", "i2", (3,))
        return _first_unsupported(dtype.subdtype[0], where)
    if dtype.names is not None:
        for name in dtype.names:
            inner = f"{where}.{name}" if where else name
            found = _first_unsupported(dtype[name], inner)
            if found[0] is not None:
                return found
        return None, ""
    return (None, "") if dtype.kind in _FIXED_SIZE_KINDS else (dtype, where)


def _check_not_masked(role: str, array: Any) -> None:
    """Refuse masked arrays: slicing their data would drop the mask silently."""
    if isinstance(array, np.ma.MaskedArray):
        fill, mask = f"{role}.filled(value)", f"np.ma.getmaskarray({role})"
    elif isinstance(array, da.Array) and isinstance(array._meta, np.ma.MaskedArray):
        fill, mask = f"da.ma.filled({role}, value)", f"da.ma.getmaskarray({role})"
    else:
        return
    raise ArgumentTypeError(
        f"{role} is a masked array (shape {array.shape}, dtype {array.dtype}); streams "
        f"would drop its mask. Pass {fill} instead and, if the mask matters, stream "
        f"{mask} as a separate array of the same length"
    )


def _token(array: Any) -> str:
    # Unique per Source object: the array itself is placed in each graph
    # under this key, so it must never collide with another array's.
    return f"{id(array):x}-{os.urandom(4).hex()}"


def _zarr_behind(array: da.Array) -> zarr.Array | None:
    """The Zarr array behind a plain ``da.from_zarr`` dask array, if any."""
    graph = array.__dask_graph__()
    layers = getattr(graph, "layers", None)
    if layers is None or len(layers) != 2:
        return None
    original = layers.get("original-" + array.name)
    if original is None or len(original) != 1:
        return None
    (value,) = original.values()
    if not isinstance(value, zarr.Array):
        return None
    same = (
        tuple(value.shape) == tuple(array.shape)
        and np.dtype(value.dtype) == array.dtype
        and da.core.normalize_chunks(value.chunks, value.shape) == array.chunks
    )
    return value if same else None
