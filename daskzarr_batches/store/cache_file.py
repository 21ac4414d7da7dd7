"""The chunk cache's file format: one decoded chunk per file, checked on every read.

A file is ``MAGIC``, the JSON header's length, the header (key, dtype,
shape, order, size), the chunk's bytes and a CRC-32 of all of them
(:func:`_read_file`); the directory they sit in is made by :func:`_made`.
What files a cache keeps, where and for how long is ``store/cache_tiers.py``'s.
"""

from __future__ import annotations

import json
import math
import os
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ArgumentValueError

#: First bytes of a cache file, and its format's version (2: the CRC-32 covers the header).
MAGIC = b"DZBCACHE2\n"
_FORMAT_1 = b"DZBCACHE1\n"  # the format before (a CRC of the data alone): read as absent
_HEADER = struct.Struct("<I")  # the JSON header's length
_CRC = struct.Struct("<I")  # the last 4 bytes: CRC-32 of everything before them
#: The header's fields, exactly (a file with more, fewer or other ones is damaged).
_FIELDS = frozenset({"key", "dtype", "shape", "order", "nbytes"})
#: Longest header a reader accepts (a damaged length field is not read on).
_MAX_HEADER = 1 << 16


def _bytes(data: np.ndarray) -> memoryview:
    """The bytes of a C-contiguous array, as a (writable if it is) memoryview."""
    return data.reshape(-1).view(np.uint8).data


class _OldFormat(Exception):
    """A cache file of the previous format (not damaged: made by an earlier version)."""


def _header(key: str, data: np.ndarray) -> bytes:
    """The JSON header of a cache file holding ``data`` (C order) under ``key``."""
    fields = {"key": key, "dtype": data.dtype.str, "shape": list(data.shape), "order": "C",
              "nbytes": data.nbytes}  # fmt: skip
    return json.dumps(fields).encode()


def _read_file(file: Any, key: str) -> np.ndarray:
    """A cache file's chunk, checked (raises ``ValueError`` if it is damaged).

    The file is ``MAGIC``, the header's length, the JSON header, the chunk's
    bytes and a CRC-32 of all of them.  Its size is checked against the
    header before anything is allocated, the CRC before the header is
    trusted, and the header against what this reader writes: exactly its
    fields, this ``key``, a plain numeric dtype spelled as NumPy spells it
    (byte order included), C order, a shape of ``nbytes``.
    """
    size = os.fstat(file.fileno()).st_size
    start = file.read(len(MAGIC) + _HEADER.size)
    if start[: len(MAGIC)] == _FORMAT_1:
        raise _OldFormat
    if len(start) != len(MAGIC) + _HEADER.size or start[: len(MAGIC)] != MAGIC:
        raise ValueError("not a cache file")
    (length,) = _HEADER.unpack(start[len(MAGIC) :])
    if length > _MAX_HEADER or len(start) + length + _CRC.size > size:
        raise ValueError("header length")
    raw = file.read(length)
    nbytes = size - len(start) - length - _CRC.size
    data = np.empty(nbytes, dtype=np.uint8)
    if len(raw) != length or file.readinto(data.data) != nbytes:
        raise ValueError("truncated")
    trailer = file.read(_CRC.size + 1)
    if len(trailer) != _CRC.size:
        raise ValueError("truncated or too long")
    if zlib.crc32(data.data, zlib.crc32(raw, zlib.crc32(start))) != _CRC.unpack(trailer)[0]:
        raise ValueError("checksum")
    header = json.loads(raw)
    if not isinstance(header, dict) or set(header) != _FIELDS:
        raise ValueError("header fields")
    dtype, shape = np.dtype(header["dtype"]), header["shape"]
    if header["key"] != key:
        raise ValueError("another key")
    if dtype.str != header["dtype"] or dtype.kind not in "biufcmM" or header["order"] != "C":
        raise ValueError("dtype or order")
    if not isinstance(shape, list) or not all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape
    ):
        raise ValueError("shape")
    if header["nbytes"] != nbytes or math.prod(shape) * dtype.itemsize != nbytes:
        raise ValueError("size")
    chunk = data.view(dtype).reshape(shape)
    chunk.setflags(write=False)
    return chunk


def _made(directory: Path) -> Path:
    """``directory``, created if needed (else an error naming it)."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except FileExistsError as error:
        raise ArgumentValueError(
            f"the chunk cache's directory {str(directory)!r} is a file, not a directory"
        ) from error
    except OSError as error:
        raise ArgumentValueError(
            f"cannot create the chunk cache's directory {str(directory)!r} "
            f"({type(error).__name__}: {error})"
        ) from error
    if not directory.is_dir():  # a broken link, say
        raise ArgumentValueError(f"the chunk cache's directory {str(directory)!r} is no directory")
    return directory
