"""zarr-python's internals are reached from one module, and a failure of the program is
never taken for bad data.

``daskzarr_batches/store/zarr_adapter.py`` is the only module that may import
``zarr.core`` or a private zarr module, or touch a private attribute zarr defines;
the version differences between zarr releases live there.  A failure of the
package's own code or of an incompatible dependency (ImportError, AttributeError,
a TypeError no codec raised) surfaces as what it is, naming the chunk, and is never
a ``CorruptChunkError`` or skipped by ``on_error="skip"``.
"""

from __future__ import annotations

import ast
import pathlib
from typing import Any

import numpy as np
import pytest
import zarr
import zarr.storage

import daskzarr_batches as dzb
from daskzarr_batches.store import zarr_adapter
from daskzarr_batches.store.policy import is_program_error

PACKAGE = pathlib.Path(dzb.__file__).parent
ADAPTER = PACKAGE / "store" / "zarr_adapter.py"


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _defined_names(files: list[pathlib.Path]) -> set[str]:
    """Private names a set of sources defines: functions, attributes set, class fields."""
    names: set[str] = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "__setattr__":
                for arg in node.args[1:2]:
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                        names.add(arg.value)
    return {name for name in names if _private(name)}


@pytest.fixture(scope="module")
def zarr_private_names() -> set[str]:
    zarr_root = pathlib.Path(zarr.__file__).parent
    ours = _defined_names(sorted(PACKAGE.rglob("*.py")))
    return _defined_names(sorted(zarr_root.rglob("*.py"))) - ours


def _violations(path: pathlib.Path, private: set[str]) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        line = getattr(node, "lineno", 0)
        modules: list[str] = []
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        for module in modules:
            parts = module.split(".")
            if parts[0] == "zarr" and (
                (len(parts) > 1 and parts[1] == "core") or any(_private(p) for p in parts)
            ):
                found.append(f"{path.name}:{line}: imports {module}")
                break
        if isinstance(node, ast.Attribute):
            if node.attr in private:
                found.append(f"{path.name}:{line}: reaches for zarr's private .{node.attr}")
            if node.attr == "core" and isinstance(node.value, ast.Name) and node.value.id == "zarr":
                found.append(f"{path.name}:{line}: reaches into zarr.core")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr", "setattr")
        ):
            for arg in node.args[1:2]:
                if isinstance(arg, ast.Constant) and arg.value in private:
                    found.append(f"{path.name}:{line}: {node.func.id}(..., {arg.value!r})")
    return found


def test_only_the_adapter_touches_zarr_internals(zarr_private_names: set[str]) -> None:
    assert "_async_array" in zarr_private_names  # the scan sees zarr's own private names
    modules = [p for p in sorted(PACKAGE.rglob("*.py")) if p != ADAPTER]
    found = [v for path in modules for v in _violations(path, zarr_private_names)]
    assert found == []


def test_the_scan_finds_what_it_forbids(
    tmp_path: pathlib.Path, zarr_private_names: set[str]
) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import zarr.core.sync\n"
        "from zarr.core.buffer import default_buffer_prototype\n"
        "from zarr.storage._common import make_store_path\n"
        "def f(a):\n"
        "    zarr.core.sync.sync(a)\n"
        "    return a._async_array, getattr(a, '_decode_shard_index')\n"
    )
    assert len(_violations(bad, zarr_private_names)) == 6
    assert _violations(ADAPTER, zarr_private_names)  # the adapter itself does, by design


def test_version_gates_match_the_installed_zarr() -> None:
    from packaging.version import Version

    results = zarr_adapter.read_results([True, False])
    if Version("3.2.0.dev0") <= zarr_adapter.ZARR_VERSION:
        assert [r["status"] for r in results] == ["present", "missing"]
    else:
        assert results is None
    array = zarr.create_array(zarr.storage.MemoryStore(), shape=(10, 3), chunks=(4, 3), dtype="<i2")
    spec = zarr_adapter.chunk_spec(array)
    assert tuple(spec.shape) == (4, 3)
    assert zarr_adapter.is_regular_grid(array)
    assert zarr_adapter.bytes_endian(array.serializer) == "little"
    assert zarr_adapter.encode_chunk_key(array)((1, 0)) == "c/1/0"


class _FailingStore(zarr.storage.WrapperStore[Any]):
    """A store whose chunk reads raise ``error`` (metadata reads pass)."""

    def __init__(self, store: Any, error: BaseException) -> None:
        super().__init__(store)
        self.error = error

    def _with_store(self, store: Any) -> _FailingStore:
        return type(self)(store, self.error)

    async def get(self, key: str, prototype: Any, byte_range: Any = None) -> Any:
        if key.split("/")[-1] not in ("zarr.json", ".zarray", ".zattrs", ".zgroup"):
            raise self.error
        return await self._store.get(key, prototype, byte_range)


def _array_on(store: Any) -> zarr.Array:
    array = zarr.create_array(store, shape=(12, 2), chunks=(4, 2), dtype="f4")
    array[:] = np.arange(24, dtype="f4").reshape(12, 2)
    return array


@pytest.mark.parametrize(
    "error",
    [
        ImportError("cannot import name 'X' from 'zarr.core.y'"),
        AttributeError("'Foo' object has no attribute 'bar'"),
        TypeError("'NoneType' object is not iterable"),
    ],
    ids=["ImportError", "AttributeError", "TypeError"],
)
@pytest.mark.parametrize("mode", ["sequential", "buffered", "chunks"])
def test_a_program_failure_is_never_a_corrupt_chunk(
    tmp_path: pathlib.Path, error: BaseException, mode: str
) -> None:
    base = zarr.storage.LocalStore(tmp_path / "x.zarr")
    _array_on(base)
    array = zarr.open_array(_FailingStore(base, error), mode="r")
    if mode == "chunks":
        stream: Any = dzb.chunk_stream(array)
    elif mode == "buffered":
        stream = dzb.shuffled_batch_stream(array, 4, seed=0, shuffle_buffer_size=8, on_error="skip")
    else:
        stream = dzb.batch_stream(array, 4, on_error="skip")
    with pytest.raises(type(error)) as raised, stream:
        list(stream)
    assert not isinstance(raised.value, dzb.DaskZarrBatchesError)
    notes = " ".join(getattr(raised.value, "__notes__", []))
    assert "not damaged data" in notes and "of array" in notes


def test_bad_bytes_are_still_a_corrupt_chunk(tmp_path: pathlib.Path) -> None:
    array = _array_on(zarr.storage.LocalStore(tmp_path / "x.zarr"))
    (tmp_path / "x.zarr" / "c" / "1" / "0").write_bytes(b"\x28\xb5\x2f\xfd not zstd at all")
    with pytest.raises(dzb.CorruptChunkError, match="chunk 1"):
        list(dzb.batch_stream(array, 4))
    with pytest.warns(dzb.SkippedChunksWarning), dzb.batch_stream(array, 4, on_error="skip") as s:
        rows = np.concatenate(list(s))
    assert rows[:, 0].tolist() == [0, 2, 4, 6, 16, 18, 20, 22]


def test_what_counts_as_a_program_error() -> None:
    def raised(error: BaseException) -> BaseException:
        try:
            raise error
        except BaseException as exc:
            return exc

    assert is_program_error(raised(ImportError("x")))
    assert is_program_error(raised(TypeError("x")))
    assert not is_program_error(raised(ValueError("x")))
    assert not is_program_error(raised(RuntimeError("zstd decompression failed")))
    assert not is_program_error(raised(dzb.CorruptChunkError("x")))
    # a TypeError a codec raised on its bytes is the data's
    import numcodecs

    try:
        numcodecs.Zstd().decode(object())  # type: ignore[arg-type]
    except TypeError as exc:
        assert not is_program_error(exc)
