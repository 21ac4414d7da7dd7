"""The defaults that size a stream's windows, reads and budgets (plain integers).

The streams layer validates settings against them (``streams.spec``); they live with
the planner because they are what it sizes windows and budgets by.
"""

from __future__ import annotations

__all__ = [
    "DEFAULT_IO_BYTES",
    "DEFAULT_IO_CONCURRENCY",
    "DEFAULT_MEMORY_BUDGET",
    "DEFAULT_PATCH_WINDOW_BYTES",
    "DEFAULT_PREFETCH",
    "DEFAULT_WINDOW_BYTES",
]

#: Windows computed ahead of the one being consumed.
DEFAULT_PREFETCH = 2
#: Target decoded bytes of one sequential window (rounded to whole chunks).
DEFAULT_WINDOW_BYTES = 32 * 2**20
#: The same for patch streams: their windows' outputs and boxes stay below glibc's 32 MiB
#: mmap threshold, so freed ones are reused instead of faulted in again (docs/benchmarks.md).
DEFAULT_PATCH_WINDOW_BYTES = 16 * 2**20
#: Bytes of samples an exact shuffle may hold in its windows.
DEFAULT_MEMORY_BUDGET = 2**30
#: Reads a chunk stream keeps in flight on a store that is not known to be local
#: (``io_concurrency=None``); how it was chosen: docs/benchmarks.md, "Latency hiding".
DEFAULT_IO_CONCURRENCY = 16
#: Decoded bytes the reads in flight of a chunk stream hold at most by default: the
#: default ``io_concurrency`` is lowered (to no less than the CPU count) for larger
#: chunks or shards.
DEFAULT_IO_BYTES = 256 * 2**20
