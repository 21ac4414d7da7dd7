"""StreamSpec: one validated value behind every batch stream and plan_epoch."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import pickle
import threading
from typing import Any

import numpy as np
import pytest
import zarr
import zarr.storage

import daskzarr_batches as dzb
import daskzarr_batches.plan as dzplan
from daskzarr_batches.streams import StreamSpec

X = np.arange(40, dtype="f4").reshape(10, 4)
Y = np.arange(10, dtype="f4")


def test_spec_is_frozen_validated_and_kept_by_the_stream() -> None:
    with dzb.shuffled_batch_stream(X, 3, seed=5, shuffle_buffer_size=4) as stream:
        spec = stream.spec
        assert isinstance(spec, StreamSpec)
        assert (spec.shuffle, spec.seed, spec.batch_size, spec.prefetch) == ("buffer", 5, 3, 2)
        assert stream.plan.summary() == spec.plan().summary()
        with pytest.raises(dataclasses.FrozenInstanceError):
            spec.batch_size = 4  # type: ignore[misc]
    # replace re-validates
    with pytest.raises(dzb.ArgumentValueError, match="batch_size"):
        dataclasses.replace(spec, batch_size=0)
    assert spec.with_epoch(3).epoch == 3 and spec.with_epoch(3).seed == 5


def test_defaults_resolve_in_the_spec() -> None:
    exact = StreamSpec((X,), 2, shuffle="exact")
    assert exact.prefetch == 0 and isinstance(exact.seed, int)  # entropy drawn once, kept
    assert StreamSpec((X,), 2).prefetch == dzplan.DEFAULT_PREFETCH
    assert StreamSpec((X, Y), 2).roles == ("features", "labels")
    assert StreamSpec((X,), 2, timeout=float("inf")).timeout is None


BAD_FIELDS: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"batch_size": 0}, dzb.ArgumentValueError, "batch_size"),
    ({"batch_size": 2.5}, dzb.ArgumentTypeError, "batch_size"),
    ({"memory_budget": "a"}, dzb.ArgumentTypeError, "memory_budget"),
    ({"window_bytes": 0}, dzb.ArgumentValueError, "window_bytes"),
    ({"prefetch": -1}, dzb.ArgumentValueError, "prefetch"),
    ({"epoch": -1}, dzb.ArgumentValueError, "epoch"),
    ({"drop_remainder": 1}, dzb.ArgumentTypeError, "drop_remainder"),
    ({"timeout": 0}, dzb.ArgumentValueError, "timeout"),
    ({"timeout": float("nan")}, dzb.ArgumentValueError, "timeout"),
    ({"timeout": "1"}, dzb.ArgumentTypeError, "timeout"),
    ({"client": "tcp://x:1"}, dzb.ArgumentTypeError, "client"),
    ({"shuffle": "random"}, dzb.ArgumentValueError, "shuffle"),
    ({"seed": 1}, dzb.ArgumentValueError, "seed=1"),
    ({"shuffle": "buffer"}, dzb.ArgumentTypeError, "shuffle_buffer_size"),
    ({"shuffle": "exact", "shuffle_buffer_size": 3}, dzb.ArgumentValueError, "exact"),
    ({"shuffle": "exact", "seed": -2}, dzb.ArgumentValueError, "seed"),
]


@pytest.mark.parametrize(("fields", "error", "named"), BAD_FIELDS)
def test_every_field_is_validated_whatever_the_mode(
    fields: dict[str, Any], error: type[Exception], named: str
) -> None:
    with pytest.raises(error, match=named):
        StreamSpec((X,), **{"batch_size": 2, **fields})


@pytest.mark.parametrize(
    "kwargs",
    [{"memory_budget": "a"}, {"memory_budget": 0}, {"window_bytes": "a"}, {"prefetch": -1},
     {"epoch": 1.5}, {"drop_remainder": "no"}, {"batch_size": 0}],
)  # fmt: skip
@pytest.mark.parametrize("shuffle", [False, True])
def test_plan_epoch_validates_what_the_streams_validate(
    kwargs: dict[str, Any], shuffle: bool
) -> None:
    arguments = {"batch_size": 2, **kwargs}
    with pytest.raises(dzb.DaskZarrBatchesError) as planned:
        dzb.plan_epoch(X, shuffle=shuffle, **arguments)
    stream = dzb.shuffled_batch_stream if shuffle else dzb.batch_stream
    accepted = {"memory_budget", "prefetch", "epoch", "drop_remainder", "batch_size"}
    if not shuffle:
        accepted = {"window_bytes", "prefetch", "drop_remainder", "batch_size"}
    if set(kwargs) <= accepted:
        with pytest.raises(type(planned.value)):
            stream(X, **arguments)


def test_lengths_are_checked_by_the_spec() -> None:
    with pytest.raises(dzb.LengthMismatchError, match=r"features has 10 samples.*labels has 9"):
        StreamSpec((X, Y[:9]), 2)


@pytest.mark.parametrize("timeout", [float("inf"), 1e300, threading.TIMEOUT_MAX])
def test_huge_timeouts_mean_no_timeout(timeout: float) -> None:
    with dzb.batch_stream(X, 3, timeout=timeout) as stream:
        assert len(list(stream)) == 4
    with dzb.shuffled_batch_stream(X, 3, seed=0, timeout=timeout) as stream:
        assert len(list(stream)) == 4
    for ordered in (True, False):
        with dzb.chunk_stream(X, ordered=ordered, timeout=timeout) as chunks:
            assert sum(len(c) for c in chunks) == 10
    assert dzb.reduce_chunks(np.sum, np.add, X, timeout=timeout) == X.sum()


# --------------------------------------------------------------------------
# ReadOptions: the read keywords flat, or as one value (read=)

READ_KEYWORDS = {f.name for f in dataclasses.fields(dzb.ReadOptions)}


def test_every_entry_point_takes_the_read_keywords_flat_and_as_read() -> None:
    entry = {}
    for name in dzb.__all__:
        value = getattr(dzb, name)
        if name == "Loader" or (callable(value) and not isinstance(value, type)):
            parameters = inspect.signature(value).parameters
            if "retries" in parameters:
                entry[name] = parameters
    assert len(entry) >= 12, sorted(entry)
    for name, parameters in entry.items():
        assert READ_KEYWORDS | {"read"} <= set(parameters), (name, READ_KEYWORDS - set(parameters))
        for key in READ_KEYWORDS:  # the flat defaults are ReadOptions' own
            field = {f.name: f for f in dataclasses.fields(dzb.ReadOptions)}[key]
            assert parameters[key].default == field.default, (name, key)


#: every entry point with read keywords, called with the rest of its arguments valid
_READ_ENTRY_POINTS: dict[str, Any] = {
    "batch_stream": lambda **kw: dzb.batch_stream(X, 2, **kw),
    "shuffled_batch_stream": lambda **kw: dzb.shuffled_batch_stream(X, 2, **kw),
    "paired_batch_stream": lambda **kw: dzb.paired_batch_stream(X, Y, 2, **kw),
    "paired_shuffled_batch_stream": lambda **kw: dzb.paired_shuffled_batch_stream(X, Y, 2, **kw),
    "chunk_stream": lambda **kw: dzb.chunk_stream(X, **kw),
    "patch_stream": lambda **kw: dzb.patch_stream(X, {0: 2}, 2, **kw),
    "map_chunks": lambda **kw: dzb.map_chunks(np.max, X, **kw),
    "reduce_chunks": lambda **kw: dzb.reduce_chunks(np.max, max, X, **kw),
    "feature_moments": lambda **kw: dzb.feature_moments(X, **kw),
    "map_to_zarr": lambda **kw: dzb.map_to_zarr(np.negative, X, zarr.storage.MemoryStore(), **kw),
    "write_shuffled": lambda **kw: dzb.write_shuffled(X, zarr.storage.MemoryStore(), **kw),
    "Loader": lambda **kw: dzb.Loader(X, 2, **kw),
}
#: a value of each read option other than its default (a client aside: it needs a cluster)
_OTHER_VALUES: dict[str, Any] = {
    "timeout": 30.0,
    "missing": "error",
    "on_error": "skip",
    "retries": 5,
    "io_concurrency": 3,
    "cache": dzb.ChunkCache("1MiB"),
}


def _read_entry_points() -> set[str]:
    found = set()
    for name in dzb.__all__:
        value = getattr(dzb, name)
        if callable(value) and {"retries", "read"} <= set(_parameters(value)):
            found.add(name)
    return found


def _parameters(value: Any) -> Any:
    try:
        return inspect.signature(value).parameters
    except (TypeError, ValueError):
        return {}


@pytest.mark.parametrize("entry", sorted(_READ_ENTRY_POINTS))
def test_a_flat_keyword_given_at_its_default_must_agree_with_read(entry: str) -> None:
    """Given explicitly, a flat read keyword at its default value disagrees with a ``read=``
    holding another value, at every entry point; left out, or equal to read's, it does not."""
    assert _read_entry_points() == set(_READ_ENTRY_POINTS)  # a new entry point is listed here
    call = _READ_ENTRY_POINTS[entry]
    defaults = {f.name: f.default for f in dataclasses.fields(dzb.ReadOptions)}
    for name, other in _OTHER_VALUES.items():
        read = dzb.ReadOptions(**{name: other})
        disagrees = rf"^{name}=.* disagrees with read\.{name}="
        with pytest.raises(dzb.ArgumentValueError, match=disagrees):
            call(read=read, **{name: defaults[name]})
    agreeing = dzb.ReadOptions(missing="fill", retries=5)
    result = call(read=agreeing, missing="fill", retries=5)  # agreeing, a default among them
    getattr(result, "close", lambda: None)()
    assert _parameters(getattr(dzb, entry))["missing"].default == "fill"  # shown as the default


def test_the_flat_defaults_are_markers_equal_to_the_defaults_that_pickle_as_themselves() -> None:
    from daskzarr_batches.streams.spec import UNSET

    for field in dataclasses.fields(dzb.ReadOptions):
        marker = getattr(UNSET, field.name)
        assert marker == field.default and repr(marker) == repr(field.default)
        assert pickle.loads(pickle.dumps(marker)) is marker and copy.deepcopy(marker) is marker


def test_read_shares_one_set_and_a_flat_keyword_must_agree() -> None:
    read = dzb.ReadOptions(missing="error", retries=5, timeout=30)
    for stream in (
        dzb.batch_stream(X, 2, read=read),
        dzb.shuffled_batch_stream(X, 2, read=read),
        dzb.paired_batch_stream(X, Y, 2, read=read, retries=5),  # agreeing: allowed
        dzb.Loader(X, 2, read=read).stream(),
    ):
        assert (stream.spec.missing, stream.spec.retries, stream.spec.timeout) == ("error", 5, 30)
    assert dzb.chunk_stream(X, read=read).spec.read == read
    assert [float(m) for m in dzb.map_chunks(np.max, X, read=read)] == [float(X.max())]
    with pytest.raises(dzb.ArgumentValueError, match=r"retries=2 disagrees with read.retries=5"):
        dzb.batch_stream(X, 2, read=read, retries=2)
    with pytest.raises(dzb.ArgumentValueError, match=r"on_error='skip' disagrees"):
        dzb.map_chunks(np.max, X, read=read, on_error="skip")
    with pytest.raises(dzb.ArgumentTypeError, match=r"read must be a ReadOptions or None"):
        dzb.batch_stream(X, 2, read={"retries": 5})
    with pytest.raises(dzb.ArgumentValueError, match="retries"):
        dzb.ReadOptions(retries=-1)  # validated where it is made
