"""No write job onto its own input: ``map_to_zarr`` / ``write_shuffled`` refuse an ``out``
that is an input array, holds one or lies inside one, however either is spelled, before
anything is created or deleted (``overwrite=True`` would wipe the input before reading it).

Real stores: local directories (relative, absolute, trailing slash, ``file://``, symlinks,
a ``LocalStore``), in-memory stores, fsspec's memory file system, a zip store; S3 through
obstore and fsspec is in ``tests/integration/test_s3.py``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dask.array as da
import numpy as np
import pytest
import zarr
import zarr.storage

import daskzarr_batches as dzb
from daskzarr_batches.tools.cli import main

DATA = np.arange(40, dtype="f4").reshape(20, 2) + 1


def _write(store: Any, name: str | None = None) -> zarr.Array:
    array = zarr.create_array(store, name=name, shape=DATA.shape, chunks=(5, 2), dtype="f4",
                              overwrite=True)  # fmt: skip
    array[:] = DATA
    return array


JOBS: dict[str, Callable[..., Any]] = {
    "map_to_zarr": lambda data, out: dzb.map_to_zarr(np.negative, data, out, overwrite=True),
    "write_shuffled": lambda data, out: dzb.write_shuffled(data, out, overwrite=True),
}


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory with ``x.zarr``, a symlink ``link.zarr`` to it and a group ``g.zarr``."""
    monkeypatch.chdir(tmp_path)
    _write("x.zarr")
    os.symlink("x.zarr", "link.zarr")
    zarr.open_group("g.zarr", mode="w")
    _write("g.zarr", "a")
    _write("g.zarr", "b")
    return tmp_path


def _local_cases(root: Path) -> dict[str, tuple[Any, Any]]:
    """(data, out) pairs whose output is, holds or lies inside an input."""
    x, group = str(root / "x.zarr"), str(root / "g.zarr")
    members = [zarr.open_array("g.zarr/a"), zarr.open_array("x.zarr")]
    return {
        "same relative path": ("x.zarr", "x.zarr"),
        "absolute vs relative, trailing slash": (x, "./x.zarr/"),
        "dot-dot": ("x.zarr", f"{root}/g.zarr/../x.zarr"),
        "symlink": ("link.zarr", "x.zarr"),
        "file URL": ("x.zarr", f"file://{x}"),
        "Path objects": (root / "x.zarr", Path("x.zarr")),
        "a zarr.Array": (zarr.open_array("x.zarr"), "x.zarr"),
        "a LocalStore out": ("x.zarr", zarr.storage.LocalStore(x)),
        "a StorePath out": (
            "g.zarr/a",
            zarr.storage.StorePath(zarr.storage.LocalStore(group), "a"),
        ),
        "dask from_zarr": (da.from_zarr("x.zarr"), "x.zarr"),
        "a dask array computed from it": (da.from_zarr("x.zarr") * 2 + 1, "x.zarr"),
        "out holds the input (its group)": ("g.zarr/a", "g.zarr"),
        "out inside the input": ("x.zarr", "x.zarr/sub"),
        "a collection member": (dzb.concat([zarr.open_array("g.zarr/b"), "x.zarr"]), "x.zarr"),
        "a chunk subset": (dzb.chunk_split("x.zarr", [0.5, 0.5])[1], "x.zarr"),
        "a mixture member": (dzb.mix(members, [1.0, 1.0]), "g.zarr"),
        "a dict member": ({"f": "g.zarr/b", "y": "x.zarr"}, "x.zarr"),
        "a tuple member": (("g.zarr/a", "x.zarr"), "x.zarr/0"),
    }


def _intact(root: Path) -> None:
    for path in ("x.zarr", "g.zarr/a", "g.zarr/b"):
        np.testing.assert_array_equal(zarr.open_array(str(root / path), mode="r")[:], DATA)


@pytest.mark.parametrize("job", sorted(JOBS))
def test_every_spelling_of_the_input_is_refused_before_anything_is_deleted(
    here: Path, job: str
) -> None:
    for case, (data, out) in _local_cases(here).items():
        with pytest.raises(dzb.ArgumentValueError, match="never writes onto its own input") as e:
            JOBS[job](data, out)
        assert "stored at" in str(e.value) and str(here.resolve()) in str(e.value), case
        _intact(here)


def test_write_shuffled_of_a_dict_into_the_group_it_reads(here: Path) -> None:
    """The arrays of a dict are written under their names: the group itself is refused."""
    with pytest.raises(dzb.ArgumentValueError, match=r"array 'a'.*data\['a'\] is stored at"):
        dzb.write_shuffled({"a": "g.zarr/a", "b": "g.zarr/b"}, "g.zarr", overwrite=True)
    _intact(here)


def test_writing_beside_the_input_is_allowed(here: Path) -> None:
    """A sibling, a sibling in the input's group, a name sharing a prefix: not the input."""
    dzb.write_shuffled("g.zarr/a", "g.zarr/c", overwrite=True)
    dzb.map_to_zarr(np.negative, "x.zarr", "x.zarr2")
    dzb.write_shuffled({"a": "g.zarr/a"}, "g2.zarr")
    np.testing.assert_array_equal(zarr.open_array("x.zarr2")[:], -DATA)
    _intact(here)


@pytest.mark.parametrize("job", sorted(JOBS))
def test_in_memory_and_zip_stores(job: str, tmp_path: Path) -> None:
    memory = zarr.storage.MemoryStore()
    array = _write(memory)
    with pytest.raises(dzb.ArgumentValueError, match="MemoryStore"):
        JOBS[job](array, memory)
    held: dict[str, Any] = {}
    with pytest.raises(dzb.ArgumentValueError, match="own input"):
        JOBS[job](_write(zarr.storage.MemoryStore(held)), held)  # the dict it keeps
    JOBS[job](array, zarr.storage.MemoryStore())  # another store: written
    np.testing.assert_array_equal(array[:], DATA)
    url = f"memory://{tmp_path.name}/x.zarr"  # fsspec's memory file system, by URL
    _write(zarr.storage.FsspecStore.from_url(url))
    with pytest.raises(dzb.ArgumentValueError, match="memory://"):
        JOBS[job](dzb.open_array(url, backend="fsspec"), url + "/")
    np.testing.assert_array_equal(dzb.open_array(url, backend="fsspec").compute(), DATA)
    path = tmp_path / "x.zip"
    with zarr.storage.ZipStore(path, mode="w") as zipped:
        _write(zipped, "x")
    reading = zarr.storage.ZipStore(path, mode="a")
    with pytest.raises(dzb.ArgumentValueError, match=r"x\.zip"):
        JOBS[job](zarr.open_array(reading, path="x"), zarr.storage.StorePath(reading, "x"))


def test_xarray_opened_from_zarr(here: Path) -> None:
    xr = pytest.importorskip("xarray")
    xr.DataArray(DATA, dims=("n", "f"), name="v").to_dataset().to_zarr(
        "ds.zarr", mode="w", consolidated=False
    )
    variable = xr.open_zarr("ds.zarr", consolidated=False)["v"]
    with pytest.raises(dzb.ArgumentValueError, match="own input"):
        dzb.write_shuffled(variable, "ds.zarr/v", overwrite=True)
    with pytest.raises(dzb.ArgumentValueError, match="own input"):
        dzb.map_to_zarr(np.negative, variable, "ds.zarr", overwrite=True)
    np.testing.assert_array_equal(xr.open_zarr("ds.zarr", consolidated=False)["v"].values, DATA)


def test_the_cli_shuffle_onto_its_store_is_refused(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for out in ("g.zarr", "./g.zarr/", str(here / "g.zarr")):
        assert main(["shuffle", "g.zarr", out, "--array", "a", "--labels", "b", "--overwrite",
                     "-q"]) == 2  # fmt: skip
        error = capsys.readouterr().err
        assert "never writes onto its own input" in error and "g.zarr/a" in error, error
    _intact(here)


@pytest.mark.parametrize("job", sorted(JOBS))
def test_the_directory_of_an_input_zip_is_refused(job: str, tmp_path: Path) -> None:
    """``out`` the directory holding an input's zip file: overwriting it deletes the zip."""
    (tmp_path / "z").mkdir()
    path = tmp_path / "z" / "in.zip"
    with zarr.storage.ZipStore(path, mode="w") as zipped:
        _write(zipped)
    array = zarr.open_array(zarr.storage.ZipStore(path, mode="r"))
    for out in (tmp_path / "z", tmp_path):
        with pytest.raises(dzb.ArgumentValueError, match=r"in\.zip"):
            JOBS[job](array, str(out))
    assert path.is_file()
    JOBS[job](array, str(tmp_path / "z2"))  # beside the zip's directory: written


@pytest.mark.parametrize("job", sorted(JOBS))
def test_xarray_opened_without_dask(job: str, here: Path) -> None:
    """``xr.open_zarr(..., chunks=None)``: lazily indexed, no dask graph to find the array in."""
    xr = pytest.importorskip("xarray")
    xr.DataArray(DATA, dims=("n", "f"), name="v").to_dataset().to_zarr(
        "ds.zarr", mode="w", consolidated=False
    )
    for wrap, out in ((lambda v: v, "ds.zarr"), (lambda v: {"v": v}, "ds.zarr/v")):
        variable = xr.open_zarr("ds.zarr", consolidated=False, chunks=None)["v"]  # not loaded
        with pytest.raises(dzb.ArgumentValueError, match="own input"):
            JOBS[job](wrap(variable), out)
    assert sorted(xr.open_zarr("ds.zarr", consolidated=False).variables) == ["v"]
