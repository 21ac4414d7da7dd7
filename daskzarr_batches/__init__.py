"""Stream numpy minibatches and per-chunk blocks out of chunked Zarr arrays.

Built on dask (one machine) and dask.distributed (clusters).  The public
surface is everything in ``__all__``; modules starting with ``_`` are private.

Layers, top to bottom (see ``docs/architecture.md``):

- ``_sources``: arrays and stores as dask arrays with the stored chunk grid;
- ``_plan``: pure index math turning an epoch into windows of chunk reads;
- ``_read``: a window becomes one dask graph (each chunk decoded once);
- ``_deliver``: bounded prefetch, batches cut as owned arrays, stats;
- ``_streams``: the public constructors; ``_mapreduce``: per-chunk map and
  reduce (``map_chunks``, ``reduce_chunks``, ``Moments``); ``_cli``: the demo
  command.
"""

from ._deliver import BatchStream, ChunkStream, Stream, StreamStats
from ._errors import (
    ArgumentTypeError,
    ArgumentValueError,
    ArrayNotFoundError,
    ChunkReadError,
    DaskZarrBatchesError,
    InvalidMetadataError,
    LengthMismatchError,
    WindowError,
    WindowTimeoutError,
)
from ._mapreduce import Moments, feature_moments, map_chunks, reduce_chunks
from ._plan import ChunkPiece, EpochPlan, PlanSummary, Window, WindowSummary
from ._sources import open_array
from ._streams import (
    DEFAULT_MEMORY_BUDGET,
    DEFAULT_PREFETCH,
    DEFAULT_WINDOW_BYTES,
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
    "DaskZarrBatchesError",
    "EpochPlan",
    "InvalidMetadataError",
    "LengthMismatchError",
    "Moments",
    "PlanSummary",
    "Stream",
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
