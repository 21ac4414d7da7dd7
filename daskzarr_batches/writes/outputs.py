"""The output arrays of a write job: checked and opened before anything is written.

``out`` as a store (:func:`output_store`: a path that is neither empty nor a
file, a URL with a bucket, or a store), ``dtype`` and ``sample_shape``
checked, shards of whole chunks, the chunk grid normalised; each output
array created, or opened for a resume after its fingerprint is checked
(``_open_output``, ``writes.resume``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import zarr

from ..errors import ArgumentTypeError, ArgumentValueError
from ..store.backends import resolve_backend, url_store
from ..store.sources import _check_dtype
from .resume import FINGERPRINT_KEY, _check_fingerprint, _existing, _Manifest

__all__ = ["output_store"]


def _output_dtype(value: Any) -> np.dtype[Any]:
    """``dtype=`` as a numpy dtype of fixed-size numbers, or raise naming it."""
    try:
        dtype = np.dtype(value)
    except (TypeError, ValueError) as exc:
        raise ArgumentTypeError(f"dtype={value!r} is not a numpy dtype: {exc}") from exc
    _check_dtype(f"the output (dtype={value!r})", dtype)
    return dtype


def _sample_shape(value: Any) -> tuple[int, ...]:
    """``sample_shape=`` as a tuple of non-negative ints, or raise naming it."""
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise ArgumentTypeError(
            f"sample_shape must be a tuple of ints (the shape of one output sample), got {value!r}"
        )
    if not all(isinstance(n, int | np.integer) and not isinstance(n, bool) for n in value):
        raise ArgumentTypeError(f"sample_shape must be a tuple of ints, got {value!r}")
    if any(n < 0 for n in value):
        raise ArgumentValueError(f"sample_shape={tuple(value)!r} has a negative size")
    return tuple(int(n) for n in value)


def _check_shards(shards: tuple[int, ...], chunks: tuple[int, ...], given: Any) -> None:
    """Every shard holds whole chunks: each shard size a multiple of the chunk size."""
    for axis, (shard, chunk) in enumerate(zip(shards, chunks, strict=True)):
        if shard % chunk:
            raise ArgumentValueError(
                f"shards={given!r} ({shards}) is not a multiple of the chunks {chunks} along "
                f"axis {axis} ({shard} is not a multiple of {chunk}); a shard holds whole "
                "chunks: pass shards that are multiples of chunks"
            )


def _normal_grid(name: str, value: Any, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    if value is None:
        return None
    if isinstance(value, int | np.integer) and not isinstance(value, bool):
        grid = (int(value), *shape[1:])
    elif isinstance(value, Sequence) and all(isinstance(v, int | np.integer) for v in value):
        grid = tuple(int(v) for v in value)
    else:
        raise ArgumentTypeError(f"{name} must be an int (rows) or a tuple of ints, got {value!r}")
    if len(grid) != len(shape) or any(g < 1 for g in grid):
        raise ArgumentValueError(
            f"{name}={value!r} does not fit the output's shape {shape}: one positive size per axis"
        )
    return grid


def output_store(out: Any, storage_options: dict[str, Any] | None, backend: str) -> Any:
    """``out`` as zarr writes to it: a URL opened writable on its backend, else as given.

    Raises
    ------
    ArgumentTypeError
        ``out`` is not a path, URL or Zarr store (an int, say).
    ArgumentValueError
        ``out`` is an empty path (Zarr would write into the current
        directory), an existing file, or a URL no installed backend writes
        (an unknown protocol, one without a bucket or host).
    """
    if isinstance(out, os.PathLike):
        out = os.fspath(out)
    if isinstance(out, bytes) or not isinstance(
        out, str | zarr.abc.store.Store | zarr.storage.StorePath | Mapping
    ):
        raise ArgumentTypeError(
            "out must be a path, URL or Zarr store (e.g. 'out.zarr', 's3://bucket/out.zarr', "
            f"zarr.storage.MemoryStore()), got {type(out).__name__} {out!r}"
        )
    protocol = out.split("://", 1)[0].lower() if isinstance(out, str) and "://" in out else None
    if protocol in (None, "file"):
        if storage_options:
            raise ArgumentValueError(
                f"storage_options={storage_options!r} apply to an output URL (s3://, gs://, "
                f"...), not to {out!r}"
            )
        if isinstance(out, str):
            _check_out_path(out, out.split("://", 1)[1] if protocol else out)
        return out
    chosen = resolve_backend(backend, protocol)
    assert chosen is not None and isinstance(out, str)
    try:
        return url_store(out, storage_options, chosen, read_only=False)
    except (ArgumentTypeError, ArgumentValueError):
        raise
    except ImportError as exc:  # fsspec has no filesystem installed for the protocol
        raise ArgumentValueError(
            f"out={out!r}: {protocol}:// URLs need a package that is not installed ({exc})"
        ) from exc
    except (ValueError, TypeError) as exc:  # fsspec: "Protocol not known", a bad URL
        raise ArgumentValueError(
            f"out={out!r} is not a URL an output can be written to: {exc}"
        ) from exc


def _check_out_path(out: str, path: str) -> None:
    """A local output path: not empty (the current directory) and not an existing file."""
    if not path.strip():
        raise ArgumentValueError(
            f"out={out!r} is an empty path, which would write the output into the current "
            "directory; name the output's directory, e.g. out='normalised.zarr'"
        )
    if os.path.exists(path) and not os.path.isdir(path):
        raise ArgumentValueError(
            f"out={out!r} is an existing file, not a directory; a Zarr output is a "
            "directory: remove the file or choose another path"
        )


def _open_output(
    out: Any,
    name: str | None,
    shape: tuple[int, ...],
    dtype: np.dtype[Any],
    chunks: tuple[int, ...],
    shards: tuple[int, ...] | None,
    compressors: Any,
    fingerprint: dict[str, Any],
    overwrite: bool,
    resume: bool,
) -> zarr.Array:
    """The output array, created, or opened and checked for a resume."""
    config: Any = {"write_empty_chunks": True}  # zarr's ArrayConfigParams
    where = out if name is None else f"{out}/{name}"
    existing = None if overwrite else _existing(out, name)
    if existing is not None:
        if not resume:
            raise ArgumentValueError(
                f"output {where} exists: pass resume=True to complete it or overwrite=True "
                "to start over"
            )
        _check_fingerprint(existing, where, shape, dtype, chunks, shards, fingerprint)
        return existing.with_config(config)
    array = zarr.create_array(
        store=out,
        name=name,
        shape=shape,
        dtype=dtype,
        chunks=chunks,
        shards=shards,
        compressors=compressors,
        attributes={FINGERPRINT_KEY: fingerprint},
        overwrite=overwrite,
        config=config,
    )
    _Manifest(array).delete()  # sizes of an earlier output must not vouch for this one's
    return array
