"""The ``demo`` command: the README's example data, streamed three ways.

``demo`` builds the example's data -- the
README's quick start and ``notebooks/streaming_minibatches.ipynb`` use the
same: a 10 x 4 float32 feature matrix holding 0..39 and 10 float32 labels
holding 0..9, chunked (4, 4) and (4,) in a Zarr ``MemoryStore`` -- and prints
three views of it: one array per stored chunk, minibatches of 3 samples, and
shuffled feature/label pairs.  Everything printed is deterministic (fixed
seeds, ordered streams), so the output can be compared line by line.

``--scheduler ADDRESS`` runs the demo's streams on an existing
``dask.distributed`` cluster and ``--local-cluster N`` on a ``LocalCluster`` of
``N`` process workers on loopback, started and shut down by the command.  The
arrays stay in the ``MemoryStore``: zarr 3 pickles a ``MemoryStore`` together
with its contents, so the window graphs carry the (tiny) store to the workers,
which decode the chunks there.  That works for remote workers too, which a
temporary directory on the client's disk would not.  For real data use a store
every worker can reach (a shared file system or an object store URL).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TextIO

import numpy as np
import zarr

from .. import (
    batch_stream,
    chunk_stream,
    count_batches,
    paired_shuffled_batch_stream,
)

__all__ = ["demo_arrays", "format_stats", "run_demo"]


def demo_arrays() -> tuple[zarr.Array, zarr.Array]:
    """The example's data (the README's quick start) in a Zarr ``MemoryStore``.

    Returns
    -------
    features : zarr.Array
        Shape (10, 4), chunks (4, 4), float32, row ``i`` holds ``4i .. 4i + 3``.
    labels : zarr.Array
        Shape (10,), chunks (4,), float32, label ``i`` is ``i``.
    """
    root = zarr.group(store=zarr.storage.MemoryStore())
    features = root.create_array("features", shape=(10, 4), chunks=(4, 4), dtype="float32")
    labels = root.create_array("labels", shape=(10,), chunks=(4,), dtype="float32")
    features[:] = np.arange(40, dtype=np.float32).reshape(10, 4)
    labels[:] = np.arange(10, dtype=np.float32)
    return features, labels


def format_stats(stats: Any) -> str:
    """The deterministic counters of a stream's ``stats`` on one line."""
    return (
        f"chunks_read={stats.chunks_read} bytes_read={stats.bytes_read} "
        f"bytes_yielded={stats.bytes_yielded} "
        f"read_amplification={stats.read_amplification:.2f} "
        f"windows_read={stats.windows_read}"
    )


def run_demo(
    out: TextIO,
    *,
    client: Any = None,
    where: str = "local threaded scheduler",
    timeout: float | None = None,
) -> None:
    """Print the demo to ``out``.

    Parameters
    ----------
    out : text stream
        Where the lines go.
    client : distributed.Client, optional
        Compute every stream on this cluster; ``None``: local threads.
    where : str
        How the ``computing on:`` line describes ``client``.
    timeout : float, optional
        Seconds to wait for one window or chunk (passed to every stream).
    """
    features, labels = demo_arrays()
    say = functools.partial(print, file=out)
    bounds = list(range(0, features.shape[0], features.chunks[0]))
    say(
        f"daskzarr-batches demo: features {features.shape} float32 (values 0..39), "
        f"labels {labels.shape} float32 (values 0..9)"
    )
    say(
        f"stored in a zarr MemoryStore with chunks {features.chunks} and {labels.chunks}: "
        f"axis-0 chunks start at rows {bounds}"
    )
    say(f"computing on: {where}")
    streams = {"client": client, "timeout": timeout}
    say()
    _show_chunks(say, features, streams)
    say()
    _show_batches(say, features, streams)
    say()
    _show_pairs(say, features, labels, streams)


def _rows_of(batch: np.ndarray) -> list[int]:
    """Row i of the features holds 4i..4i+3, so the data names its rows."""
    return [int(v) // 4 for v in batch[:, 0]]


def _show_chunks(say: Callable[..., None], features: Any, streams: dict[str, Any]) -> None:
    chunk_rows = features.chunks[0]
    say("1. One array per stored chunk  (chunk_stream, io_concurrency=2, ordered=True)")
    with chunk_stream(
        features, io_concurrency=2, ordered=True, with_index=True, **streams
    ) as chunks:
        for block, chunk in chunks:
            rows = _rows_of(chunk)
            edge = "  (edge chunk, cropped to the array)" if len(chunk) < chunk_rows else ""
            say(f"   chunk {block}: shape {chunk.shape}  rows {rows[0]}..{rows[-1]}{edge}")
        say(f"   stats: {format_stats(chunks.stats)}")


def _show_batches(say: Callable[..., None], features: Any, streams: dict[str, Any]) -> None:
    chunk_rows = features.chunks[0]
    batches = count_batches(features, 3, drop_remainder=True)
    say("2. Minibatches of 3 samples  (batch_stream, batch_size=3, drop_remainder=True)")
    with batch_stream(features, 3, drop_remainder=True, **streams) as stream:
        for number, batch in enumerate(stream):
            rows = _rows_of(batch)
            touched = sorted({row // chunk_rows for row in rows})
            crossing = (
                f"  crosses the chunk boundary at row {touched[1] * chunk_rows}"
                f" (chunks {touched[0]} and {touched[1]})"
                if len(touched) > 1
                else f"  inside chunk {touched[0]}"
            )
            say(f"   batch {number}: shape {batch.shape}  rows {rows[0]}..{rows[-1]}{crossing}")
        dropped = list(range(batches * 3, features.shape[0]))
        say(
            f"   {features.shape[0]} samples // 3 = {batches} batches; "
            f"drop_remainder left out rows {dropped}"
        )
        say(f"   stats: {format_stats(stream.stats)}")


def _show_pairs(
    say: Callable[..., None], features: Any, labels: Any, streams: dict[str, Any]
) -> None:
    say("3. Shuffled feature/label pairs  (paired_shuffled_batch_stream, batch_size=4, seed=1)")
    say("   exact shuffle (shuffle_buffer_size=None): a uniform permutation of all 10 samples")
    aligned = True
    with paired_shuffled_batch_stream(features, labels, 4, seed=1, **streams) as pairs:
        for number, (xb, yb) in enumerate(pairs):
            say(f"   batch {number}: features {xb.shape} / labels {yb.shape}")
            for row, label in zip(xb, yb, strict=True):
                say(f"      features {_values(row)}  ->  label {float(label):.1f}")
                aligned = aligned and bool(row[0] == 4 * label)
        say(f"   every feature row sits next to its own label: {aligned}")
        say(f"   stats: {format_stats(pairs.stats)}")
        say("   (a paired stream counts the chunks of features and of labels: 3 + 3)")
    say(
        "   buffered shuffle (shuffle_buffer_size=8): the order of chunks is permuted, "
        "then rows are"
    )
    say("   drawn at random within windows of whole chunks of at most about 8 samples, balanced")
    say("   (here chunk 1, then chunks 0 and 2: no short last window); each chunk read once")
    aligned = True
    with paired_shuffled_batch_stream(
        features, labels, 4, seed=1, shuffle_buffer_size=8, **streams
    ) as pairs:
        for number, (xb, yb) in enumerate(pairs):
            aligned = aligned and bool(np.all(xb[:, 0] == 4 * yb))
            say(f"   batch {number}: labels {_values(yb)}")
        say(f"   every feature row sits next to its own label: {aligned}")
        say(f"   stats: {format_stats(pairs.stats)}")


def _values(values: np.ndarray) -> str:
    """A fixed-width rendering of a 1-d float array: ``[ 4.0 17.0]``."""
    return "[" + " ".join(f"{float(v):4.1f}" for v in values) + "]"
