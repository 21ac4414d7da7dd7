"""Stream numpy minibatches and per-chunk blocks out of chunked Zarr arrays.

Built on dask (one machine) and dask.distributed (clusters).  The public
surface is everything in ``__all__`` (listed, grouped, in ``docs/index.md``):
the streams, the ``Loader``, per-chunk jobs and writes, the cache, collections,
splits, ``ReadOptions`` and the errors and warnings.  What a plan is made of
(``EpochPlan``, ``Window``, ``PlanSummary``, the ``DEFAULT_*``
sizes) is for inspection, in ``daskzarr_batches.plan``.  The subpackages are
the implementation,
split by what each part knows and importing one way, bottom to top
(``docs/architecture.md``, checked by ``tests/tools/test_layers.py``):

- ``errors``: the error tree and the warnings;
- ``plan``: pure index math: batches, windows, shards, budgets, the epoch's orders;
- ``store``: everything that knows Zarr: opening, codec pipelines, sources, the
  read policy, shards, the I/O threads;
- ``execute``: computing graphs on local threads or a ``distributed.Client``;
- ``read``: dask task functions and graph builders (each chunk decoded once);
- ``streams``: validated settings, the stream iterators, the public constructors;
- ``loader``, ``mapreduce``, ``writes``: training epochs with resumable state; per-chunk
  jobs; per-chunk jobs that write new Zarr arrays, resumably;
- ``torch``, ``tools``: the PyTorch adapter; the command line.
"""

from .errors import (
    ArgumentTypeError,
    ArgumentValueError,
    ArrayNotFoundError,
    CacheWarning,
    ChunkReadError,
    CorruptChunkError,
    DaskZarrBatchesError,
    InvalidMetadataError,
    LengthMismatchError,
    LoaderBusyError,
    MissingChunkError,
    MissingChunksWarning,
    ResumeMismatchError,
    ShuffleQualityWarning,
    SkippedChunksWarning,
    StoreGoneError,
    StreamFailedError,
    WindowError,
    WindowTimeoutError,
)
from .loader import Loader
from .mapreduce import Moments, feature_moments, map_chunks, reduce_chunks
from .plan.sampling import ClassSampler
from .store.cache import ChunkCache
from .store.collections import Collection, Mixture, concat, mix, open_collection
from .store.open import open_array
from .store.sparse import CsrArray
from .store.subsets import ChunkSubset
from .streams.base import SkippedChunk, Stream, StreamStats
from .streams.batch import BatchStream
from .streams.chunk import ChunkStream
from .streams.constructors import (
    batch_stream,
    chunk_stream,
    count_batches,
    paired_batch_stream,
    paired_shuffled_batch_stream,
    patch_stream,
    plan_epoch,
    shuffled_batch_stream,
)
from .streams.spec import ReadOptions
from .streams.splits import chunk_split
from .streams.timing import time_epoch
from .writes import WriteStats, map_to_zarr, shuffle_order, write_shuffled

__version__ = "0.1.0"

__all__ = [
    "ArgumentTypeError",
    "ArgumentValueError",
    "ArrayNotFoundError",
    "BatchStream",
    "CacheWarning",
    "ChunkCache",
    "ChunkReadError",
    "ChunkStream",
    "ChunkSubset",
    "ClassSampler",
    "Collection",
    "CorruptChunkError",
    "CsrArray",
    "DaskZarrBatchesError",
    "InvalidMetadataError",
    "LengthMismatchError",
    "Loader",
    "LoaderBusyError",
    "MissingChunkError",
    "MissingChunksWarning",
    "Mixture",
    "Moments",
    "ReadOptions",
    "ResumeMismatchError",
    "ShuffleQualityWarning",
    "SkippedChunk",
    "SkippedChunksWarning",
    "StoreGoneError",
    "Stream",
    "StreamFailedError",
    "StreamStats",
    "WindowError",
    "WindowTimeoutError",
    "WriteStats",
    "__version__",
    "batch_stream",
    "chunk_split",
    "chunk_stream",
    "concat",
    "count_batches",
    "feature_moments",
    "map_chunks",
    "map_to_zarr",
    "mix",
    "open_array",
    "open_collection",
    "paired_batch_stream",
    "paired_shuffled_batch_stream",
    "patch_stream",
    "plan_epoch",
    "reduce_chunks",
    "shuffle_order",
    "shuffled_batch_stream",
    "time_epoch",
    "write_shuffled",
]
