"""JAX adapter: a [`Loader`][daskzarr_batches.Loader]'s batches as ``jax.Array``, laid out across
devices.

``import daskzarr_batches.jax`` needs JAX (``pip install '.[jax]'`` from a clone,
``pip install 'daskzarr-batches[jax]'`` from an index that has the package); the package
itself never imports this module.

[`JaxLoader`][daskzarr_batches.jax.JaxLoader] wraps a [`Loader`][daskzarr_batches.Loader]: each
iteration is one of its epochs,
every numpy array of a batch (an array, a tuple, a dict) handed to
``jax.device_put`` (one device) or, with a ``jax.sharding.Sharding``, made into
one global array of which each device holds its part of the batch axis.
Device transfers are asynchronous in JAX, so keeping the next ``prefetch``
batches already put overlaps their copies with the step that uses the current
one (the loader itself reads ahead on its threads meanwhile).

With several JAX processes (``jax.distributed.initialize``) each process reads
its own share: build the loader with [`process_share`][daskzarr_batches.jax.process_share]
(``rank`` =
``jax.process_index()``, ``world_size`` = ``jax.process_count()``); a sharded
batch is then assembled from the process-local parts
(``jax.make_array_from_process_local_data``), its global batch axis every
process's batch one after another.
"""

from __future__ import annotations

from typing import Any

try:
    import jax
except ImportError as error:  # pragma: no cover - exercised where jax is absent
    raise ImportError(
        "daskzarr_batches.jax needs JAX: pip install '.[jax]' from a clone of daskzarr_batches "
        "(pip install 'daskzarr-batches[jax]' from an index that has the package)"
    ) from error

import numpy as np

from ._device_feed import DeviceFeed
from .errors import ArgumentTypeError, ArgumentValueError
from .loader import Loader

__all__ = ["JaxLoader", "process_share"]

#: the native dtypes JAX was seen to hold (checked once per process, not per loader)
_HELD: set[np.dtype[Any]] = set()

#: version of [`JaxLoader.state_dict`][daskzarr_batches.jax.JaxLoader.state_dict]'s wrapper
STATE_VERSION = 1


def process_share() -> dict[str, int]:
    """This JAX process's share of each epoch, as [`Loader`][daskzarr_batches.Loader] keywords.

    ``{"rank": jax.process_index(), "world_size": jax.process_count()}``:
    ``Loader(arrays, batch_size, **process_share())`` reads this process's
    share, disjoint from every other process's.
    """
    return {"rank": jax.process_index(), "world_size": jax.process_count()}


class JaxLoader(DeviceFeed):
    """A [`Loader`][daskzarr_batches.Loader] whose batches are ``jax.Array`` (sharded across
    devices if asked).

    Parameters
    ----------
    loader : Loader
        The epochs, shuffle, share and state to serve.  With several JAX
        processes its ``rank`` and ``world_size`` must be this process's
        ([`process_share`][daskzarr_batches.jax.process_share]).
    sharding : jax.sharding.Sharding, optional
        How each batch array is laid out, e.g.
        ``NamedSharding(mesh, PartitionSpec("batch"))``: the batch axis split
        across the mesh's devices.  ``None``: every array on JAX's default
        device (``jax.device_put``).  The batch size (times the processes)
        must divide evenly across the devices of the batch axis; use the
        loader's ``drop_remainder=True`` if the last batch would not.
    prefetch : int, default 2
        Batches (not windows, as the ``Loader``'s ``prefetch``) put on the
        devices ahead of the one handed out (JAX's transfers are
        asynchronous: they overlap the step; ``0``: each put when asked).

    Raises
    ------
    ArgumentTypeError
        ``loader`` is not a [`Loader`][daskzarr_batches.Loader], ``sharding`` not a
        ``jax.sharding.Sharding``, or (without a ``transform``) an array has a
        dtype JAX cannot hold, naming it.
    ArgumentValueError
        ``prefetch`` is negative, or (several JAX processes) the loader's
        rank and world size are not this process's.

    Notes
    -----
    Dtypes are JAX's: without ``jax.config.update("jax_enable_x64", True)``
    JAX holds 64-bit arrays as 32-bit ones (``device_put``'s rule): float64
    is rounded to float32, and int64 / uint64 become int32 / uint32, so a
    batch holding an integer outside that range raises
    [`ArgumentValueError`][daskzarr_batches.ArgumentValueError] naming the
    array, its dtype and the value, where JAX would wrap it silently.  Arrays
    in non-native byte order (``'>f4'``) are converted (one copy); an array
    JAX cannot hold (datetime64, timedelta64, structured, strings, objects)
    is refused with [`ArgumentTypeError`][daskzarr_batches.ArgumentTypeError]
    naming it and its dtype when the ``JaxLoader`` is made (after a
    ``transform``, at the first batch holding it).

    An iteration left early (a ``break``, an exception in the loop body)
    puts the loader back after the last batch handed out: iterating again
    goes on with the next one, the batches prefetched read again, so every
    sample is handed out once.  Warnings raised while a batch is prefetched
    are emitted when it is handed out, at the consumer's line.

    ``state_dict()`` is the state after the last batch handed out (the
    batches prefetched but not handed out are not counted), so a
    ``JaxLoader`` over a new loader, given it with ``load_state_dict()``,
    yields exactly the rest of the uninterrupted run.  It is plain JSON-able
    data: checkpoint it as any pytree of Python values (Orbax's
    ``JsonSave``, a ``grain``-style iterator's ``get_state()`` /
    ``set_state()``, which are its aliases here).
    """

    def __init__(self, loader: Loader, *, sharding: Any = None, prefetch: int = 2) -> None:
        if not isinstance(loader, Loader):
            raise ArgumentTypeError(f"loader must be a daskzarr_batches.Loader, got {loader!r}")
        if sharding is not None and not isinstance(sharding, jax.sharding.Sharding):
            raise ArgumentTypeError(
                f"sharding must be a jax.sharding.Sharding (e.g. NamedSharding) or None, "
                f"got {sharding!r}"
            )
        super().__init__(loader, prefetch)
        processes = jax.process_count()
        if processes > 1 and (loader.rank, loader.world_size) != (
            jax.process_index(),
            processes,
        ):
            raise ArgumentValueError(
                f"this is JAX process {jax.process_index()} of {processes}, but the loader "
                f"reads rank {loader.rank} of {loader.world_size}: build it with "
                "Loader(..., **daskzarr_batches.jax.process_share())"
            )
        self.sharding = sharding
        self._processes = processes
        if loader.transform is None:  # refused before the first batch
            for source in loader.spec.sources:
                self._check_dtype(source.dtype, f"array {source.name}")

    def _check_dtype(self, dtype: np.dtype[Any], what: str) -> None:
        """Raise unless JAX holds ``dtype`` (in native byte order, which ``put`` makes)."""
        native = dtype.newbyteorder("=")
        if native in _HELD:
            return
        try:
            jax.device_put(np.empty(0, dtype=native))
        except TypeError as error:
            raise ArgumentTypeError(
                f"{what} has dtype {dtype} ({dtype.str}), which JAX arrays cannot hold "
                "(datetime64, timedelta64, structured, strings and objects are not numeric); "
                "convert it, e.g. with the Loader's transform=, to a numeric or bool dtype"
            ) from error
        _HELD.add(native)

    def _held(self, value: np.ndarray, path: Any) -> np.ndarray:
        """``value`` as JAX takes it: native byte order, checked dtype, 64-bit ints that fit."""
        if not value.dtype.isnative:  # JAX refuses other byte orders: one copy
            value = value.astype(value.dtype.newbyteorder("="))
        dtype = value.dtype
        if dtype not in _HELD:
            self._check_dtype(dtype, _where(path))
        if dtype.kind in "iu" and dtype.itemsize == 8 and value.size and not _x64():
            _check_fits_32_bits(value, _where(path))
        return value

    def put(self, batch: Any) -> Any:
        """``batch`` (numpy arrays in a tuple, dict, ...) with every array on the devices."""
        if isinstance(batch, np.ndarray):
            return self._put((), batch)
        return jax.tree_util.tree_map_with_path(self._put, batch)

    def _put(self, path: Any, value: Any) -> Any:
        if not isinstance(value, np.ndarray):
            return value
        value = self._held(value, path)
        sharding = self.sharding
        if sharding is None:
            return jax.device_put(value)
        global_shape = (value.shape[0] * self._processes, *value.shape[1:])
        try:
            if self._processes == 1:
                return jax.device_put(value, sharding)
            return jax.make_array_from_process_local_data(sharding, value, global_shape)
        except ValueError as error:
            raise ArgumentValueError(
                f"a batch array of shape {global_shape} cannot be laid out as {sharding}: "
                f"{error}; its batch axis must divide evenly across the devices (the "
                "Loader's drop_remainder=True drops a short last batch)"
            ) from error

    def __repr__(self) -> str:
        return f"<JaxLoader of {self.loader!r}, sharding={self.sharding}, prefetch={self.prefetch}>"


def _x64() -> bool:
    """Whether JAX holds 64-bit arrays as such (``jax_enable_x64``), now."""
    return bool(jax.dtypes.canonicalize_dtype(np.int64) == np.int64)


def _where(path: Any) -> str:
    """A batch array named by its path in the batch (``batch['x']``, ``batch[0]``)."""
    return f"the batch array batch{jax.tree_util.keystr(tuple(path))}" if path else "the batch"


def _check_fits_32_bits(value: np.ndarray, what: str) -> None:
    """Raise unless every value of a 64-bit integer array fits JAX's 32-bit one."""
    info = np.iinfo(np.int32 if value.dtype.kind == "i" else np.uint32)
    low, high = value.min(), value.max()
    if low < info.min or high > info.max:
        first = value[(value < info.min) | (value > info.max)].flat[0]
        raise ArgumentValueError(
            f"{what} ({value.dtype}) holds {first}, outside "
            f"{info.dtype}'s range [{info.min}, {info.max}]: without 64-bit mode JAX holds "
            f"{value.dtype} as {info.dtype}, which would wrap it silently; call "
            "jax.config.update('jax_enable_x64', True) first, or convert the array (the "
            "Loader's transform=)"
        )
