"""Resume of a write job: what of an output is already written, and whether it may be resumed.

The fingerprint in the output's attributes (:data:`FINGERPRINT_KEY`: the job,
``func`` and the inputs' contents from ``fingerprints``) checked against the
job's (``ResumeMismatchError`` across a mismatch), the write units whose
stored objects all exist and decode (``_complete_units``), the manifest of the
sizes of the objects of every unit a task reported written (``_Manifest``,
kept by the caller beside the output, so a resume does not decode what is
known good), and the deletion of the objects of a unit about to be written
again (a torn shard would fail Zarr's read-modify-write).
"""

from __future__ import annotations

import concurrent.futures
import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import zarr

from ..errors import ResumeMismatchError, warn_caller
from ..fingerprints import Unfingerprintable, func_fingerprint
from ..store.layout import storage_keys
from ..store.zarr_adapter import buffer_prototype, sync

__all__ = ["FINGERPRINT_KEY", "MANIFEST_NAME", "MANIFEST_SECONDS"]


#: the attribute of the output that holds the fingerprint
FINGERPRINT_KEY = "daskzarr_batches"


#: the manifest of object sizes beside the output (see :class:`_Manifest`)
MANIFEST_NAME = "daskzarr_batches_manifest.json"


#: the caller rewrites the manifest at most this often (and at the end)
MANIFEST_SECONDS = 1.0


def _existing(out: Any, name: str | None) -> zarr.Array | None:
    """The array at ``out`` (under ``name``), or ``None`` if there is none."""
    try:
        return zarr.open_array(store=out, path=name or "", mode="r+")
    except (FileNotFoundError, KeyError, zarr.errors.NodeTypeValidationError):
        return None


def _check_fingerprint(
    array: zarr.Array,
    where: Any,
    shape: tuple[int, ...],
    dtype: np.dtype[Any],
    chunks: tuple[int, ...],
    shards: tuple[int, ...] | None,
    fingerprint: dict[str, Any],
) -> None:
    stored: Any = array.attrs.asdict().get(FINGERPRINT_KEY)
    if stored is None:
        raise ResumeMismatchError(
            f"output {where} exists but was not written by this library (no {FINGERPRINT_KEY!r} "
            "fingerprint in its attributes): pass overwrite=True to replace it"
        )
    first = ["job", "kind", "seed", "inputs", "contents", "func"]
    for key in first + sorted((set(stored) | set(fingerprint)) - set(first)):
        if key == "func" and isinstance(fingerprint.get(key), dict):
            raise ResumeMismatchError(
                f"cannot resume output {where}: {fingerprint[key]['unfingerprintable']}, so a "
                "change to func would go unseen and stale output be reused; pass overwrite=True "
                "to recompute it (with job_id=, a name you change whenever func changes, a "
                "later run can resume)"
            )
        if stored.get(key) == fingerprint.get(key):
            continue
        if key == "contents" and isinstance(stored.get(key), list):
            changed = [name for name, old, new in zip(fingerprint["inputs"], stored[key],
                       fingerprint[key], strict=False) if old != new]  # fmt: skip
            names = ", ".join(f"{i['name']!r} ({i['array']})" for i in changed) or "an input"
            raise ResumeMismatchError(
                f"cannot resume output {where}: input {names} changed since the output was "
                "written (another content hash of an in-memory array; for a Zarr array another "
                "listing of its stored objects: keys, sizes, modification times or ETags), so "
                "its written part is stale; pass overwrite=True to recompute it, or write to "
                "a new output"
            )
        if key == "func":
            raise ResumeMismatchError(
                f"cannot resume output {where}: func changed since the output was written (its "
                "code, constants, defaults, closure or the globals it uses, or the Python "
                "version), so its written part is stale; pass overwrite=True to recompute it "
                "with this func, or write to a new output"
            )
        if key == "contents":
            raise ResumeMismatchError(
                f"cannot resume output {where}: it was written without a fingerprint of its "
                "inputs' contents (by an earlier version); pass overwrite=True to recompute it"
            )
        raise ResumeMismatchError(
            f"cannot resume output {where}: its {key} was {stored.get(key)!r}, this job's is "
            f"{fingerprint.get(key)!r}; pass overwrite=True to start over (or the same "
            "job_id / input to resume)"
        )
    found = {
        "shape": tuple(array.shape),
        "dtype": np.dtype(array.dtype),
        "chunks": tuple(array.chunks),
        "shards": None if array.shards is None else tuple(array.shards),
    }
    wanted = {"shape": shape, "dtype": dtype, "chunks": chunks, "shards": shards}
    for key, value in wanted.items():
        if found[key] != value:
            raise ResumeMismatchError(
                f"cannot resume output {where}: its {key} is {found[key]}, this job writes "
                f"{value}; pass overwrite=True to start over"
            )


def _existing_keys(array: zarr.Array) -> set[str]:
    prefix = f"{array.path}/" if array.path else ""

    async def listed() -> set[str]:
        return {key async for key in array.store.list_prefix(prefix)}

    return sync(listed())


def _complete_units(
    outs: Sequence[zarr.Array], units: Sequence[tuple[int, int]], threads: int
) -> set[int]:
    """The units every stored object of which exists and decodes to the right shape.

    The stored objects of every other unit are deleted: a torn shard (or chunk) left by
    a killed writer would otherwise be read back by Zarr's read-modify-write of the shard
    and fail the unit's write (a checksum error) on every later resume.
    """
    present = [_existing_keys(out) for out in outs]
    manifest = _Manifest(outs[0]) if outs else None
    recorded = manifest.read() if manifest is not None else {}
    candidates = [
        number
        for number, (start, stop) in enumerate(units)
        if all(
            set(storage_keys(out, start, stop)) <= keys
            for out, keys in zip(outs, present, strict=True)
        )
    ]

    sizes = _sizes_of(outs[0], [k for n in candidates for k in _keys_of(outs, units[n])
                                if k in recorded]) if candidates and recorded else {}  # fmt: skip

    def decodes(number: int) -> bool:
        start, stop = units[number]
        keys = _keys_of(outs, (start, stop))
        if all(k in recorded and sizes.get(k) == recorded[k] for k in keys):
            return True  # written whole by a task that reported it: no decode
        try:
            return all(np.shape(out[start:stop])[0] == stop - start for out in outs)
        except Exception:  # a truncated or damaged object: written again
            return False

    with concurrent.futures.ThreadPoolExecutor(max(1, threads)) as pool:
        done = {n for n, ok in zip(candidates, pool.map(decodes, candidates), strict=True) if ok}
    for out, keys in zip(outs, present, strict=True):
        stale = [key for n, unit in enumerate(units) if n not in done
                 for key in storage_keys(out, *unit) if key in keys]  # fmt: skip
        if stale:
            _delete(out.store, stale)
    return done


def _keys_of(outs: Sequence[zarr.Array], unit: tuple[int, int]) -> list[str]:
    return [key for out in outs for key in storage_keys(out, *unit)]


def _sizes_of(array: zarr.Array, keys: Sequence[str]) -> dict[str, int]:
    async def sized() -> list[int]:
        import asyncio

        return await asyncio.gather(*(array.store.getsize(key) for key in keys))

    return dict(zip(keys, (int(n) for n in sync(sized())), strict=True))


class _Manifest:
    """The sizes of the objects of the units the tasks reported written, kept by the caller.

    One small JSON object beside the output's first array (``MANIFEST_NAME``
    under its path), rewritten by the caller only (never by a worker) at most
    every ``MANIFEST_SECONDS`` and at the end.  A resume takes a unit whose
    objects have the recorded sizes as complete without decoding it; any
    other unit whose objects exist is decoded.  A manifest that does not
    parse (a kill while it was written) is ignored: every unit is decoded.
    """

    def __init__(self, array: zarr.Array) -> None:
        self.array = array
        self.key = (f"{array.path}/" if array.path else "") + MANIFEST_NAME
        self.sizes: dict[str, int] = {}
        self.saved = time.monotonic()

    def read(self) -> dict[str, int]:
        try:
            found = sync(self.array.store.get(self.key, prototype=buffer_prototype()))
            if found is None:
                return {}
            value = json.loads(found.to_bytes())
            return {str(k): int(v) for k, v in value["sizes"].items()}
        except Exception:  # absent, truncated, not ours: decode every unit
            return {}

    def add(self, sizes: Mapping[str, int], force: bool = False) -> None:
        self.sizes.update(sizes)
        if force or time.monotonic() - self.saved >= MANIFEST_SECONDS:
            self.write()

    def delete(self) -> None:
        _delete(self.array.store, [self.key])

    def write(self) -> None:
        data = json.dumps({"sizes": self.sizes}).encode()
        sync(self.array.store.set(self.key, buffer_prototype().buffer.from_bytes(data)))
        self.saved = time.monotonic()


def _func_fingerprint(func: Any, fresh: bool) -> Any:
    """``func``'s fingerprint, or ``{"unfingerprintable": why}`` (warned of on a fresh output)."""
    try:
        return func_fingerprint(func)
    except Unfingerprintable as error:
        why = f"func cannot be fingerprinted ({error})"
        if fresh:
            warn_caller(UserWarning(
                f"{why}: an interrupted run of this job cannot be resumed unless job_id= names "
                "func's version (change it whenever func changes)"
            ))  # fmt: skip
        return {"unfingerprintable": why}


def _listed(array: zarr.Array, sized: bool) -> list[tuple[str, int]]:
    """``(key, size)`` of the stored objects of ``array`` (size 0 unless ``sized``)."""
    keys = sorted(_existing_keys(array))
    return list(_sizes_of(array, keys).items()) if sized else [(key, 0) for key in keys]


def _delete(store: Any, keys: Sequence[str]) -> None:
    """Delete ``keys`` from ``store`` (an absent key is no error)."""

    async def deleted() -> None:
        import asyncio

        await asyncio.gather(*(store.delete(key) for key in keys))

    sync(deleted())


def _qualname(func: Any) -> str:
    module = getattr(func, "__module__", None) or ""
    name = getattr(func, "__qualname__", None) or type(func).__qualname__
    return f"{module}.{name}" if module else name
