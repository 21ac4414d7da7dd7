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
import os
import re
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TextIO

from tqdm import tqdm

from .. import (
    ChunkCache,
    DaskZarrBatchesError,
    MissingChunksWarning,
    WriteStats,
    open_array,
    write_shuffled,
)
from .bench import CHUNK_ROWS, FEATURES, ROWS, BenchSettings, run_bench
from .cli_parser import PROG, _check_combinations, build_parser
from .cli_parser import _buffer_size as _buffer_size  # re-exported: tests use them here
from .cli_parser import _key_value as _key_value
from .cli_parser import _positive_int as _positive_int
from .cli_parser import _size as _size
from .demo import run_demo
from .info import run_info

__all__ = ["build_parser", "main"]

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
        f"{described}): {stats.units_written} of {stats.units} rows of chunks written "
        f"({stats.chunks_written} chunks of {len(names)} array{'s' * (len(names) > 1)}), "
        f"{stats.units_skipped} "
        f"already complete, {stats.bytes_written} bytes",
        file=out,
    )
    return 0


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
