"""The ``daskzarr-batches`` argument parser: its commands and options, the value types
of its flags (sizes, ``KEY=VALUE``, shuffle buffers) and the usage errors argparse
cannot express (``_check_combinations``).  ``tools.cli`` runs the commands and
re-exports ``build_parser``."""

from __future__ import annotations

import argparse
import json
import re
from typing import Any

from .. import ArgumentValueError, __version__
from ..store.backends import BACKENDS
from ..streams.spec import byte_size
from .bench import CHUNK_ROWS, FEATURES, ROWS

__all__ = ["PROG", "build_parser"]

PROG = "daskzarr-batches"


def build_parser() -> argparse.ArgumentParser:
    """The ``daskzarr-batches`` argument parser (one subcommand per job)."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Stream numpy minibatches and per-chunk blocks out of chunked Zarr arrays.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    demo = commands.add_parser(
        "demo",
        help="stream a tiny in-memory Zarr array three ways (chunks, batches, shuffled pairs)",
        description=(
            "Build the example's data (10 x 4 float32 features holding 0..39 and 10 labels "
            "holding 0..9, in chunks of 4 samples in a Zarr MemoryStore) and print one array "
            "per stored chunk, minibatches of 3 samples and shuffled feature/label pairs, "
            "with the stream statistics."
        ),
    )
    _add_cluster_options(demo)
    _add_info_parser(commands)
    _add_bench_parser(commands)
    _add_shuffle_parser(commands)
    return parser


def _add_cluster_options(command: argparse.ArgumentParser) -> None:
    where = command.add_mutually_exclusive_group()
    where.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="compute on an existing dask.distributed scheduler, e.g. tcp://10.0.0.5:8786 "
        "(its workers need daskzarr_batches installed)",
    )
    where.add_argument(
        "--local-cluster",
        metavar="N",
        type=_positive_int,
        help="start a LocalCluster of N process workers on 127.0.0.1, compute on it, shut it down",
    )


def _add_store_options(command: argparse.ArgumentParser) -> None:
    _add_url_options(command)
    command.add_argument(
        "--quiet",
        "-q",
        action="store_true",
        help="no progress bars (they are off anyway when stderr is not a terminal)",
    )


def _add_url_options(command: argparse.ArgumentParser) -> None:
    """``--storage-option`` and ``--backend``: how a URL STORE is read."""
    command.add_argument(
        "--storage-option",
        metavar="KEY=VALUE",
        action="append",
        type=_key_value,
        default=[],
        dest="storage_options",
        help="a storage option for a URL store, fsspec style (repeatable; translated for "
        "the obstore backend, whose own config keys work too); VALUE is parsed as "
        "JSON when it can be (true, 3, null, {...}), else taken as a string",
    )
    command.add_argument(
        "--backend",
        choices=BACKENDS,
        default="auto",
        help="what reads a URL store: obstore (zarr's ObjectStore), fsspec, or auto "
        "(obstore when installed, else fsspec; the default)",
    )


def _add_info_parser(commands: Any) -> None:
    info = commands.add_parser(
        "info",
        help="list the arrays of a Zarr store: shapes, chunks, shards, codecs, bytes; "
        "--check reads every chunk",
        description=(
            "For every array in STORE (a single array, or every array in a group, "
            "recursively): path, Zarr format, shape, dtype, chunk shape, shards (shard shape "
            "and chunks per shard), codecs, the chunks (or shards) stored against those the "
            "chunk grid expects, the bytes stored and the decoded bytes. With --check, "
            "read every stored chunk and report the undecodable ones (the exit status is "
            "then 1 if there is any) and the absent ones (they read as the fill value, as the "
            "Zarr spec says: no error)."
        ),
    )
    info.add_argument(
        "store",
        metavar="STORE",
        nargs="+",
        help="a directory, a .zip file or a URL; several: each, then their arrays as a collection",
    )
    info.add_argument(
        "--check",
        action="store_true",
        help="read every chunk (every shard of a sharded array); list absent ones (the fill "
        "value) and report corrupt ones, exiting with status 1 if any",
    )
    info.add_argument("--json", action="store_true", help="print a JSON list, one object per array")
    _add_store_options(info)


def _add_bench_parser(commands: Any) -> None:
    bench = commands.add_parser(
        "bench",
        help="time epochs of a batch stream: samples/s, MB/s, read amplification, wait share",
        description=(
            "Run epochs of the stream the options choose (batch_stream, shuffled_batch_stream "
            "or their paired_ versions with --labels; a new stream per epoch, epoch=e) over "
            "an array of STORE, consuming the batches without work, and print the "
            "throughput per epoch and in total, the read amplification, the share of time "
            "spent waiting for data and the stream's error counters. Without STORE, a "
            f"temporary dataset of {ROWS:,} x {FEATURES} float32 features and int64 labels "
            f"in {CHUNK_ROWS}-row chunks is generated (and removed afterwards) and streamed "
            "as pairs."
        ),
    )
    bench.set_defaults(subparser=bench)
    bench.add_argument(
        "store",
        metavar="STORE",
        nargs="*",
        help="a directory, a .zip file or a URL (optional); several: one collection "
        "(open_collection) of their arrays",
    )
    _add_bench_data_options(bench.add_argument_group("data"))
    _add_bench_stream_options(bench.add_argument_group("stream"))
    _add_read_policy_options(bench.add_argument_group("read policy"))
    bench.add_argument("--json", action="store_true", help="print the summary as JSON")
    _add_cluster_options(bench)
    _add_store_options(bench)


def _add_bench_data_options(data: Any) -> None:
    data.add_argument("--array", metavar="PATH", help="the features array in STORE")
    data.add_argument(
        "--labels", metavar="PATH", help="a labels array in STORE: stream (features, labels)"
    )
    data.add_argument(
        "--rows", type=_positive_int, help=f"samples of the generated dataset (default {ROWS})"
    )
    data.add_argument(
        "--features",
        type=_positive_int,
        help=f"features per sample of the generated dataset (default {FEATURES})",
    )
    data.add_argument(
        "--chunk-rows",
        type=_positive_int,
        help=f"rows per chunk of the generated dataset (default {CHUNK_ROWS})",
    )


def _add_bench_stream_options(stream: Any) -> None:
    stream.add_argument(
        "--batch-size", type=int, required=True, metavar="B", help="samples per batch (required)"
    )
    order = stream.add_mutually_exclusive_group()
    order.add_argument(
        "--shuffle-buffer",
        type=_buffer_size,
        metavar="S",
        help="buffered shuffle through about S samples, or as many as a size in bytes "
        "holds, e.g. 256MiB or 1GB, or 'auto': the smallest buffer reaching "
        "--shuffle-quality (shuffle_buffer_size)",
    )
    order.add_argument("--exact", action="store_true", help="exact shuffle")
    stream.add_argument(
        "--shuffle-quality",
        type=float,
        metavar="Q",
        help="with --shuffle-buffer auto: the fraction of an exact shuffle's batch "
        "mixing to reach, in (0, 1] (default 0.85; shuffle_quality)",
    )
    stream.add_argument(
        "--memory-budget",
        type=_size,
        metavar="M",
        help="the exact shuffle's (or --shuffle-buffer auto's) memory_budget in bytes; "
        "K, M, G suffixes are powers of "
        "1024 (e.g. 256M)",
    )
    stream.add_argument(
        "--seed", type=int, help="seed of a shuffle (default 0, so runs repeat the same order)"
    )
    stream.add_argument("--epochs", type=_positive_int, default=1, help="epochs to run (default 1)")
    stream.add_argument(
        "--cache-dir",
        metavar="DIR",
        help="read through a ChunkCache that keeps decoded chunks in DIR too (kept across "
        "runs, shared by processes): the first epoch fills it, later epochs and runs read it",
    )
    stream.add_argument(
        "--cache-memory",
        metavar="SIZE",
        help="read through a ChunkCache holding SIZE of decoded chunks in memory (e.g. 2GiB; "
        "0 with --cache-dir: the directory alone); default 1GiB when --cache-dir is given",
    )


def _add_read_policy_options(policy: Any) -> None:
    policy.add_argument(
        "--missing",
        choices=["fill", "warn", "error"],
        default="fill",
        help="chunks absent from the store: the fill value, as the Zarr spec says (default: "
        "counted in chunks_missing), the same with a warning, or fail",
    )
    policy.add_argument(
        "--on-error",
        choices=["raise", "skip"],
        default="raise",
        help="chunks that do not decode: fail (default) or skip their samples",
    )
    policy.add_argument(
        "--retries",
        type=int,
        default=3,
        help="retries of a read after a transient fault (default 3)",
    )


def _add_shuffle_parser(commands: Any) -> None:
    shuffle = commands.add_parser(
        "shuffle",
        help="write a seeded, exactly shuffled copy of arrays of STORE to OUT (resumable)",
        description=(
            "Write the samples of --array (and --labels, permuted together, rows aligned) in "
            "the order of an exact seeded permutation to OUT, under the same array names, out "
            "of core within --memory-budget. Run it again after an interruption: the chunks "
            "already written are kept and only the others are written (--overwrite starts "
            "over). Training then reads OUT in order."
        ),
    )
    shuffle.add_argument("store", metavar="STORE", help="a Zarr group: a directory or a URL")
    shuffle.add_argument("out", metavar="OUT", help="where the shuffled copy is written")
    shuffle.add_argument("--array", required=True, help="the array of STORE to shuffle")
    shuffle.add_argument("--labels", help="an array of STORE permuted with --array")
    shuffle.add_argument("--seed", type=int, default=0, help="the permutation's seed (default 0)")
    shuffle.add_argument(
        "--memory-budget",
        type=_size,
        default=256 * 2**20,
        help="bytes the windows in flight may hold, e.g. 1G (default 256M)",
    )
    shuffle.add_argument("--chunk-rows", type=_positive_int, help="rows per output chunk")
    shuffle.add_argument("--overwrite", action="store_true", help="start over")
    shuffle.add_argument(
        "--quiet", "-q", action="store_true", help="no progress bar (off anyway without a tty)"
    )
    _add_url_options(shuffle)
    _add_cluster_options(shuffle)


def _check_combinations(args: argparse.Namespace) -> None:
    """Usage errors argparse cannot express (exit status 2 with the usage)."""
    parser = getattr(args, "subparser", None)
    if parser is None:
        return
    if not args.store:
        for flag, value in (("--array", args.array), ("--labels", args.labels)):
            if value is not None:
                parser.error(f"{flag} names an array in STORE; give STORE too")
        if args.storage_options:
            parser.error("--storage-option needs a STORE")
        if args.backend != "auto":
            parser.error("--backend needs a STORE")
    else:
        for flag, value in (
            ("--rows", args.rows),
            ("--features", args.features),
            ("--chunk-rows", args.chunk_rows),
        ):
            if value is not None:
                parser.error(f"{flag} sizes the generated dataset; it cannot go with STORE")
    auto = getattr(args, "shuffle_buffer", None) == "auto"
    if args.memory_budget is not None and not (args.exact or auto):
        parser.error(
            "--memory-budget is the exact shuffle's budget (or what --shuffle-buffer auto "
            "may hold); it needs --exact or --shuffle-buffer auto"
        )
    if getattr(args, "shuffle_quality", None) is not None and not auto:
        parser.error("--shuffle-quality sizes --shuffle-buffer auto; it needs it")
    if args.seed is not None and not (args.exact or args.shuffle_buffer is not None):
        parser.error("--seed seeds a shuffle; it needs --shuffle-buffer or --exact")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _key_value(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` with VALUE parsed as JSON when it is JSON, else kept as a string."""
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    return key, value


_SIZE = re.compile(r"^\s*(\d+)\s*([KMGT]?)(?:i?B)?\s*$", re.IGNORECASE)


def _buffer_size(text: str) -> int | str:
    """``--shuffle-buffer``: an integer is samples, ``auto`` the smallest buffer meeting
    ``--shuffle-quality``, anything else a size in bytes (``256MiB``)."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        pass
    try:
        byte_size("--shuffle-buffer", text)
    except ArgumentValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def _size(text: str) -> int:
    """Bytes: ``1048576``, ``512K``, ``256M``, ``1G``, ``2GiB`` (suffixes are powers of 1024)."""
    match = _SIZE.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"expected a size such as 268435456 or 256M, got {text!r}")
    power = " KMGT".index(match[2].upper() or " ")
    return int(match[1]) * 1024**power
