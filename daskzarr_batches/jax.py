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
        Batches put on the devices ahead of the one handed out, so that
        their transfers overlap the step (``0``: put each when asked).

    Raises
    ------
    ArgumentTypeError
        ``loader`` is not a [`Loader`][daskzarr_batches.Loader], or ``sharding`` not a
        ``jax.sharding.Sharding``.
    ArgumentValueError
        ``prefetch`` is negative, or (several JAX processes) the loader's
        rank and world size are not this process's.

    Notes
    -----
    Dtypes are JAX's: without ``jax.config.update("jax_enable_x64", True)``
    JAX holds 64-bit arrays as 32-bit ones (``device_put``'s rule).

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

    def put(self, batch: Any) -> Any:
        """``batch`` (numpy arrays in a tuple, dict, ...) with every array on the devices."""
        return jax.tree_util.tree_map(self._put, batch)

    def _put(self, value: Any) -> Any:
        if not isinstance(value, np.ndarray):
            return value
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
