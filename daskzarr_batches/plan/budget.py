"""Every decode and memory-budget constant, and how an exact shuffle splits ``memory_budget``."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "DECODE_COPIES",
    "DECODE_GROUP_BYTES",
    "DECODE_SHARE",
    "INDEX_BYTES_PER_SAMPLE",
    "ExactBudget",
    "exact_budget",
]


#: Bytes of index arrays per sample of an exact-shuffle window, counted in
#: ``memory_budget``: the pieces' ``take`` and ``dest`` and the gather index
#: (int64 each) held while the window is read and cut, with room for the
#: temporaries of planning it (``sorting_order``, ``pieces_for``).
INDEX_BYTES_PER_SAMPLE = 32


#: An exact-shuffle window may have ``1 / DECODE_SHARE`` of its share of the
#: budget in decoded chunks in flight (at least one chunk) ...
DECODE_SHARE = 32


#: ... each costing about this many times its decoded bytes while it is read
#: (the stored bytes, the decoded chunk and Zarr's copy of it).
DECODE_COPIES = 3


@dataclass(frozen=True)
class ExactBudget:
    """How an exact shuffle spends ``memory_budget`` (see :func:`exact_budget`).

    Attributes
    ----------
    window_rows : int
        Samples per window.
    decode_bytes : int
        Decoded bytes of stored chunks one window read may have in flight
        (the read layer allows at least one chunk).
    """

    window_rows: int
    decode_bytes: int


def exact_budget(memory_budget: int, row_bytes: int, prefetch: int) -> ExactBudget:
    """Split ``memory_budget`` between an exact shuffle's windows and their reads.

    The ``prefetch + 1`` windows alive at once share the budget equally.  Of
    one window's share, ``1 / DECODE_SHARE`` is decoded chunks in flight
    (charged ``DECODE_COPIES`` times), and the rest holds the window's
    samples at ``row_bytes + INDEX_BYTES_PER_SAMPLE`` bytes each, so
    ``window_rows * (row_bytes + INDEX_BYTES_PER_SAMPLE) + DECODE_COPIES *
    decode_bytes <= memory_budget / (prefetch + 1)`` whenever the share holds
    one sample (``window_rows`` is at least 1).  The epoch's permutation
    (:func:`permutation`, 4 bytes per sample) and one chunk being decoded
    when a chunk is larger than ``decode_bytes`` are not in the budget.

    Examples
    --------
    >>> exact_budget(2**20, 256, 0)
    ExactBudget(window_rows=2958, decode_bytes=65536)
    """
    share = memory_budget // (prefetch + 1)
    decode = share // DECODE_SHARE
    rows = (share - DECODE_COPIES * decode) // (row_bytes + INDEX_BYTES_PER_SAMPLE)
    return ExactBudget(window_rows=max(1, rows), decode_bytes=decode)


#: Decoded bytes of stored chunks one window read holds at once (at least one
#: chunk); bounds the transient memory of an exact-shuffle window.
DECODE_GROUP_BYTES = 64 * 2**20
