"""A :class:`Loader`'s iteration and its batches' structure: ``_Epoch`` (one epoch's
iterator that, after an error, names it on every later ``next()``), ``_structure``
(the arrays given: names, whether a single array is wrapped in a tuple) and ``_sources``
(the data as rows or, with ``input_dims``, as patches)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from ..errors import ArgumentTypeError, ArgumentValueError, StreamFailedError
from ..store.sources import is_xarray
from ..store.subsets import ChunkSubset
from ..streams.patch import patch_arguments


def _structure(arrays: Any) -> tuple[tuple[str, ...] | None, bool, tuple[Any, ...]]:
    """(names or None, whether one batch array needs wrapping in a tuple, the arrays)."""
    if isinstance(arrays, ChunkSubset) and arrays.paired:  # its arrays' subsets, by name
        keys = arrays.keys() if isinstance(arrays.data, Mapping) else range(len(arrays.data))
        subsets = {key: arrays[key] for key in keys}
        arrays = subsets if isinstance(arrays.data, Mapping) else tuple(subsets.values())
    if is_xarray(arrays, "Dataset"):
        if not arrays.data_vars:
            raise ArgumentValueError("data is an xarray.Dataset without data variables")
        arrays = {str(name): arrays[name] for name in arrays.data_vars}
    if isinstance(arrays, Mapping):
        if not arrays:
            raise ArgumentValueError("data is an empty dict")
        names = tuple(arrays)
        if not all(isinstance(name, str) for name in names):
            raise ArgumentTypeError(f"the names of data's arrays must be strings, got {names!r}")
        return names, len(names) == 1, tuple(arrays.values())
    if isinstance(arrays, tuple | list):
        if not arrays:
            raise ArgumentValueError("data is empty")
        return None, len(arrays) == 1, tuple(arrays)
    return None, False, (arrays,)


class _Epoch:
    """An iteration of a :class:`Loader`: its batches, and after an error, that error.

    A generator that raised is finished, so a ``next()`` after a caught
    error would end the epoch quietly; here it raises
    :class:`StreamFailedError` naming the first error instead.
    """

    __slots__ = ("_batches", "_failure")

    def __init__(self, batches: Iterator[Any]) -> None:
        self._batches = batches
        self._failure: BaseException | None = None

    def __iter__(self) -> _Epoch:
        return self

    def __next__(self) -> Any:
        if self._failure is not None:
            error = StreamFailedError(
                "this Loader iteration stopped at an earlier error and yields nothing more: "
                f"{type(self._failure).__name__}: {self._failure}; iterate the loader again "
                "(or resume it from its state_dict()) to go on"
            )
            raise error from self._failure
        try:
            return next(self._batches)
        except StopIteration:
            raise
        except BaseException as exc:
            self._failure = exc
            raise

    def close(self) -> None:
        """Stop the iteration (as a generator's ``close()``): its stream is released."""
        self._batches.close()  # type: ignore[attr-defined]


def _sources(
    data: Any, input_dims: Mapping[Any, int] | None, **patch: Any
) -> tuple[tuple[str, ...] | None, bool, Any, tuple[str, ...] | None, Any]:
    """A loader's data as sources: its names, whether wrapped, values, roles and layout.

    Rows (``input_dims=None``, every patch argument unset) or patches (their
    sources and how a batch is packed, from ``patch_arguments``).
    """
    if input_dims is not None:
        patches = patch_arguments(data, input_dims, **patch)
        return None, False, patches.sources, patches.roles, patches.layout
    named = sorted(
        name
        for name, value in patch.items()
        if (value if name == "return_origins" else value is not None)
    )
    if named:
        raise ArgumentValueError(
            f"{', '.join(named)} given without input_dims: patch arguments need "
            "input_dims (the patch size along each patched dim)"
        )
    names, wrap, values = _structure(data)
    return names, wrap, values, names or None, None
