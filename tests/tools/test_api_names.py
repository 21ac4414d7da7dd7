"""One name and one unit per idea across the public API (issue 38).

Every parameter of every public callable (the functions and classes of ``__all__``,
their public methods, the streams' methods) is a name of ``VOCABULARY``, each with its
one meaning and unit, or a one-off of ``ONE_OFF``; a synonym of a shared name fails,
naming the name to use.  The shared defaults are pinned (``prefetch`` is ``None``
everywhere: ``DEFAULT_PREFETCH``, or 0 for the exact shuffle), and the former names
still work with a ``DeprecationWarning``.  A new parameter joins ``VOCABULARY`` (with
its unit) or ``ONE_OFF`` once it is checked not to be a second name of one there.
"""

from __future__ import annotations

import inspect
import re
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

import daskzarr_batches as dzb
from daskzarr_batches.errors import install_hint
from daskzarr_batches.plan import DEFAULT_MEMORY_BUDGET
from daskzarr_batches.streams.checks import given_value

#: the names several entry points share: each one meaning, one unit (docs/parameters.md)
VOCABULARY = {
    "array": "one array: zarr, dask or numpy, a path or URL, a Collection or ChunkSubset",
    "data": "an array, or a tuple / dict of arrays, an xarray.Dataset (a Loader's batches)",
    "features": "the paired streams' first array",
    "labels": "the array of labels (the Loader's: its key or role in data)",
    "sources": "a sequence of datasets, each what data is (concat, mix)",
    "source": "where one array lives: an array, group, store, path or URL (open_array)",
    "path": "the array inside a store or group",
    "batch_size": "samples per batch",
    "prefetch": "windows read ahead of the one consumed",
    "io_concurrency": "store reads in flight (a stats field: the limit the stream ran with)",
    "concurrency": "chunk_stream only: the seed's name of io_concurrency",
    "memory_budget": "bytes",
    "window_bytes": "bytes of one window",
    "shuffle_buffer_size": "samples (or a byte size as a string)",
    "shuffle_quality": "a fraction of an exact shuffle's batch mixing",
    "timeout": "seconds",
    "retries": "attempts after a transient fault (a stats field: retries made)",
    "seed": "an int seed",
    "epoch": "an epoch number",
    "client": "a distributed.Client",
    "cache": "a ChunkCache",
    "reader": "a factory(array, default) of the ChunkReader that decodes an array's chunks",
    "read": "a ReadOptions",
    "missing": "what an absent chunk reads as",
    "on_error": "what an undecodable chunk does",
    "storage_options": "fsspec-style options of a URL",
    "backend": "obstore or fsspec",
    "codec_pipeline": "zarrs or zarr-python",
    "drop_remainder": "whether the short last batch is dropped",
    "shuffle": "whether (or how) an epoch is shuffled",
    "transform": "a function of each item",
    "weights": "a weight per class or per source",
    "chunks": "samples per chunk (output arrays, a subset's chunk sizes)",
    "shards": "chunks per shard of an output array",
}
#: names one entry point (or one family) has, and which no shared name means
ONE_OFF = frozenset({
    "axis", "bytes_distinct", "bytes_from_cache", "bytes_read", "bytes_written", "bytes_yielded",
    "cache_damaged", "cache_hits", "cache_misses", "chunk", "chunk_key", "chunks_missing",
    "chunks_read", "chunks_written", "combine", "compressors", "consumer_seconds", "count",
    "counts", "ddof", "delivered", "dim", "directory", "disk", "dtype", "even_batches", "extents",
    "fill", "fraction", "fractions", "func", "func_calls", "gap", "group", "ids", "index",
    "initial", "input_chunks_missing", "input_dims", "input_overlap", "items_yielded", "job_id",
    "key",
    "label_mixing", "length", "m2", "make", "make_stream", "mean", "members", "memory", "names",
    "nbytes", "next_seconds", "num_samples", "on_item", "ordered", "other", "out", "overwrite",
    "owner", "policy", "positions", "progress", "quota", "rank", "ranges", "replacement",
    "resume", "return_origins", "return_sources", "rng", "role", "rows", "runner", "sample_shape",
    "sampler", "samples", "samples_filled", "samples_per_epoch", "samples_per_source",
    "samples_yielded", "skipped", "spec", "start", "state", "stats", "stop", "store_busy_seconds",
    "store_queued_seconds", "store_request_seconds", "store_requests", "target_data",
    "target_dims", "target_offset", "time_to_first_batch", "token", "units", "units_failed",
    "units_skipped", "units_written", "urls_or_glob", "wait_seconds", "windows_read",
    "with_index", "worker", "workers", "world_size"
})  # fmt: skip
#: second names of a shared idea: the name to use instead
SYNONYMS = {
    "threads": "io_concurrency",
    "n_threads": "io_concurrency",
    "num_threads": "io_concurrency",
    "max_workers": "io_concurrency",
    "arrays": "data",
    "datas": "sources",
    "array_path": "path",
    "buffer_size": "shuffle_buffer_size",
    "prefetch_factor": "prefetch",
    "num_prefetch": "prefetch",
    "batchsize": "batch_size",
}
#: the stream constructors and the Loader, whose shared keywords have one default
STREAMS = [
    "Loader",
    "batch_stream",
    "shuffled_batch_stream",
    "paired_batch_stream",
    "paired_shuffled_batch_stream",
    "patch_stream",
    "plan_epoch",
]


def _public_callables() -> Iterator[tuple[str, Callable[..., Any]]]:
    for name in dzb.__all__:
        value = getattr(dzb, name)
        if inspect.isclass(value) and issubclass(value, BaseException):
            continue  # the errors take a message
        if inspect.isclass(value):
            yield name, value
            for method, member in inspect.getmembers(value, callable):
                if not method.startswith("_") and not inspect.isclass(member):
                    yield f"{name}.{method}", member
        elif callable(value):
            yield name, value


def _parameters() -> Iterator[tuple[str, inspect.Parameter]]:
    for where, func in _public_callables():
        for parameter in inspect.signature(func).parameters.values():
            if parameter.name not in ("self", "cls"):
                yield where, parameter


def test_every_public_parameter_has_one_name_per_idea() -> None:
    synonyms = [
        f"{where}({p.name}=): use {SYNONYMS[p.name]}"
        for where, p in _parameters()
        if p.name in SYNONYMS
    ]
    assert synonyms == [], "second names of one idea:\n" + "\n".join(synonyms)
    known = VOCABULARY.keys() | ONE_OFF
    unknown = sorted({f"{where}({p.name}=)" for where, p in _parameters() if p.name not in known})
    assert unknown == [], (
        "new parameter names: add each to VOCABULARY (with its unit) or ONE_OFF, once it "
        "is not a second name of one there:\n" + "\n".join(unknown)
    )
    assert not set(VOCABULARY) & ONE_OFF


def test_concurrency_is_chunk_streams_only() -> None:
    """The seed's ``chunk_stream(concurrency=)`` stays; everywhere else it is io_concurrency."""
    having = sorted(where for where, p in _parameters() if p.name == "concurrency")
    assert having == ["chunk_stream"]


@pytest.mark.parametrize("name", STREAMS)
def test_stream_keywords_have_one_default(name: str) -> None:
    parameters = inspect.signature(getattr(dzb, name)).parameters
    assert parameters["prefetch"].default is None  # DEFAULT_PREFETCH, 0 for the exact shuffle
    if "io_concurrency" in parameters:
        assert given_value(parameters["io_concurrency"].default) is None  # a read keyword: UNSET
    if "memory_budget" in parameters:
        assert parameters["memory_budget"].default == DEFAULT_MEMORY_BUDGET
    assert parameters["seed" if "seed" in parameters else "batch_size"].default in (
        0,
        inspect.Parameter.empty,
    )


def test_array_argument_is_named_by_what_it_takes() -> None:
    """``array``: one array; ``data``: an array or a structure of them; ``sources``: many."""
    first = {
        where: next(iter(inspect.signature(func).parameters.values())).name
        for where, func in _public_callables()
        if "." not in where
    }
    one = ["batch_stream", "shuffled_batch_stream", "chunk_stream", "count_batches", "plan_epoch"]
    assert {first[name] for name in one} == {"array"}
    structured = ["Loader", "patch_stream", "chunk_split", "write_shuffled"]
    assert {first[name] for name in structured} == {"data"}
    assert first["concat"] == first["mix"] == "sources"
    assert list(inspect.signature(dzb.map_to_zarr).parameters)[:2] == ["func", "data"]


X = np.arange(24, dtype=np.float32).reshape(12, 2)


def _store(tmp_path: Path, name: str) -> str:
    root = zarr.open_group(str(tmp_path / name), mode="w")
    root.create_array("x", shape=X.shape, chunks=(4, 2), dtype=X.dtype)[:] = X
    return str(tmp_path / name)


def _sums(stream: Any) -> list[float]:
    return sorted(float(np.sum(item)) for item in stream)


FORMER: list[tuple[str, Callable[[Path, dict[str, Any]], Any], str, str, Any]] = [
    ("map_chunks", lambda _, kw: _sums(dzb.map_chunks(np.asarray, X, **kw)), "concurrency",
     "io_concurrency", 2),
    ("reduce_chunks", lambda _, kw: float(dzb.reduce_chunks(np.sum, np.add, X, **kw)),
     "concurrency", "io_concurrency", 2),
    ("feature_moments", lambda _, kw: dzb.feature_moments(X, **kw).mean.tolist(),
     "concurrency", "io_concurrency", 2),
    ("open_collection", lambda p, kw: dzb.open_collection(
        [_store(p, "a.zarr"), _store(p, "b.zarr")], "x", **kw).shape, "threads",
     "io_concurrency", 1),
    ("open_collection", lambda p, kw: dzb.open_collection([_store(p, "a.zarr")], **kw).shape,
     "array_path", "path", "x"),
    ("Loader", lambda _, kw: [b.tolist() for b in dzb.Loader(batch_size=5, **kw)], "arrays",
     "data", X),
    ("concat", lambda _, kw: dzb.concat(**kw).shape, "datas", "sources", [X, X]),
]  # fmt: skip


@pytest.mark.parametrize(("func", "call", "old", "new", "value"), FORMER)
def test_former_names_still_work_with_a_deprecation_warning(
    tmp_path: Path, func: str, call: Any, old: str, new: str, value: Any
) -> None:
    expected = call(tmp_path, {new: value})
    with pytest.warns(DeprecationWarning, match=rf"{func}: {old}= is deprecated, renamed {new}="):
        assert call(tmp_path, {old: value}) == expected
    with pytest.raises(dzb.ArgumentTypeError, match=rf"{old}= is the former name of {new}="):
        call(tmp_path, {old: value, new: value})


def test_former_name_warns_at_the_callers_line() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dzb.feature_moments(X, concurrency=1)  # type: ignore[call-arg]
    (warning,) = [w for w in caught if issubclass(w.category, DeprecationWarning)]
    assert warning.filename == __file__


def test_a_former_name_beside_the_new_one_given_positionally_is_refused() -> None:
    with pytest.raises(dzb.ArgumentTypeError, match="arrays= is the former name of data="):
        dzb.Loader(X, 5, arrays=X)  # type: ignore[call-arg]


def test_chunk_streams_concurrency_is_the_seeds_name_and_does_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        chunks = list(dzb.chunk_stream(X, concurrency=2))
    assert np.array_equal(np.concatenate(chunks), X)
    with pytest.raises(dzb.ArgumentValueError, match="concurrency=2 and io_concurrency=3"):
        dzb.chunk_stream(X, concurrency=2, io_concurrency=3)


def test_install_hints_work_from_a_clone() -> None:
    """The package is installed from a clone: every hint says ``pip install '.[extra]'``."""
    package = Path(dzb.__file__).parent
    wrong = []
    for path in sorted(package.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        for match in re.finditer(r"daskzarr-batches\[(\w+)\]", text):
            if f"'.[{match.group(1)}]'" not in text[max(0, match.start() - 300) : match.start()]:
                wrong.append(f"{path.relative_to(package)}: {match.group(0)}")
    assert wrong == [], "name the clone's form, pip install '.[extra]':\n" + "\n".join(wrong)
    assert "pip install '.[s3]' from a clone" in install_hint("s3")


def test_prefetch_none_resolves_by_the_order() -> None:
    """``prefetch=None``: DEFAULT_PREFETCH for the sequential and buffered orders, 0 exact."""
    from daskzarr_batches.plan import DEFAULT_PREFETCH

    with dzb.batch_stream(X, 4) as sequential, dzb.paired_batch_stream(X, X, 4) as pairs:
        assert sequential.spec.prefetch == pairs.spec.prefetch == DEFAULT_PREFETCH
    with dzb.shuffled_batch_stream(X, 4, shuffle_buffer_size=4) as buffered:
        assert buffered.spec.prefetch == DEFAULT_PREFETCH
    with dzb.shuffled_batch_stream(X, 4) as exact:
        assert exact.spec.prefetch == 0
    assert dzb.Loader(X, 4, shuffle=True).spec.prefetch == 0
