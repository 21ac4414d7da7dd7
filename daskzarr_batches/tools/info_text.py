"""``info``'s text: sizes for people (``format_bytes``), the arrays as an aligned table
(``format_table``) and what ``--check`` found (``format_check``).  ``tools.info``
re-exports them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .info import ArrayReport

__all__ = ["format_bytes", "format_check", "format_table"]


def format_bytes(n: int) -> str:
    """``n`` bytes for people: ``512 B``, ``1.5 KiB``, ``24.4 MiB``."""
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1000 or unit == "TiB":  # 0.98 MiB rather than 1001.6 KiB
            break
    return f"{value:.2f} {unit}" if value < 1 else f"{value:.1f} {unit}"


def _shape(values: Sequence[int]) -> str:
    return "(" + ", ".join(str(v) for v in values) + ("," if len(values) == 1 else "") + ")"


def format_table(reports: Sequence[ArrayReport]) -> str:
    """The arrays as an aligned text table, with a total line for several arrays."""
    header = [
        "path",
        "zarr",
        "shape",
        "dtype",
        "chunks",
        "shards",
        "codecs",
        "stored/expected",
        "stored",
        "decoded",
    ]
    rows = [
        [
            report.label,
            f"v{report.zarr_format}",
            _shape(report.shape),
            report.dtype,
            _shape(report.chunks),
            "-"
            if report.shards is None
            else f"{_shape(report.shards)}: {report.chunks_per_shard} chunks",
            ", ".join(report.codecs) or "-",
            f"{report.stored}/{report.expected} {report.unit}s",
            format_bytes(report.stored_bytes),
            format_bytes(report.nbytes),
        ]
        for report in reports
    ]
    if len(reports) > 1:
        stored = sum(report.stored_bytes for report in reports)
        decoded = sum(report.nbytes for report in reports)
        total = ["total", *[""] * 7, format_bytes(stored), format_bytes(decoded)]
        rows.append(total)
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    right = {8, 9}  # numbers align right
    lines = [
        "  ".join(
            cell.rjust(width) if i in right else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in [header, *rows]
    ]
    return "\n".join(lines)


def format_check(reports: Sequence[ArrayReport]) -> str:
    """What ``--check`` found: one line per absent or corrupt object, then a verdict."""
    lines = []
    for report in reports:
        lines += [f"absent   {report.label}  {report.unit} {key}" for key in report.absent]
        lines += [
            f"corrupt  {report.label}  {report.unit} {key}: {error}"
            for key, error in report.corrupt
        ]
    chunks = sum(report.stored for report in reports if report.shards is None)
    shards = sum(report.stored for report in reports if report.shards is not None)
    absent = sum(len(report.absent) for report in reports)
    corrupt = sum(len(report.corrupt) for report in reports)
    read = [_count(chunks, "chunk")] + ([_count(shards, "shard")] if shards else [])
    scope = f"{' and '.join(read)} of {_count(len(reports), 'array')}"
    verdict = "all decode" if not corrupt else f"{corrupt} corrupt"
    lines.append(f"check: read {scope}: {verdict}, {absent or 'none'} absent")
    if absent:
        lines.append(
            "note: an absent chunk reads as the fill value (the Zarr spec); Zarr does not "
            "write a chunk that holds only the fill value unless the array was written with "
            "write_empty_chunks=True"
        )
    return "\n".join(lines)


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"
