"""PyTorch adapter: a :class:`Loader` as a ``torch.utils.data.IterableDataset``.

``import daskzarr_batches.torch`` needs PyTorch (``pip install
'daskzarr-batches[torch]'``); the package itself never imports this module.

Each iteration of :class:`ZarrIterableDataset` is one epoch of the loader,
its batches converted to tensors with ``torch.from_numpy`` (no copy).  Under a
``DataLoader(dataset, batch_size=None, num_workers=N)`` each worker process
reads a disjoint, contiguous part of this rank's positions, cut at whole
batches, so the workers together yield the same batches as the loader alone
(in another interleaving), every sample of the rank's share exactly once.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Mapping
from typing import Any

try:
    import torch
    from torch.utils.data import IterableDataset, get_worker_info
except ImportError as error:  # pragma: no cover - exercised in a subprocess
    raise ImportError(
        "daskzarr_batches.torch needs PyTorch: pip install 'daskzarr-batches[torch]'"
    ) from error

import numpy as np

from ._loader import Loader

__all__ = ["ZarrIterableDataset"]

#: the process whose inherited event loops were reset (once per worker process)
_reset_in: list[int | None] = [None]


class ZarrIterableDataset(IterableDataset):
    """A :class:`Loader` as a PyTorch ``IterableDataset`` of ready-made batches.

    Use it with ``torch.utils.data.DataLoader(dataset, batch_size=None, ...)``:
    the loader already makes the batches.  Batches keep the loader's
    structure (an array, a tuple, a dict of named arrays); every numpy array
    in it becomes a tensor sharing its memory (``torch.from_numpy``).

    Parameters
    ----------
    loader : Loader
        The epochs, shuffle, rank share and state to serve.

    Notes
    -----
    - ``num_workers=0``: iterating runs the loader's next epoch, with its
      bookkeeping: ``state_dict()`` after batch ``k`` resumes at batch
      ``k + 1``.
    - ``num_workers=N``: worker ``i`` reads part ``i`` of the ``N`` contiguous,
      whole-batch parts of what is left of this rank's epoch, on local
      threads (a ``distributed`` client is not used in workers).  The workers
      iterate copies of the dataset, so its epoch does not advance in your
      process: call ``dataset.set_epoch(epoch)`` before each epoch, as with
      ``DistributedSampler``.  (With ``persistent_workers=True`` the copies
      advance their own epoch and ``set_epoch`` no longer reaches them.)
      ``state_dict()`` is then exact at epoch boundaries only.
    - Worker processes started with ``fork`` get fresh event loops for Zarr
      and fsspec before they read; ``spawn`` works as well.
    """

    def __init__(self, loader: Loader) -> None:
        if not isinstance(loader, Loader):
            raise TypeError(f"loader must be a daskzarr_batches.Loader, got {loader!r}")
        self.loader = loader
        self._pid = os.getpid()

    # ------------------------------------------------------------ forwarding

    def set_epoch(self, epoch: int) -> None:
        """Run epoch ``epoch`` in the next iteration (from its start)."""
        self.loader.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """The loader's :meth:`Loader.state_dict`."""
        return self.loader.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """The loader's :meth:`Loader.load_state_dict`."""
        self.loader.load_state_dict(state)

    def __len__(self) -> int:
        """Batches this rank yields in a whole epoch (over all workers)."""
        return len(self.loader)

    # ------------------------------------------------------------ iteration

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        if os.getpid() not in (self._pid, _reset_in[0]):
            _reset_event_loops()
        if info is None or info.num_workers <= 1:
            for batch in self.loader:
                yield to_tensors(batch)
            return
        yield from self._worker_part(info.id, info.num_workers)

    def _worker_part(self, worker: int, workers: int) -> Iterator[Any]:
        loader = self.loader
        part = loader.worker(worker, workers)
        part.spec = dataclasses.replace(part.spec, client=None)
        import dask

        with dask.config.set(scheduler="threads"):  # never an inherited distributed client
            for batch in part:
                loader.stats = part.stats
                yield to_tensors(batch)
        loader.set_epoch(loader.epoch + 1)  # this copy's next epoch (persistent workers)

    def __repr__(self) -> str:
        return f"<ZarrIterableDataset of {self.loader!r}>"


def to_tensors(batch: Any) -> Any:
    """``batch`` with every numpy array in it (dict, tuple, list) as a tensor, uncopied."""
    if isinstance(batch, np.ndarray):
        return torch.from_numpy(batch)
    if isinstance(batch, Mapping):
        return {key: to_tensors(value) for key, value in batch.items()}
    if isinstance(batch, tuple | list):
        return type(batch)(to_tensors(value) for value in batch)
    return batch


def _reset_event_loops() -> None:
    """Forget the event-loop threads a forked process inherited (they do not run here).

    Zarr and fsspec each keep an asyncio loop on a daemon thread and a lock
    guarding its creation; after ``fork`` the thread is gone but the
    references remain, and the first read would wait forever on them.
    """
    import fsspec.asyn
    import zarr.core.sync

    zarr.core.sync.loop[0] = None
    zarr.core.sync.iothread[0] = None
    zarr.core.sync._executor = None
    zarr.core.sync._lock = None
    fsspec.asyn.reset_lock()
    _reset_in[0] = os.getpid()
