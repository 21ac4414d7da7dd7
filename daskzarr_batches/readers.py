"""Chunk readers: the hook every decode of a stored chunk goes through.

Pass ``reader=factory`` (or ``ReadOptions(reader=factory)``) to any stream,
per-chunk job or ``Loader``: ``factory(array, default)`` is called once per
array per stream in each process that reads, and returns the
:class:`ChunkReader` that decodes that array's chunks; ``default`` is the
reader this library chose (:class:`LibraryReader`).  Every decode, of every
stream kind, is one :class:`ChunkRequest` passed to ``read(requests)``; a
chunk served from a ``ChunkCache`` asks the reader nothing.

Examples
--------
Count what is decoded, and let the library read it:

>>> import numpy as np, zarr
>>> import daskzarr_batches as dzb
>>> class Counting:
...     def __init__(self, inner):
...         self.inner, self.chunks = inner, []
...     def read(self, requests):
...         self.chunks += [r.chunk for r in requests]
...         self.inner.read(requests)
>>> x = zarr.create_array({}, shape=(10, 2), chunks=(4, 2), dtype="f4")
>>> x[:] = np.arange(20).reshape(10, 2)
>>> made = []
>>> def factory(array, default):
...     made.append(Counting(default))
...     return made[-1]
>>> sum(len(b) for b in dzb.batch_stream(x, 3, reader=factory))
10
>>> sorted(made[0].chunks)
[(0, 0), (1, 0), (2, 0)]
"""

from __future__ import annotations

from .store.reader_hook import LibraryReader
from .store.requests import ChunkReader, ChunkRequest, ReaderFactory

__all__ = ["ChunkReader", "ChunkRequest", "LibraryReader", "ReaderFactory"]
