"""The command line: ``daskzarr-batches COMMAND`` (or ``python -m daskzarr_batches COMMAND``).

Four commands: ``demo`` (``tools.demo``: the README's example data, streamed
three ways), ``info`` (``tools.info``: what a store holds,
``--check`` reads every chunk), ``bench`` (``tools.bench``: epochs of a stream,
timed) and ``shuffle`` (``write_shuffled``: a seeded, exactly shuffled copy,
resumable).  Adapters on top of the public API: they import only what
``daskzarr_batches`` exports.  ``info`` and ``bench`` show tqdm progress bars
on stderr when it is a terminal (never with ``--quiet``), and report a
library error (``DaskZarrBatchesError``) as one line,
``daskzarr-batches: error: <message>``, with exit status 2, the status of a
usage error too.  ``bench --missing warn`` reports chunks absent from the
store (``MissingChunksWarning``) as one line too, ``daskzarr-batches: warning:
...``, in its own words (the default ``--missing fill`` counts them only).
A library message is printed in the command's words (:func:`_in_cli_words`):
its flags instead of the keywords (``--overwrite``, not ``overwrite=True``) and
a store as the user gave it (``x.zarr``, not ``file://x.zarr``).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import re
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TextIO

from tqdm import tqdm

from .. import (
    ArgumentValueError,
    ChunkCache,
    DaskZarrBatchesError,
    MissingChunksWarning,
    WriteStats,
    __version__,
    open_array,
    write_shuffled,
)
from ..store.backends import BACKENDS
from ..streams.spec import byte_size
from .bench import CHUNK_ROWS, FEATURES, ROWS, BenchSettings, run_bench
from .demo import run_demo
from .info import run_info

__all__ = ["build_parser", "main"]

PROG = "daskzarr-batches"

#: Seconds to wait for a scheduler given with ``--scheduler`` (and for a worker).
CONNECT_TIMEOUT = 10.0
#: Seconds a cluster may take for one window or chunk before the demo gives up.
WINDOW_TIMEOUT = 60.0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line and return its exit status.

    Parameters
    ----------
    argv : sequence of str, optional
        Arguments without the program name; default ``sys.argv[1:]``.

    Returns
    -------
    int
        0 on success.  ``demo``: 1 when it could not run (for example the
        scheduler is unreachable).  ``info``: 1 when ``--check`` found a
        corrupt chunk (absent chunks are listed, not errors).  ``bench``: 1 when the scheduler is
        unreachable.  ``info`` and ``bench``: 2 for a library error
        (``DaskZarrBatchesError``), printed as one line on stderr.  Invalid
        arguments exit with status 2 through ``argparse``.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    out, err = sys.stdout, sys.stderr
    try:
        if args.command == "demo":
            return _demo_command(args, out, err)
        _check_combinations(args)
        try:
            if args.command == "info":
                return _info_command(args, out, err)
            if args.command == "shuffle":
                return _shuffle_command(args, out, err)
            return _bench_command(args, out, err)
        except DaskZarrBatchesError as exc:
            _error(err, _in_cli_words(str(exc), args))
            return 2
        except _ConnectError as exc:
            _error(err, exc)
            return 1
        except KeyboardInterrupt:
            _error(err, "interrupted")
            return 130
    except BrokenPipeError:  # e.g. ``daskzarr-batches demo | head``: not an error
        # Python would complain again when flushing stdout at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


#: a library message's keywords -> the flags that set them (``shuffle``, ``bench``)
_FLAG_WORDS = (
    (re.compile(r"pass overwrite=True"), "pass --overwrite"),
    (re.compile(r"resume=True to complete it or overwrite=True"), "--overwrite"),
    (re.compile(r"pass missing='fill' or 'warn'"), "pass --missing fill or --missing warn"),
)


def _in_cli_words(message: str, args: argparse.Namespace) -> str:
    """A library message as the command's user reads it: flags, and stores as given.

    ``write_shuffled``'s refusals name its keywords (``overwrite=True``,
    ``job_id``); the command sets them with ``--overwrite`` and ``--seed``.  A
    local store opened through fsspec is named ``file://PATH``; the user gave
    ``PATH``, so the prefix goes unless the user typed a ``file://`` URL.
    """
    for pattern, words in _FLAG_WORDS:
        message = pattern.sub(words, message)
    seed = re.search(r"its seed was (\d+), this job's is \d+", message)
    resume = (
        f"--seed {seed[1]} to resume"
        if seed
        else "the same --seed, --array, --labels and STORE to resume"
    )
    message = message.replace("the same job_id / input to resume", resume)
    given = getattr(args, "store", None)
    stores = [given] if isinstance(given, str) else list(given or [])
    stores += [getattr(args, "out", None) or ""]
    if not any(str(store).startswith("file://") for store in stores):
        message = re.sub(r"\bfile://(?=\S)", "", message)
    return message


def _error(err: TextIO, message: object) -> None:
    """``daskzarr-batches: error: <message>`` on one line."""
    text = " ".join(part.strip() for part in str(message).splitlines() if part.strip())
    print(f"{PROG}: error: {text}", file=err)


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


def _shuffle_command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    names = [args.array] if args.labels is None else [args.array, args.labels]
    options = dict(args.storage_options) or None
    data = {
        name: open_array(args.store, name, storage_options=options, backend=args.backend)
        for name in names
    }
    stats = WriteStats()
    with _compute_target(args.scheduler, args.local_cluster) as (client, described):
        write_shuffled(
            data,
            args.out,
            seed=args.seed,
            memory_budget=args.memory_budget,
            chunks=args.chunk_rows,
            overwrite=args.overwrite,
            client=client,
            timeout=None if client is None else WINDOW_TIMEOUT,
            progress=_progress(err, args.quiet) is not None,
            stats=stats,
            storage_options=options if "://" in str(args.out) else None,  # a URL OUT too
            backend=args.backend,
        )
    print(
        f"shuffled {', '.join(names)} of {args.store} to {args.out} (seed {args.seed}, "
        f"{described}): {stats.units_written} of {stats.units} chunks written, "
        f"{stats.units_skipped} already complete, {stats.bytes_written} bytes",
        file=out,
    )
    return 0


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


def _progress(err: TextIO, quiet: bool) -> Callable[..., Any] | None:
    """A tqdm factory writing to ``err``, or None when bars are off.

    Bars are off with ``--quiet`` and when ``err`` is not a terminal (a
    pipe, a file, a CI log).
    """
    isatty = getattr(err, "isatty", None)
    if quiet or not (callable(isatty) and isatty()):
        return None
    return functools.partial(tqdm, file=err, dynamic_ncols=True)


def _one_or_many(stores: Sequence[str]) -> str | list[str] | None:
    """``bench``'s STORE arguments: none, one path, or several (a collection)."""
    if not stores:
        return None
    return stores[0] if len(stores) == 1 else list(stores)


def _info_command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    return run_info(
        args.store,
        out,
        storage_options=dict(args.storage_options) or None,
        backend=args.backend,
        check=args.check,
        as_json=args.json,
        progress=_progress(err, args.quiet),
    )


def _bench_command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    generated = {
        "rows": args.rows or ROWS,
        "features": args.features or FEATURES,
        "chunk_rows": args.chunk_rows or CHUNK_ROWS,
    }
    with _compute_target(args.scheduler, args.local_cluster) as (client, described):
        settings = BenchSettings(
            batch_size=args.batch_size,
            shuffle_buffer_size=args.shuffle_buffer,
            shuffle_quality=args.shuffle_quality,
            exact=args.exact,
            memory_budget=args.memory_budget,
            seed=0 if args.seed is None else args.seed,
            epochs=args.epochs,
            client=client,
            timeout=None if client is None else WINDOW_TIMEOUT,
            missing=args.missing,
            on_error=args.on_error,
            retries=args.retries,
            cache=_cache(args.cache_dir, args.cache_memory),
        )
        with _missing_chunks_reported(err, args) as summary:
            summary.update(
                run_bench(
                    out,
                    settings,
                    store=_one_or_many(args.store),
                    array=args.array,
                    labels=args.labels,
                    storage_options=dict(args.storage_options) or None,
                    backend=args.backend,
                    where=described,
                    as_json=args.json,
                    progress=_progress(err, args.quiet),
                    **generated,
                )
            )
    return 0


def _cache(directory: str | None, memory: str | None) -> ChunkCache | None:
    """The bench's ``ChunkCache`` (``None`` without ``--cache-dir`` or ``--cache-memory``)."""
    if directory is None and memory is None:
        return None
    size: int | str = "1GiB" if memory is None else memory
    if isinstance(size, str) and size.strip().isdigit():
        size = int(size)
    return ChunkCache(size, directory=directory)


@contextlib.contextmanager
def _missing_chunks_reported(err: TextIO, args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    """Report the streams' ``MissingChunksWarning`` as one line on ``err``, at the end.

    Yields a dict to fill with ``run_bench``'s summary, whose epochs give the
    count; without it (the run failed) the warning's own count.  Other
    warnings are shown as Python shows them.
    """
    summary: dict[str, Any] = {}
    caught: list[MissingChunksWarning] = []
    with warnings.catch_warnings():
        show = warnings.showwarning

        def record(message: Any, category: Any, *rest: Any, **kwargs: Any) -> None:
            if isinstance(message, MissingChunksWarning):
                caught.append(message)
            else:
                show(message, category, *rest, **kwargs)

        warnings.showwarning = record
        warnings.simplefilter("always", MissingChunksWarning)  # every epoch's stream
        try:
            yield summary
        finally:
            if caught:
                first = caught[0]
                epochs = summary.get("epochs") or []
                count = max((e["chunks_missing"] for e in epochs), default=first.count)
                each = " in each epoch" if len(epochs) > 1 else ""
                message = (
                    f"{PROG}: warning: {count} chunk{'s were' if count != 1 else ' was'} "
                    f"missing from the store{each} and read as the fill value (first: "
                    f"{first.key!r} of array {first.array}); --missing fill (the default) "
                    "reads them silently, --missing error fails"
                )
                print(_in_cli_words(message, args), file=err)


def _demo_command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    try:
        with _compute_target(args.scheduler, args.local_cluster) as (client, described):
            timeout = None if client is None else WINDOW_TIMEOUT
            run_demo(out, client=client, where=described, timeout=timeout)
    except (_ConnectError, DaskZarrBatchesError) as exc:
        print(f"daskzarr-batches demo: error: {exc}", file=err)
        return 1
    return 0


class _ConnectError(Exception):
    """The scheduler given with ``--scheduler`` could not be reached."""


@contextlib.contextmanager
def _compute_target(scheduler: str | None, local_cluster: int | None) -> Iterator[tuple[Any, str]]:
    """Yield ``(client or None, description)``; clusters we start are stopped after."""
    if scheduler is None and local_cluster is None:
        yield None, "local threaded scheduler"
        return
    import distributed

    if scheduler is not None:
        try:
            client = distributed.Client(scheduler, timeout=CONNECT_TIMEOUT, set_as_default=False)
        except (OSError, TimeoutError, ValueError) as exc:
            raise _ConnectError(
                f"could not connect to the scheduler at {scheduler!r} within "
                f"{CONNECT_TIMEOUT:g} s: {exc}"
            ) from exc
        with client:
            try:
                client.wait_for_workers(1, timeout=CONNECT_TIMEOUT)
            except TimeoutError as exc:
                raise _ConnectError(
                    f"the scheduler at {scheduler!r} has no workers after {CONNECT_TIMEOUT:g} s"
                ) from exc
            workers = len(client.scheduler_info().get("workers", {}))
            plural = "" if workers == 1 else "s"
            yield client, f"distributed scheduler {scheduler} ({workers} worker{plural})"
        return
    assert local_cluster is not None
    with (
        distributed.LocalCluster(
            n_workers=local_cluster,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=":0",  # never 8787: another cluster may hold it
        ) as cluster,
        distributed.Client(cluster, set_as_default=False) as client,
    ):
        yield client, f"LocalCluster of {local_cluster} process workers on 127.0.0.1"
