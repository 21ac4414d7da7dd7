"""The one place that touches zarr-python beyond its documented public API.

Everything else in the package uses zarr's public API only (``zarr.Array`` and
its properties, ``zarr.storage``, ``zarr.abc.store``, ``zarr.codecs``,
``zarr.config``); ``tests/store/test_zarr_adapter.py`` fails if another module
imports ``zarr.core`` or a private zarr module, or reaches for a private zarr
attribute.  What this module reaches for, and the releases it differs in
(``ZARR_VERSION`` gates them; every 3.x release from ``pyproject.toml``'s lower
bound to the newest is tested, docs/architecture.md, *Zarr releases*):

- the synchronous bridge to Zarr's event loop (``zarr.core.sync``) and the
  loop's default executor, which ``store.threads`` replaces by its own;
- an array's ``AsyncArray`` (its ``_async_array``, the one attribute every
  supported release has) and copies of it with another store path or codec
  pipeline (the read policy's store, the chosen pipeline);
- zarr-python's own codec pipeline (``BatchedCodecPipeline``), which the
  chunk cache subclasses: its ``read_batch`` returns a ``GetResult`` per chunk
  from 3.2 and ``None`` before (:func:`read_results`);
- the specification of one chunk (``ArraySpec``): ``metadata.get_chunk_spec``
  until 3.3, built from the array's chunk grid from 3.4
  (:func:`chunk_spec`);
- the metadata classes (to check a document parses), ``make_store_path``, the
  v2 codec adapter, the buffer prototype;
- a sharding codec's index size, inner chunk spec and index decoder.
"""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import zarr
import zarr.core.sync as _zsync  # first: Zarr's atexit hook is registered before ours
import zarr.storage
from packaging.version import Version
from zarr.core.buffer import Buffer, BufferPrototype, NDBuffer, default_buffer_prototype
from zarr.core.codec_pipeline import BatchedCodecPipeline, fill_value_or_default
from zarr.core.common import concurrent_map

if TYPE_CHECKING:
    import asyncio

__all__ = [
    "ZARR_VERSION",
    "BatchedCodecPipeline",
    "Buffer",
    "BufferPrototype",
    "NDBuffer",
    "array_view",
    "async_array",
    "buffer_prototype",
    "bytes_endian",
    "chunk_spec",
    "codec_pipeline",
    "concurrent_map",
    "decode_shard_index",
    "encode_chunk_key",
    "fill_value_or_default",
    "forget_loop",
    "install_loop_executor",
    "is_regular_grid",
    "is_zarr_pipeline",
    "make_store_path",
    "nd_buffer",
    "parse_array_metadata",
    "read_results",
    "shard_chunk_spec",
    "shard_index_at_start",
    "shard_index_size",
    "sync",
    "unwrapped_store",
    "wrapped_store",
    "zarr_loop_now",
    "zarr_pipeline",
]

#: The installed zarr-python release.
ZARR_VERSION = Version(zarr.__version__)

#: ``read_batch`` returns one ``GetResult`` per chunk (zarr 3.2 and later).
_READ_BATCH_RESULTS = Version("3.2.0.dev0") <= ZARR_VERSION


# -- Zarr's event loop --------------------------------------------------------------


def sync(coro: Awaitable[Any]) -> Any:
    """Run ``coro`` on Zarr's event loop from synchronous code; its result."""
    return _zsync.sync(coro)  # type: ignore[arg-type]


def zarr_loop_now() -> asyncio.AbstractEventLoop:
    """Zarr's event loop (started if it is not yet)."""
    return _zsync._get_loop()


def forget_loop() -> None:
    """Forget Zarr's event loop, its thread, executor and lock (a forked child's, dead here)."""
    _zsync.loop[0] = None
    _zsync.iothread[0] = None
    _zsync._executor = None
    _zsync._lock = None


def install_loop_executor(loop: asyncio.AbstractEventLoop, executor: Any) -> None:
    """Make ``executor`` the default executor of Zarr's ``loop``, for good.

    Zarr would put its own executor on the loop the first time ``sync`` runs
    with ``threading.max_workers`` configured; it is made now so that it
    cannot replace ``executor`` later (then it never starts a thread).
    """
    if _zsync._executor is None and zarr.config.get("threading.max_workers", None) is not None:
        _zsync._get_executor()
    loop.set_default_executor(executor)


# -- arrays and their codec pipelines -----------------------------------------------


def async_array(array: Any) -> Any:
    """``array``'s ``AsyncArray`` (a ``zarr.Array``), else ``None``."""
    if not isinstance(array, zarr.Array):
        return None
    return array._async_array


def codec_pipeline(array: Any) -> Any:
    """The codec pipeline object reading ``array`` (``None`` if it is no Zarr array)."""
    inner = async_array(array)
    return None if inner is None else inner.codec_pipeline


def is_zarr_pipeline(pipeline: Any, *, exactly: bool = False) -> bool:
    """Whether ``pipeline`` is zarr-python's own pipeline (``exactly``: not a subclass)."""
    if exactly:
        return type(pipeline) is BatchedCodecPipeline
    return isinstance(pipeline, BatchedCodecPipeline)


def array_view(
    array: zarr.Array, *, store_path: Any = None, codec_pipeline: Any = None
) -> zarr.Array:
    """A new ``zarr.Array`` on ``array``'s metadata with its store path or codec pipeline replaced.

    The one way the package builds an array view (the codec pipeline chosen at
    open, the read policy's store): no I/O, nothing rebuilt but the fields given.
    """
    view = copy.copy(array._async_array)  # a frozen dataclass: set fields as its __init__ does
    if store_path is not None:
        object.__setattr__(view, "store_path", store_path)
    if codec_pipeline is not None:
        object.__setattr__(view, "codec_pipeline", codec_pipeline)
    return zarr.Array(view)


def zarr_pipeline(metadata: Any) -> Any:
    """zarr-python's own codec pipeline for an array's ``metadata``."""
    if metadata.zarr_format == 3:
        return BatchedCodecPipeline.from_codecs(metadata.codecs)
    from zarr.codecs._v2 import V2Codec

    return BatchedCodecPipeline.from_codecs(
        [V2Codec(filters=metadata.filters, compressor=metadata.compressor)]
    )


def read_results(present: Sequence[bool]) -> Any:
    """What ``BatchedCodecPipeline.read_batch`` returns for chunks ``present`` or not.

    A tuple of ``GetResult`` (zarr 3.2 and later), ``None`` before.
    """
    if not _READ_BATCH_RESULTS:
        return None
    return tuple({"status": "present" if there else "missing"} for there in present)


def chunk_spec(array: zarr.Array, prototype: Any = None) -> Any:
    """The ``ArraySpec`` of ``array``'s first chunk (every chunk's, on a regular grid)."""
    inner = array._async_array
    prototype = default_buffer_prototype() if prototype is None else prototype
    coords = (0,) * len(array.shape)
    metadata = inner.metadata
    if hasattr(metadata, "get_chunk_spec"):  # zarr < 3.4
        return metadata.get_chunk_spec(coords, inner.config, prototype)
    import dataclasses

    from zarr.core.array_spec import ArraySpec

    config = inner.config
    if metadata.zarr_format == 2:
        config = dataclasses.replace(config, order=metadata.order)
    spec = getattr(inner, "_chunk_grid")[coords]  # noqa: B009  (zarr >= 3.4 only)
    return ArraySpec(
        shape=spec.codec_shape,
        dtype=metadata.dtype,
        fill_value=metadata.fill_value,
        config=config,
        prototype=prototype,
    )


def encode_chunk_key(array: zarr.Array) -> Callable[[tuple[int, ...]], str]:
    """``array``'s chunk key encoding: chunk coordinates to the store key below the array."""
    metadata: Any = array.metadata
    encode: Callable[[tuple[int, ...]], str] = metadata.encode_chunk_key
    return encode


def parse_array_metadata(document: dict[str, Any], zarr_format: int) -> Any:
    """An array metadata document as Zarr parses it (raises if it does not)."""
    from zarr.core.metadata.v2 import ArrayV2Metadata
    from zarr.core.metadata.v3 import ArrayV3Metadata

    parse = ArrayV3Metadata.from_dict if zarr_format == 3 else ArrayV2Metadata.from_dict
    return parse(dict(document))


async def make_store_path(source: Any, *, storage_options: dict[str, Any] | None) -> Any:
    """The ``StorePath`` ``zarr.open`` makes of ``source`` (read-only)."""
    from zarr.storage._common import make_store_path as make

    return await make(source, mode="r", storage_options=storage_options)


def wrapped_store(store: Any) -> Any:
    """The store a ``zarr.storage.WrapperStore`` wraps directly."""
    return store._store


def is_regular_grid(array: zarr.Array) -> bool:
    """Whether ``array`` (Zarr v3) has a regular chunk grid (from its metadata document)."""
    grid = getattr(array.metadata, "chunk_grid", None)
    if type(grid).__name__ in ("RegularChunkGrid", "RegularChunkGridMetadata"):  # < 3.4, 3.4
        return True
    document = array.metadata.to_dict().get("chunk_grid")
    return isinstance(document, dict) and document.get("name") == "regular"


def bytes_endian(codec: Any) -> str | None:
    """A ``BytesCodec``'s byte order, ``"little"``, ``"big"`` or ``None``.

    An ``Endian`` enum until zarr 3.3, a string from 3.4.
    """
    endian = codec.endian
    return None if endian is None else str(getattr(endian, "value", endian))


def unwrapped_store(store: Any) -> Any:
    """``store`` less every ``WrapperStore`` around it (a latency or policy wrapper)."""
    while isinstance(store, zarr.storage.WrapperStore):
        store = store._store
    return store


def memory_store_dict(store: zarr.storage.MemoryStore) -> Any:
    """The dict a ``MemoryStore`` holds its objects in (two stores over one dict alias)."""
    return store._store_dict


# -- buffers ------------------------------------------------------------------------


def buffer_prototype() -> Any:
    """Zarr's default buffer prototype (host memory)."""
    return default_buffer_prototype()


def nd_buffer(rows: np.ndarray) -> Any:
    """``rows`` as the ``out=`` Zarr writes a selection into (no copy)."""
    return default_buffer_prototype().nd_buffer.from_numpy_array(rows)


# -- shards -------------------------------------------------------------------------


def shard_index_size(codec: Any, per_shard: tuple[int, ...]) -> int:
    """The size in bytes of a shard's index under sharding ``codec``."""
    return int(codec._shard_index_size(per_shard))


def shard_index_at_start(codec: Any) -> bool:
    """Whether a sharding codec's index sits at the start of each shard (else at its end).

    An enum until zarr 3.3; from 3.4 a string (the enum's members are deprecated).
    """
    where = codec.index_location
    return str(getattr(where, "value", where)) == "start"


def shard_chunk_spec(codec: Any, shard_spec: Any) -> Any:
    """The ``ArraySpec`` of an inner chunk of a shard of spec ``shard_spec``."""
    return codec._get_chunk_spec(shard_spec)


async def decode_shard_index(codec: Any, raw: Any, per_shard: tuple[int, ...]) -> Any:
    """A shard's index (``get_chunk_slice(coords)``: an inner chunk's byte range or None)."""
    return await codec._decode_shard_index(raw, per_shard)
