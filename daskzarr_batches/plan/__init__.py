"""Planning: pure index math (batches, windows, shards, budgets); numpy only.

Also the namespace for inspecting a plan: what ``plan_epoch``, ``stream.plan``,
``stream.spec`` and ``stream.summary()`` return, and the defaults that size
windows.  Notebooks and scripts exploring a plan import these from here
(``from daskzarr_batches.plan import EpochPlan, StreamSpec``); the top level
keeps what a user calls.

``StreamSpec`` and the ``DEFAULT_*`` sizes are validated settings of the
streams layer (``streams.spec``), above this one: they are looked up on first
access (PEP 562), so importing the planner never imports the streams
(``tests/tools/test_layers.py`` allows this one lazy lookup and no other).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .epoch import EpochPlan
from .quality import DEFAULT_SHUFFLE_QUALITY, ShuffleQuality
from .summary import PlanSummary, WindowSummary
from .windows import ChunkPiece, Window

if TYPE_CHECKING:  # looked up lazily below (the streams layer sits above this one)
    from ..streams.spec import (
        DEFAULT_IO_CONCURRENCY,
        DEFAULT_MEMORY_BUDGET,
        DEFAULT_PATCH_WINDOW_BYTES,
        DEFAULT_PREFETCH,
        DEFAULT_WINDOW_BYTES,
        StreamSpec,
    )

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
    "StreamSpec",
    "Window",
    "WindowSummary",
]

#: the names of ``streams.spec`` this namespace shows, looked up on first access
_FROM_STREAMS = frozenset(
    {
        "DEFAULT_IO_CONCURRENCY",
        "DEFAULT_MEMORY_BUDGET",
        "DEFAULT_PATCH_WINDOW_BYTES",
        "DEFAULT_PREFETCH",
        "DEFAULT_WINDOW_BYTES",
        "StreamSpec",
    }
)


def __getattr__(name: str) -> Any:
    if name in _FROM_STREAMS:
        from ..streams import spec  # lazy: the one upward lookup test_layers allows

        return getattr(spec, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _FROM_STREAMS)
