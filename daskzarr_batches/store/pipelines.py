"""Codec pipelines: whether a Zarr array is decoded by zarrs' Rust pipeline or zarr-python's.

``open_array(..., codec_pipeline=)`` and ``$DASKZARR_BATCHES_CODEC_PIPELINE`` choose;
:func:`with_codec_pipeline` puts the chosen pipeline object on a copy of an array.
The one place that detects zarrs."""

from __future__ import annotations

import importlib
import os
from typing import Any, Literal, get_args

import numpy as np
import zarr
import zarr.abc.store
from dask.tokenize import normalize_token

from ..errors import (
    ArgumentTypeError,
    ArgumentValueError,
    install_hint,
)
from .zarr_adapter import array_view, codec_pipeline, zarr_pipeline

__all__ = [
    "CODEC_PIPELINE_ENV",
    "CodecPipelineChoice",
    "array_view",
    "codec_pipeline_of",
    "is_zarrs_pipeline",
    "resolve_codec_pipeline",
    "with_codec_pipeline",
    "zarr_pipeline",
]


#: Values of ``open_array(..., codec_pipeline=)``.
CodecPipelineChoice = Literal["auto", "zarrs", "zarr"]


#: The environment variable read when ``codec_pipeline`` is None.
CODEC_PIPELINE_ENV = "DASKZARR_BATCHES_CODEC_PIPELINE"


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
            f"install it with {install_hint('zarrs')}, or choose 'auto' "
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


def _zarrs_after_fork() -> None:
    if _zarrs_state["used"]:
        _zarrs_state["forked"] = True


def codec_pipeline_of(array: Any) -> Literal["zarrs", "zarr"]:
    """``"zarrs"`` if zarrs' Rust pipeline reads ``array`` natively here, else ``"zarr"``.

    A zarrs pipeline that could not be set up for the array (zarrs warned
    and falls back to Python codecs) counts as ``"zarr"``, and so does any
    zarrs pipeline in a process forked after zarrs was used (its threads
    did not survive the fork: such a process reads with zarr's pipeline).
    """
    pipeline = codec_pipeline(array)
    if not is_zarrs_pipeline(pipeline) or getattr(pipeline, "impl", None) is None:
        return "zarr"
    _zarrs_state["used"] = True
    return "zarr" if _zarrs_state["forked"] else "zarrs"


def is_zarrs_pipeline(pipeline: object) -> bool:
    """Whether ``pipeline`` is a zarrs (Rust) codec pipeline."""
    return type(pipeline).__module__.split(".")[0] == "zarrs" and hasattr(pipeline, "impl")


def with_codec_pipeline(array: zarr.Array, choice: Literal["zarrs", "zarr"]) -> zarr.Array:
    """``array`` read with ``choice`` (a new array object, the same store and metadata).

    ``"zarrs"`` falls back to zarr's pipeline for an array zarrs cannot read
    natively; ``"zarr"`` replaces only a zarrs pipeline (any other pipeline
    the array was built with is kept).  No I/O, no warning, and zarr.config
    is not touched (the pipeline object is built directly).
    """
    if choice == "zarrs" and codec_pipeline_of(array) == "zarrs":
        return array
    pipeline = _zarrs_pipeline(array) if choice == "zarrs" else None
    if pipeline is None:
        if not is_zarrs_pipeline(codec_pipeline(array)):
            return array
        pipeline = zarr_pipeline(array.metadata)
    return array_view(array, codec_pipeline=pipeline)


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
    if isinstance(array.store_path.store, zarr.storage.ObjectStore):
        # zarrs 0.2.3 takes an obstore store and reads it with a Rust client of its own,
        # not obstore's: no allow_http, obstore's retries or the read policy's request
        # limit (on a loopback http endpoint its first read failed with "error sending
        # request"); zarr's pipeline reads through obstore itself.
        return None
    _zarrs_state["used"] = True
    try:
        import zarrs
        from zarrs.pipeline import get_codec_pipeline_fallback, get_codec_pipeline_impl

        metadata = array.metadata
        store = array.store_path.store
        # strict: an unsupported array raises instead of warning; an unsupported
        # store raises NotImplementedError
        impl = get_codec_pipeline_impl(metadata, store, strict=True)
        if impl is None:
            return None
        fallback = get_codec_pipeline_fallback(metadata, strict=False)
    except Exception:
        return None
    return zarrs.ZarrsCodecPipeline(metadata=metadata, store=store, impl=impl, python_impl=fallback)


#: zarrs decodes on process-wide Rust threads, started as soon as a zarrs pipeline is
#: built; a process forked after that inherits them as dead threads, and a zarrs read
#: there waits forever (measured with zarrs 0.2.3: a forked child of a process that only
#: opened an array with zarrs hangs on its first read).  Such a child reads with zarr's
#: pipeline instead: ``"used"`` is set in a process that built or met a zarrs pipeline,
#: ``"forked"`` in its forked children.
_zarrs_state = {"used": False, "forked": False}


os.register_at_fork(after_in_child=_zarrs_after_fork)
