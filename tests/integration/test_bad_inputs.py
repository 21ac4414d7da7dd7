"""Inputs that cannot work get a library error naming the value (issue 7's loose ends).

Each case here used to stream wrong data, drop information silently or fail
with a raw error from numpy, dask, zarr or zipfile.
"""

from __future__ import annotations

import json
import operator
import warnings
from collections.abc import Callable
from typing import Any

import dask.array as da
import numpy as np
import pytest
import zarr
from zarr.core.dtype import VariableLengthBytes

import daskzarr_batches as dzb

pytestmark = pytest.mark.timeout(120)

GOOD = np.arange(12.0).reshape(6, 2)


def entry_points() -> dict[str, Callable[[Any], Any]]:
    """Every public function that takes an array, as f(array)."""
    return {
        "batch_stream": lambda a: dzb.batch_stream(a, 2),
        "shuffled_batch_stream": lambda a: dzb.shuffled_batch_stream(a, 2, seed=0),
        "buffered": lambda a: dzb.shuffled_batch_stream(a, 2, seed=0, shuffle_buffer_size=3),
        "paired features": lambda a: dzb.paired_batch_stream(a, GOOD[: a.shape[0]], 2),
        "paired labels": lambda a: dzb.paired_batch_stream(GOOD[: a.shape[0]], a, 2),
        "paired_shuffled labels": lambda a: dzb.paired_shuffled_batch_stream(
            GOOD[: a.shape[0]], a, 2, seed=0
        ),
        "count_batches": lambda a: dzb.count_batches(a, 2),
        "plan_epoch": lambda a: dzb.plan_epoch(a, 2),
        "chunk_stream": dzb.chunk_stream,
        "map_chunks": lambda a: dzb.map_chunks(len, a),
        "reduce_chunks": lambda a: dzb.reduce_chunks(len, operator.add, a),
        "feature_moments": dzb.feature_moments,
    }


ENTRY_POINTS = list(entry_points())


def call(name: str, array: Any) -> None:
    result = entry_points()[name](array)
    if isinstance(result, dzb.Stream):
        result.close()
    raise AssertionError(f"{name} accepted {array!r}")


def role(name: str) -> str:
    return name.rsplit(" ", 1)[-1] if " " in name else "array"


# --------------------------------------------------------------------------
# dtypes that are not fixed-size numbers


def zarr_of(values: np.ndarray, dtype: Any = None) -> zarr.Array:
    with warnings.catch_warnings():  # U/S dtypes have no Zarr v3 spec: UnstableSpecificationWarning
        warnings.simplefilter("ignore")
        array = zarr.create_array(
            store={},
            shape=values.shape,
            chunks=(2,),
            dtype=values.dtype if dtype is None else dtype,
        )
        array[...] = values
    return array


STRINGS = np.array(["a", "bb", "c", "d"])
BAD_DTYPES: dict[str, Callable[[], Any]] = {
    "numpy str": lambda: STRINGS,
    "numpy bytes": lambda: STRINGS.astype("S"),
    "numpy object": lambda: np.array([1, "b", None, 2.0], dtype=object),
    "numpy StringDType": lambda: STRINGS.astype(np.dtypes.StringDType()),
    "numpy structured with a str field": lambda: np.zeros(4, dtype=[("x", "f4"), ("name", "U3")]),
    "dask object": lambda: da.from_array(np.array([1, "b", None, 2.0], dtype=object), chunks=2),
    "dask str": lambda: da.from_array(STRINGS, chunks=2),
    "zarr variable-length str": lambda: zarr_of(STRINGS, str),
    "zarr fixed-width str": lambda: zarr_of(STRINGS),
    "zarr fixed-width bytes": lambda: zarr_of(STRINGS.astype("S")),
    "zarr variable-length bytes": lambda: zarr_of(
        STRINGS.astype("S").astype(object), VariableLengthBytes()
    ),
    "zarr via open_array": lambda: dzb.open_array(zarr_of(STRINGS, str)),
}


@pytest.mark.parametrize("name", ENTRY_POINTS)
@pytest.mark.parametrize("kind", list(BAD_DTYPES))
def test_non_numeric_dtypes_are_refused_naming_role_and_dtype(name: str, kind: str) -> None:
    array = BAD_DTYPES[kind]()
    with pytest.raises(dzb.ArgumentTypeError) as info:
        call(name, array)
    message = str(info.value)
    assert message.startswith(f"{role(name)} has dtype {array.dtype}")
    assert "fixed-size numeric" in message and "structured" in message
    if array.dtype.names:
        assert "field 'name'" in message


ACCEPTED = {
    "bool": np.array([True, False, True, True]),
    "int8": np.arange(4, dtype="i1"),
    "complex64": np.arange(4).astype("c8"),
    "datetime64": np.array(["2020-01-01", "2020-01-02", "2021-01-01", "2022-01-01"], "M8[D]"),
    "timedelta64": np.arange(4).astype("m8[s]"),
    "structured": np.zeros(4, dtype=[("x", "f4"), ("y", "i2")]),
    "structured with a sub-array field": np.zeros(4, dtype=[("x", "f4"), ("y", "i2", (3,))]),
    "raw void": np.zeros(4, dtype="V3"),
}


@pytest.mark.parametrize(
    ("kind", "wrap"),
    [
        (kind, wrap)
        for kind in ACCEPTED
        for wrap in ("numpy", "dask", "zarr")
        if not (wrap == "zarr" and "sub-array" in kind)  # zarr 3.1 cannot create those
    ],
)
def test_fixed_size_dtypes_still_stream(kind: str, wrap: str) -> None:
    values = ACCEPTED[kind]
    array = {"numpy": values, "dask": da.from_array(values, chunks=2)}.get(wrap)
    if array is None:
        array = zarr_of(values)
    with dzb.batch_stream(array, 3) as stream:
        batches = list(stream)
    np.testing.assert_array_equal(np.concatenate(batches), values)


# --------------------------------------------------------------------------
# masked arrays: the mask would be dropped


MASKED = np.ma.masked_array(np.arange(8.0).reshape(4, 2), mask=[[0, 1], [0, 0], [1, 1], [0, 0]])


@pytest.mark.parametrize("name", ENTRY_POINTS)
@pytest.mark.parametrize("kind", ["numpy", "numpy without masked values", "dask"])
def test_masked_arrays_are_refused(name: str, kind: str) -> None:
    array: Any = {
        "numpy": MASKED,
        "numpy without masked values": np.ma.masked_array(np.ones((4, 2))),
        "dask": da.ma.masked_array(da.from_array(MASKED.data, chunks=2), mask=MASKED.mask),
    }[kind]
    with pytest.raises(dzb.ArgumentTypeError) as info:
        call(name, array)
    message = str(info.value)
    assert message.startswith(f"{role(name)} is a masked array")
    assert ".filled(" in message and "getmaskarray" in message


def test_the_suggested_replacements_stream() -> None:
    data, mask = MASKED.filled(-1.0), np.ma.getmaskarray(MASKED)
    with dzb.paired_batch_stream(data, mask, 4) as stream:
        ((x, m),) = list(stream)
    np.testing.assert_array_equal(x, [[0, -1], [2, 3], [-1, -1], [6, 7]])
    np.testing.assert_array_equal(m, MASKED.mask)


# --------------------------------------------------------------------------
# open_array: paths that cannot name an array


@pytest.fixture
def group(tmp_path: Any) -> zarr.Group:
    group = zarr.open_group(tmp_path / "data.zarr", mode="w")
    group.create_array("x", data=GOOD, chunks=(4, 2))
    group.create_group("sub").create_array("y", data=GOOD, chunks=(4, 2))
    return group


@pytest.mark.parametrize("bad", [123, b"x", ["x"], 1.5])
@pytest.mark.parametrize("source", ["group", "store path", "array"])
def test_path_that_is_not_a_string(group: zarr.Group, source: str, bad: Any) -> None:
    where = {"group": group, "store path": str(group.store.root), "array": group["x"]}[source]
    with pytest.raises(dzb.ArgumentTypeError, match="path must be a str") as info:
        dzb.open_array(where, bad)
    assert repr(bad) in str(info.value)


@pytest.mark.parametrize("bad", ["../x", "sub/../x", "..", "sub/..", "./x", "sub/./y", "/../x"])
@pytest.mark.parametrize("source", ["group", "subgroup", "store path"])
def test_path_that_goes_up_or_stays(group: zarr.Group, source: str, bad: str) -> None:
    where = {"group": group, "subgroup": group["sub"], "store path": str(group.store.root)}[source]
    with pytest.raises(dzb.ArgumentValueError, match="cannot go up") as info:
        dzb.open_array(where, bad)
    assert repr(bad) in str(info.value)


def test_good_paths_still_open(group: zarr.Group) -> None:
    for path in ("x", "/x", "sub/y", "/sub/y/"):
        np.testing.assert_array_equal(dzb.open_array(group, path).compute(), GOOD)
    np.testing.assert_array_equal(dzb.open_array(group["sub"], "y").compute(), GOOD)


# --------------------------------------------------------------------------
# open_array: .zip paths that are not zip files


def test_zip_path_that_is_not_a_zip_file(tmp_path: Any) -> None:
    where = tmp_path / "notes.zip"
    where.write_text("not a zip archive\n")
    with pytest.raises(dzb.ArgumentValueError, match="not a zip file") as info:
        dzb.open_array(where, "x")
    assert str(where) in str(info.value)
    with pytest.raises(dzb.ArgumentValueError, match="not a zip file"):
        dzb.open_array(str(where))


@pytest.mark.parametrize("damage", ["truncated", "central directory"])
def test_zip_path_that_is_a_broken_zip_file(tmp_path: Any, damage: str) -> None:
    whole = tmp_path / "whole.zip"
    store = zarr.storage.ZipStore(whole, mode="w")
    zarr.create_array(store, data=GOOD, chunks=(4, 2))
    store.close()
    content = bytearray(whole.read_bytes())
    if damage == "truncated":
        content = content[: len(content) // 2]
    else:  # zipfile.is_zipfile still says yes: zipfile.ZipFile raises BadZipFile
        entry = content.rfind(b"PK\x01\x02")
        content[entry : entry + 4] = b"XXXX"
    where = tmp_path / "broken.zip"
    where.write_bytes(bytes(content))
    with pytest.raises(dzb.ArgumentValueError, match="not a zip file") as info:
        dzb.open_array(where)
    assert repr(str(where)) in str(info.value)


def test_missing_zip_file_names_the_path(tmp_path: Any) -> None:
    where = tmp_path / "missing.zip"
    with pytest.raises(dzb.ArrayNotFoundError, match="no such file") as info:
        dzb.open_array(where, "x")
    assert repr(str(where)) in str(info.value)


def test_directory_store_named_like_a_zip_file(tmp_path: Any) -> None:
    where = tmp_path / "data.zip"
    zarr.create_array(zarr.storage.LocalStore(where), data=GOOD, chunks=(4, 2))
    np.testing.assert_array_equal(dzb.open_array(where).compute(), GOOD)


# --------------------------------------------------------------------------
# open_array: metadata documents that are not valid Zarr metadata

BROKEN_DOCUMENTS = {
    "not JSON": b"{not json",
    "not UTF-8": b"\xff\xfe\x00garbage",
    "a JSON list": b"[1, 2]",
    "no required fields": b'{"foo": 1}',
}


def array_key(zarr_format: int) -> str:
    return "zarr.json" if zarr_format == 3 else ".zarray"


def break_document(root: Any, key: str, broken: bytes | None) -> None:
    """Overwrite ``key`` under ``root``; ``None`` drops the shape field instead."""
    where = root / key
    if broken is None:
        document = json.loads(where.read_text())
        del document["shape"]
        broken = json.dumps(document).encode()
    where.write_bytes(broken)


DAMAGES = [*BROKEN_DOCUMENTS, "no shape"]


def damage(name: str) -> bytes | None:
    return BROKEN_DOCUMENTS.get(name)


def check_invalid_metadata(info: pytest.ExceptionInfo[Any], where: Any, key: str) -> None:
    error = info.value
    assert isinstance(error, dzb.InvalidMetadataError)
    assert isinstance(error, dzb.DaskZarrBatchesError) and isinstance(error, ValueError)
    assert not isinstance(error, dzb.ArrayNotFoundError)
    message = str(error)
    assert message.startswith("invalid metadata")
    assert "no Zarr array" not in message and "no array" not in message
    assert str(where) in message and repr(key) in message


@pytest.mark.parametrize("zarr_format", [2, 3])
@pytest.mark.parametrize("name", DAMAGES)
def test_invalid_metadata_of_an_array_store(tmp_path: Any, zarr_format: int, name: str) -> None:
    root = tmp_path / "data.zarr"
    zarr.create_array(root, data=GOOD, chunks=(4, 2), zarr_format=zarr_format)
    break_document(root, array_key(zarr_format), damage(name))
    with pytest.raises(dzb.InvalidMetadataError) as info:
        dzb.open_array(root)
    check_invalid_metadata(info, root, array_key(zarr_format))


def broken_group(tmp_path: Any, zarr_format: int, name: str) -> Any:
    """A group with arrays 'x' (broken), 'y' and 'sub/z' (broken) and 'sub/w'."""
    root = tmp_path / "data.zarr"
    group = zarr.open_group(root, mode="w", zarr_format=zarr_format)
    for path in ("x", "y", "sub/z", "sub/w"):
        group.create_array(path, data=GOOD, chunks=(4, 2))
    for path in ("x", "sub/z"):
        break_document(root / path, array_key(zarr_format), damage(name))
    return root


@pytest.mark.parametrize("zarr_format", [2, 3])
@pytest.mark.parametrize("name", DAMAGES)
@pytest.mark.parametrize("opened", [False, True])
def test_invalid_metadata_of_a_group_member(
    tmp_path: Any, zarr_format: int, name: str, opened: bool
) -> None:
    root = broken_group(tmp_path, zarr_format, name)
    source: Any = zarr.open_group(root, mode="r") if opened else root
    key = array_key(zarr_format)
    for path in ("x", "sub/z", "/sub/z/"):
        with pytest.raises(dzb.InvalidMetadataError) as info:
            dzb.open_array(source, path)
        check_invalid_metadata(info, root, f"{path.strip('/')}/{key}")
    # the sound members still open: nothing else of the group is parsed
    for path in ("y", "sub/w"):
        np.testing.assert_array_equal(dzb.open_array(source, path).compute(), GOOD)
    subgroup = zarr.open_group(root / "sub", mode="r") if opened else root / "sub"
    with pytest.raises(dzb.InvalidMetadataError) as info:
        dzb.open_array(subgroup, "z")
    check_invalid_metadata(info, root, f"z/{key}")


@pytest.mark.parametrize("zarr_format", [2, 3])
@pytest.mark.parametrize("name", ["not JSON", "no required fields"])
def test_listing_a_group_with_an_invalid_member(tmp_path: Any, zarr_format: int, name: str) -> None:
    root = broken_group(tmp_path, zarr_format, name)
    key = array_key(zarr_format)
    for path in (None, "missing"):
        with pytest.raises(dzb.ArrayNotFoundError) as info:
            dzb.open_array(root, path)
        message = str(info.value)
        assert "'y'" in message and "'sub/w'" in message
        assert f"invalid metadata at 'x/{key}'" in message
        assert f"invalid metadata at 'sub/z/{key}'" in message


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_invalid_metadata_of_the_root_group(tmp_path: Any, zarr_format: int) -> None:
    root = tmp_path / "data.zarr"
    group = zarr.open_group(root, mode="w", zarr_format=zarr_format)
    group.create_array("x", data=GOOD, chunks=(4, 2))
    key = "zarr.json" if zarr_format == 3 else ".zgroup"
    break_document(root, key, b"{not json")
    with pytest.raises(dzb.InvalidMetadataError) as info:
        dzb.open_array(root, "x")
    check_invalid_metadata(info, root, key)


# --------------------------------------------------------------------------
# Writes: every argument of map_to_zarr, write_shuffled and shuffle_order checked (issue 26)


@pytest.mark.parametrize(
    ("rows", "seed", "error", "match"),
    [
        (-1, 0, dzb.ArgumentValueError, "rows must be >= 0, got -1"),
        (2.5, 0, dzb.ArgumentTypeError, "rows must be a non-negative integer, got 2.5"),
        (True, 0, dzb.ArgumentTypeError, "rows must be a non-negative integer, got True"),
        (4, -1, dzb.ArgumentValueError, "seed must be >= 0, got -1"),
        (4, float("nan"), dzb.ArgumentTypeError, "seed must be a non-negative integer, got nan"),
        (4, 1.0, dzb.ArgumentTypeError, "seed must be a non-negative integer, got 1.0"),
    ],
)
def test_shuffle_order_refuses_what_is_no_count_or_seed(
    rows: Any, seed: Any, error: type, match: str
) -> None:
    with pytest.raises(error, match=match):
        dzb.shuffle_order(rows, seed)


@pytest.mark.parametrize(
    ("seed", "error"), [(-1, dzb.ArgumentValueError), (float("nan"), dzb.ArgumentTypeError)]
)
def test_write_shuffled_refuses_a_bad_seed_before_writing(
    tmp_path: Any, seed: Any, error: type
) -> None:
    out = tmp_path / "out.zarr"
    with pytest.raises(error, match=f"seed must be .*got {seed!r}"):
        dzb.write_shuffled(GOOD, str(out), seed=seed)
    assert not out.exists()


def write(out: Any, **kwargs: Any) -> Any:
    return dzb.map_to_zarr(lambda rows: rows + 1, GOOD, out, **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"chunks": 2, "shards": 3}, dzb.ArgumentValueError, r"shards=3 \(\(3, 2\)\) is not a"),
        ({"chunks": (2, 2), "shards": (4, 1)}, dzb.ArgumentValueError, "along axis 1"),
        ({"dtype": "bogus"}, dzb.ArgumentTypeError, "dtype='bogus' is not a numpy dtype"),
        ({"dtype": object}, dzb.ArgumentTypeError, "dtype=<class 'object'>"),
        ({"sample_shape": (-2,)}, dzb.ArgumentValueError, r"sample_shape=\(-2,\) has a negative"),
        ({"sample_shape": 3}, dzb.ArgumentTypeError, "sample_shape must be a tuple of ints"),
        ({"sample_shape": (2.0,)}, dzb.ArgumentTypeError, "sample_shape must be a tuple of ints"),
    ],
)
def test_map_to_zarr_refuses_a_bad_output_layout(
    tmp_path: Any, kwargs: dict[str, Any], error: type, match: str
) -> None:
    out = tmp_path / "out.zarr"
    with pytest.raises(error, match=match):
        write(str(out), **kwargs)
    assert not out.exists()


def test_write_shuffled_refuses_shards_of_partial_chunks(tmp_path: Any) -> None:
    with pytest.raises(dzb.ArgumentValueError, match="shards=3 is not a multiple of the 2 rows"):
        dzb.write_shuffled(GOOD, str(tmp_path / "out.zarr"), chunks=2, shards=3)


def test_map_to_zarr_names_func_failing_or_returning_objects(tmp_path: Any) -> None:
    with pytest.raises(dzb.WindowError, match="func raised ZeroDivisionError") as info:
        dzb.map_to_zarr(lambda rows: 1 / 0, GOOD, str(tmp_path / "a.zarr"))
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    assert "dtype= and sample_shape=" in str(info.value)
    objects = lambda rows: np.array([object()] * len(rows))  # noqa: E731
    with pytest.raises(dzb.ArgumentTypeError, match=r"func's result .* has dtype object"):
        dzb.map_to_zarr(objects, GOOD, str(tmp_path / "b.zarr"))
    assert not (tmp_path / "a.zarr").exists() and not (tmp_path / "b.zarr").exists()


def test_map_to_zarr_and_write_shuffled_refuse_an_out_they_cannot_write(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    a_file = tmp_path / "notes.txt"
    a_file.write_text("not a directory\n")
    cases: list[tuple[Any, type, str]] = [
        ("", dzb.ArgumentValueError, "out='' is an empty path"),
        ("file://", dzb.ArgumentValueError, "out='file://' is an empty path"),
        (7, dzb.ArgumentTypeError, "out must be a path, URL or Zarr store.*int 7"),
        (str(a_file), dzb.ArgumentValueError, "is an existing file, not a directory"),
        (a_file, dzb.ArgumentValueError, "is an existing file, not a directory"),
        ("nosuchscheme://bucket/x.zarr", dzb.ArgumentValueError, "nosuchscheme://bucket"),
        ("s3://", dzb.ArgumentValueError, "names no bucket"),
    ]
    for out, error, match in cases:
        with pytest.raises(error, match=match):
            write(out)
        with pytest.raises(error, match=match):
            dzb.write_shuffled(GOOD, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]  # nothing written


@pytest.mark.parametrize("url", ["s3://", "gs://", "s3:///"])
def test_open_array_of_a_url_without_a_bucket(url: str) -> None:
    with pytest.raises(dzb.ArgumentValueError, match=f"{url!r} names no bucket"):
        dzb.open_array(url)
