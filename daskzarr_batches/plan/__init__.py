"""Planning: pure index math (batches, windows, shards, budgets); numpy only.

Also the namespace for inspecting a plan: what ``plan_epoch``, ``stream.plan`` and
``stream.summary()`` return, and the defaults that size windows.  Notebooks and
scripts exploring a plan import these from here
(``from daskzarr_batches.plan import EpochPlan, DEFAULT_PREFETCH``); the top level
keeps what a user calls.  A stream's validated settings (``stream.spec``) are a
``daskzarr_batches.streams.StreamSpec``.
"""

from __future__ import annotations

from .defaults import (
    DEFAULT_IO_CONCURRENCY,
    DEFAULT_MEMORY_BUDGET,
    DEFAULT_PATCH_WINDOW_BYTES,
    DEFAULT_PREFETCH,
    DEFAULT_WINDOW_BYTES,
)
from .epoch import EpochPlan
from .quality import DEFAULT_SHUFFLE_QUALITY, ShuffleQuality
from .summary import PlanSummary, WindowSummary
from .windows import ChunkPiece, Window

__all__ = [
    "DEFAULT_IO_CONCURRENCY",
    "DEFAULT_MEMORY_BUDGET",
    "DEFAULT_PATCH_WINDOW_BYTES",
    "DEFAULT_PREFETCH",
    "DEFAULT_SHUFFLE_QUALITY",
    "DEFAULT_WINDOW_BYTES",
    "ChunkPiece",
    "EpochPlan",
    "PlanSummary",
    "ShuffleQuality",
    "Window",
    "WindowSummary",
]
