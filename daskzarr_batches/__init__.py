"""Stream numpy minibatches and per-chunk blocks out of chunked Zarr arrays.

Built on dask (one machine) and dask.distributed (clusters).  The public
surface is everything in ``__all__``; modules starting with ``_`` are private.

Modules, each importing only those listed before it (``docs/architecture.md``):

- ``_errors``: the error tree;
- ``_batching``: batch arithmetic and cutting windows into owned batches;
- ``_plan``: pure index math turning an epoch into windows of chunk reads;
- ``_sources``: arrays described (name, shape, dtype, chunk grid), ``open_array``;
- ``_read``: dask task functions and graph builders (each chunk decoded once);
- ``_runners``: computing graphs on local threads or a ``distributed.Client``;
- ``_spec``: argument validation and the epoch's ``StreamSpec``;
- ``_streams``: the public constructors and the stream iterators with stats;
- ``_mapreduce``: per-chunk map and reduce; ``_cli``: the command line.
"""

from ._errors import (
    ArgumentTypeError,
    ArgumentValueError,
    ArrayNotFoundError,
    ChunkReadError,
    CorruptChunkError,
    DaskZarrBatchesError,
    InvalidMetadataError,
    LengthMismatchError,
    LoaderBusyError,
    MissingChunkError,
    MissingChunksWarning,
    SkippedChunksWarning,
    StoreGoneError,
    StreamFailedError,
    WindowError,
    WindowTimeoutError,
)
from ._loader import Loader
from ._mapreduce import Moments, feature_moments, map_chunks, reduce_chunks
from ._plan import ChunkPiece, EpochPlan, PlanSummary, Window, WindowSummary
from ._sources import open_array
from ._spec import (
    DEFAULT_IO_CONCURRENCY,
    DEFAULT_MEMORY_BUDGET,
    DEFAULT_PREFETCH,
    DEFAULT_WINDOW_BYTES,
    StreamSpec,
)
from ._streams import (
    BatchStream,
    ChunkStream,
    SkippedChunk,
    Stream,
    StreamStats,
    batch_stream,
    chunk_stream,
    count_batches,
    paired_batch_stream,
    paired_shuffled_batch_stream,
    plan_epoch,
    shuffled_batch_stream,
)

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_IO_CONCURRENCY",
    "DEFAULT_MEMORY_BUDGET",
    "DEFAULT_PREFETCH",
    "DEFAULT_WINDOW_BYTES",
    "ArgumentTypeError",
    "ArgumentValueError",
    "ArrayNotFoundError",
    "BatchStream",
    "ChunkPiece",
    "ChunkReadError",
    "ChunkStream",
    "CorruptChunkError",
    "DaskZarrBatchesError",
    "EpochPlan",
    "InvalidMetadataError",
    "LengthMismatchError",
    "Loader",
    "LoaderBusyError",
    "MissingChunkError",
    "MissingChunksWarning",
    "Moments",
    "PlanSummary",
    "SkippedChunk",
    "SkippedChunksWarning",
    "StoreGoneError",
    "Stream",
    "StreamFailedError",
    "StreamSpec",
    "StreamStats",
    "Window",
    "WindowError",
    "WindowSummary",
    "WindowTimeoutError",
    "__version__",
    "batch_stream",
    "chunk_stream",
    "count_batches",
    "feature_moments",
    "map_chunks",
    "open_array",
    "paired_batch_stream",
    "paired_shuffled_batch_stream",
    "plan_epoch",
    "reduce_chunks",
    "shuffled_batch_stream",
]
