"""The PyTorch adapter's tensors: a batch's numpy arrays as tensors, uncopied
(``to_tensors``; non-native byte order converted, dtypes torch cannot hold refused,
naming them), the conversion picked once per batch shape (``_converter``), and
``_map_tensors`` (a function applied to every tensor of a batch).

Imported only by ``daskzarr_batches.torch``, which re-exports its names (after its own
``import torch`` names the missing extra); the package never imports it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from .errors import ArgumentTypeError


def _map_tensors(batch: Any, fn: Callable[[Any], Any]) -> Any:
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, Mapping):
        return {key: _map_tensors(value, fn) for key, value in batch.items()}
    if isinstance(batch, tuple | list):
        return type(batch)(_map_tensors(value, fn) for value in batch)
    return batch


# ---------------------------------------------------------------- tensors


def _check_dtype(dtype: np.dtype[Any], what: str) -> None:
    """Raise unless torch holds ``dtype`` (in native byte order)."""
    try:
        torch.from_numpy(np.empty(0, dtype=dtype.newbyteorder("=")))
    except (TypeError, ValueError) as error:
        raise ArgumentTypeError(
            f"{what} has dtype {dtype} ({dtype.str}), which torch tensors cannot hold; "
            "convert it (e.g. with the Loader's transform=) to a numeric or bool dtype"
        ) from error


def _tensor(value: Any) -> Any:
    """``value`` as a tensor if it is a numpy array (anything else: ``to_tensors``)."""
    try:
        return torch.from_numpy(value)
    except (TypeError, ValueError):
        if not isinstance(value, np.ndarray):
            return to_tensors(value)
        if not value.dtype.isnative:  # one copy, in native byte order
            return torch.from_numpy(value.astype(value.dtype.newbyteorder("=")))
        _check_dtype(value.dtype, "a batch array (after the Loader's transform)")
        raise


def csr_tensor(rows: Any) -> Any:
    """A ``scipy.sparse`` CSR batch (sparse rows) as a ``torch.sparse_csr_tensor``.

    Its values uncopied; row pointers and columns as int64 (torch's index dtype).
    ``tensor.to_dense()`` densifies it; or densify before, in the Loader's
    ``transform`` (``lambda b: {**b, "x": b["x"].toarray()}``).
    """
    with warnings.catch_warnings():  # torch's note that its sparse CSR support is "beta"
        warnings.filterwarnings("ignore", "Sparse CSR tensor support is in beta", UserWarning)
        return torch.sparse_csr_tensor(
            torch.from_numpy(np.asarray(rows.indptr, dtype=np.int64)),
            torch.from_numpy(np.asarray(rows.indices, dtype=np.int64)),
            _tensor(np.asarray(rows.data)),
            size=tuple(rows.shape),
            check_invariants=False,  # the read checked them: indptr monotone, columns in range
        )


def _is_csr(value: Any) -> bool:
    return not isinstance(value, np.ndarray) and getattr(value, "format", None) == "csr"


def to_tensors(batch: Any) -> Any:
    """``batch`` with every numpy array in it (dict, tuple, list) as a tensor, uncopied.

    Arrays in non-native byte order are converted (one copy); a ``scipy.sparse``
    CSR matrix (sparse rows) becomes a ``torch.sparse_csr_tensor`` (:func:`csr_tensor`).

    Raises
    ------
    ArgumentTypeError
        An array has a dtype torch cannot hold.
    """
    if isinstance(batch, np.ndarray):
        return _tensor(batch)
    if _is_csr(batch):
        return csr_tensor(batch)
    if isinstance(batch, Mapping):
        return {key: to_tensors(value) for key, value in batch.items()}
    if isinstance(batch, tuple | list):
        return type(batch)(to_tensors(value) for value in batch)
    return batch


def _from_dict(batch: Any) -> Any:
    return {key: _tensor(value) for key, value in batch.items()}


def _from_tuple(batch: Any) -> Any:
    return tuple(map(_tensor, batch))


def _converter(batch: Any) -> Callable[[Any], Any]:
    """The conversion for batches shaped like ``batch`` (each still checked as it goes)."""
    if type(batch) is np.ndarray:
        return _tensor
    if type(batch) is dict and all(type(v) is np.ndarray for v in batch.values()):
        return _from_dict
    if type(batch) is tuple and all(type(v) is np.ndarray for v in batch):
        return _from_tuple
    return to_tensors
