"""Fingerprints of a write job's function and inputs, so a resume never reuses stale output.

:func:`func_fingerprint` hashes what a function computes with: its bytecode
(``__code__.co_code``), its constants (nested code objects recursively), the
names it uses, its defaults and keyword defaults, the contents of its closure
cells and the values of the module globals it names (functions recursively,
modules and classes by name, other values by ``dask.base.tokenize``);
``functools.partial`` (its function, arguments and keywords), bound methods (the
function and its object), callable objects (the class's ``__call__`` and the
object) and builtins or numpy ufuncs (by qualified name) are handled.  A value
that has no deterministic token (a lock, an open file) makes the function
*unfingerprintable*: :class:`Unfingerprintable` names it.  The bytecode differs
between Python versions, so a resume under another Python refuses too.

:func:`input_fingerprint` identifies an input's contents: a numpy array by a
hash of its buffer (``dask.base.tokenize``, about 0.5 GB/s), a dask array by its
name (a token of its graph), a Zarr array by a listing of its stored objects
(:func:`stored_fingerprint`: keys with their sizes and, on a local directory,
their modification times ``st_mtime_ns``; on an object store the ETag or
last-modified time the listing gives; on fsspec their sizes; in memory a hash of
the decoded data; on a wrapper store the keys only).
"""

from __future__ import annotations

import dis
import functools
import hashlib
import json
import types
from collections.abc import Callable, Iterator
from typing import Any

import dask
import dask.array as da
import numpy as np
import zarr
import zarr.storage
from dask.base import tokenize

from .store.versions import object_versions

__all__ = ["Unfingerprintable", "func_fingerprint", "input_fingerprint", "stored_fingerprint"]


class Unfingerprintable(Exception):
    """A function holds a value with no deterministic token; the message names it."""


def func_fingerprint(func: Any) -> str:
    """A hex digest of what ``func`` computes with (raises :class:`Unfingerprintable`)."""
    described = _callable(func, "func", set())
    return hashlib.blake2b(repr(described).encode(), digest_size=16).hexdigest()


def _callable(obj: Any, where: str, seen: set[int]) -> Any:
    if id(obj) in seen:  # a recursive function, or two names for one
        return ("seen", _name(obj))
    seen.add(id(obj))
    if isinstance(obj, functools.partial):
        return ("partial", _callable(obj.func, f"{where}.func", seen),
                _value(obj.args, f"{where}.args", seen),
                _value(obj.keywords, f"{where}.keywords", seen))  # fmt: skip
    if isinstance(obj, types.MethodType):
        return ("method", _callable(obj.__func__, where, seen),
                _value(obj.__self__, f"{where}.__self__", seen))  # fmt: skip
    if isinstance(obj, types.FunctionType):
        code = obj.__code__
        closure = tuple(
            _value(_cell(cell), f"{where} (closure variable {name!r})", seen)
            for name, cell in zip(code.co_freevars, obj.__closure__ or (), strict=True)
        )
        scope = obj.__globals__
        used = tuple(
            (name, _value(scope[name], f"{where} (global {name!r})", seen))
            for name in sorted(set(_names(code)))
            if name in scope
        )
        return ("function", _name(obj), _code(code),
                _value(obj.__defaults__, f"{where} (defaults)", seen),
                _value(obj.__kwdefaults__, f"{where} (keyword defaults)", seen),
                closure, used)  # fmt: skip
    if isinstance(obj, types.BuiltinFunctionType | np.ufunc | type):
        return ("named", _name(obj))
    call = next((vars(k)["__call__"] for k in type(obj).__mro__ if "__call__" in vars(k)), None)
    if isinstance(call, types.FunctionType):  # a callable object
        return ("object", _name(type(obj)), _callable(call, f"{where}.__call__", seen),
                _token(obj, where))  # fmt: skip
    return ("named", _name(obj), _token(obj, where))


def _value(value: Any, where: str, seen: set[int]) -> Any:
    if isinstance(value, types.ModuleType):
        return ("module", value.__name__)
    if isinstance(value, types.FunctionType | functools.partial | types.MethodType):
        return _callable(value, where, seen)
    if isinstance(value, type | types.BuiltinFunctionType | np.ufunc):
        return ("named", _name(value))
    if isinstance(value, tuple | list) and any(callable(v) for v in value):
        return (type(value).__name__, tuple(_value(v, where, seen) for v in value))
    if isinstance(value, dict) and any(callable(v) for v in value.values()):
        return ("dict", tuple((repr(k), _value(v, where, seen)) for k, v in value.items()))
    return _token(value, where)


def _token(value: Any, where: str) -> str:
    try:
        with dask.config.set({"tokenize.ensure-deterministic": True}):
            return str(tokenize(value))
    except Exception as error:
        raise Unfingerprintable(
            f"{where} holds a {type(value).__module__}.{type(value).__qualname__} that has no "
            f"deterministic fingerprint ({type(error).__name__})"
        ) from error


def _cell(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell (a name assigned after the closure was made)
        return None


def _code(code: types.CodeType) -> Any:
    return (code.co_code, code.co_names, code.co_varnames, code.co_freevars,
            code.co_argcount, code.co_kwonlyargcount,
            tuple(_constant(c) for c in code.co_consts))  # fmt: skip


def _constant(value: Any) -> Any:
    if isinstance(value, types.CodeType):
        return _code(value)
    if isinstance(value, tuple):
        return ("tuple", tuple(_constant(v) for v in value))
    if isinstance(value, frozenset):  # its order varies with string hashing
        return ("frozenset", tuple(sorted(repr(_constant(v)) for v in value)))
    return (type(value).__name__, repr(value))


def _names(code: types.CodeType) -> Iterator[str]:
    """The global names a code object and its nested ones load (not attribute names)."""
    for instruction in dis.get_instructions(code):
        if instruction.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
            yield str(instruction.argval)
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            yield from _names(constant)


def _name(obj: Any) -> str:
    module = getattr(obj, "__module__", None) or type(obj).__module__
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    return f"{module}.{name or type(obj).__qualname__}"


# --------------------------------------------------------------------------
# Inputs


def input_fingerprint(arrays: list[Any], listed: Listing) -> str:
    """A hex digest of the contents of ``arrays`` (the stored arrays behind one input).

    ``listed(array, sized)`` gives ``(key, size)`` of a Zarr array's stored objects (size
    0 unless ``sized``) on a store this module does not list itself
    (see :func:`stored_fingerprint`).
    """
    parts = []
    for array in arrays:
        if isinstance(array, zarr.Array):
            parts.append(("zarr", stored_fingerprint(array, listed)))
        elif isinstance(array, da.Array):
            parts.append(("dask", array.name))
        elif isinstance(array, np.ndarray):
            parts.append(("numpy", str(tokenize(array))))
        else:
            parts.append(("other", _token(array, "the input")))
    return hashlib.blake2b(repr(parts).encode(), digest_size=16).hexdigest()


#: ``(key, size)`` of the stored objects of a Zarr array (size 0 unless asked for)
Listing = Callable[[zarr.Array, bool], list[tuple[str, int]]]


def stored_fingerprint(array: zarr.Array, listed: Listing) -> str:
    """A hex digest of the listing of ``array``'s stored objects.

    Keys, sizes and a version of each object, from the one listing the chunk
    cache uses too (:func:`daskzarr_batches.store.versions.object_versions`: on a
    local directory each file's ``st_mtime_ns`` and inode, on an obstore or fsspec
    store each object's ETag or last-modified time, on a zip store the zip
    file's).  In memory the decoded contents are hashed instead.  On any other
    store (a wrapper store, whose sizes would cost a read of every object) only
    the keys (``listed``): a rewrite in place is not seen there.
    """
    listing = sorted(_listing(array, listed))
    return hashlib.blake2b(json.dumps(listing).encode(), digest_size=16).hexdigest()


def _listing(array: zarr.Array, listed: Listing) -> list[tuple[str, int, str]]:
    """``(key, size, version)`` of every object under ``array``."""
    store = array.store
    found = object_versions(store, array)
    if found is not None:
        return found
    if isinstance(store, zarr.storage.MemoryStore):
        return [("data", int(array.nbytes), str(tokenize(np.asarray(array[...]))))]
    return [(key, 0, "") for key, _ in listed(array, False)]
