"""PyTorch adapter: a [`Loader`][daskzarr_batches.Loader] as a ``torch.utils.data.IterableDataset``.

``import daskzarr_batches.torch`` needs PyTorch (``pip install '.[torch]'`` from a clone,
``pip install 'daskzarr-batches[torch]'`` from an index that has the package); the
package itself never imports this module.

Each iteration of [`ZarrIterableDataset`][daskzarr_batches.torch.ZarrIterableDataset] is one epoch
of the loader,
its batches converted to tensors with ``torch.from_numpy`` (no copy).  Under a
``DataLoader(dataset, batch_size=None, num_workers=N)`` each worker process
reads a disjoint, contiguous part of this rank's positions, cut at whole
batches, so the workers together yield the same batches as the loader alone
(in another interleaving), every sample of the rank's share exactly once.

Workers and the process that made the dataset share a small block of memory
(a ``torch`` tensor in shared memory, handed to ``fork`` and ``spawn`` workers
with the dataset): it carries the epoch the next iteration runs (so
``set_epoch`` reaches persistent workers, and the epoch advances after every
whole epoch, as with ``num_workers=0``) and, per worker, which epoch it is
running or has finished (so ``state_dict()`` in the main process refuses a
state it cannot know).  With torchdata's ``StatefulDataLoader`` each worker
reports its own state, and a resumed run continues every worker's part.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections import deque
from collections.abc import Callable, Generator, Iterator, Mapping
from typing import Any

try:
    import torch
    import torch.utils.dlpack
    from torch.utils.data import IterableDataset, get_worker_info
except ImportError as error:  # pragma: no cover - exercised in a subprocess
    raise ImportError(
        "daskzarr_batches.torch needs PyTorch: pip install '.[torch]' from a clone of "
        "daskzarr_batches (pip install 'daskzarr-batches[torch]' from an index that has it)"
    ) from error

import numpy as np

from ._device_feed import StatedBatches, checked_prefetch
from ._torch_tensors import _check_dtype, _converter, _map_tensors
from ._torch_tensors import csr_tensor as csr_tensor  # sparse rows as torch sparse CSR
from ._torch_tensors import to_tensors as to_tensors  # re-exported: tests use it here
from .errors import ArgumentTypeError, ArgumentValueError, DaskZarrBatchesError
from .loader import Loader

__all__ = ["DevicePrefetcher", "ZarrIterableDataset"]

#: the process whose inherited event loops were reset (once per worker process)
_reset_in: list[int | None] = [None]

#: version of the per-worker state (``StatefulDataLoader``)
WORKER_STATE_VERSION = 1

#: most DataLoader workers one dataset serves (one slot each in the shared block)
MAX_WORKERS = 256

# The shared block: a header, then one slot per worker.
_GEN = 0  # bumped by set_epoch / load_state_dict in the main process
_EPOCH = 1  # the epoch the next iteration runs
_KIND = 2  # what the last bump was: _SET (set_epoch) or _LOADED (load_state_dict)
_WORKERS = 3  # num_workers of the latest run
_SLOTS = 4
_SET, _LOADED = 0, 1
# A slot is one int64 (one store, one load): run id << 40 | epoch << 2 | status.
_EMPTY, _RUNNING, _DONE = 0, 1, 2
_EPOCH_BITS = (1 << 38) - 1
_RUN_BITS = (1 << 23) - 1


class ZarrIterableDataset(IterableDataset):
    """A [`Loader`][daskzarr_batches.Loader] as a PyTorch ``IterableDataset`` of ready-made batches.

    Use it with ``torch.utils.data.DataLoader(dataset, batch_size=None, ...)``
    (or torchdata's ``StatefulDataLoader``): the loader already makes the
    batches.  Batches keep the loader's structure (an array, a tuple, a dict
    of named arrays); every numpy array in it becomes a tensor sharing its
    memory (``torch.from_numpy``), but an array in non-native byte order,
    which is converted to native order first (one copy of that array).

    Parameters
    ----------
    loader : Loader
        The epochs, shuffle, rank share and state to serve.
    device : str or torch.device, optional
        Put each batch on this device, the next ``prefetch`` ahead of the step,
        without DataLoader workers only (with workers, wrap the ``DataLoader`` in a
        [`DevicePrefetcher`][daskzarr_batches.torch.DevicePrefetcher]).  ``None``: host tensors.
    pin_memory : bool, optional
        Copy from pinned host memory (default: when ``device`` is CUDA).
    prefetch : int, default 2
        Batches (not windows, as the ``Loader``'s) put on ``device`` ahead of
        the one handed out.  Left early (a ``break``, an error), the loader goes
        back after the last batch handed out: each sample is handed out once.

    Raises
    ------
    ArgumentTypeError
        ``loader`` is not a [`Loader`][daskzarr_batches.Loader], or (without a ``transform``) one
        of its arrays has a dtype torch cannot hold (datetime64, timedelta64,
        structured, strings, objects; naming the array and the dtype).

    Notes
    -----
    - ``num_workers=0``: iterating runs the loader's next epoch, with its
      bookkeeping: ``state_dict()`` after batch ``k`` resumes at ``k + 1``.
    - ``num_workers=N``: worker ``i`` reads part ``i`` of the ``N`` contiguous,
      whole-batch parts of what is left of this rank's epoch, on local
      threads (a ``distributed`` client is not used in workers).  After an
      epoch every worker finished, the next iteration runs the next epoch,
      as without workers; ``set_epoch(epoch)`` picks one, also for
      persistent workers.  An iteration interrupted mid-epoch is run again
      from where it started.
    - ``state_dict()`` in the main process is exact whenever no worker is
      mid-epoch, and raises [`ArgumentValueError`][daskzarr_batches.ArgumentValueError] otherwise:
      the main process cannot know which of the workers' batches were
      consumed.  For a mid-epoch state with workers use torchdata's
      ``StatefulDataLoader`` and its ``state_dict()``: each worker reports its
      part's state, and a new ``StatefulDataLoader`` (over a new dataset with
      the same settings and ``num_workers``) loaded with it yields exactly
      the batches the uninterrupted run had left, in the same order.
    - Worker processes started with ``fork`` get fresh event loops for Zarr
      and fsspec before they read; ``spawn`` works as well (slower to start:
      ``docs/benchmarks.md``).
    """

    def __init__(
        self,
        loader: Loader,
        *,
        device: str | torch.device | None = None,
        pin_memory: bool | None = None,
        prefetch: int = 2,
    ) -> None:
        if not isinstance(loader, Loader):
            raise ArgumentTypeError(f"loader must be a daskzarr_batches.Loader, got {loader!r}")
        self.device = None if device is None else _device(device)
        self.pin_memory = pin_memory
        self.prefetch = checked_prefetch(prefetch)
        self._prefetcher: DevicePrefetcher | None = None
        if loader.transform is None:
            for source in loader.spec.sources:
                _check_dtype(source.dtype, f"array {source.name!r}")
        self.loader = loader
        self._pid = os.getpid()
        self._shared = torch.zeros(_SLOTS + MAX_WORKERS, dtype=torch.int64).share_memory_()
        self._mem: np.ndarray | None = None
        self._gen = 0  # the generation of the main process's positioning this copy holds
        self._shared_view()[_EPOCH] = loader.epoch
        # in a worker: the run being served, and a state loaded for the next one
        self._iterations = 0
        self._run: _Run | None = None
        self._pending: Mapping[str, Any] | None = None

    # ------------------------------------------------------------ forwarding

    def set_epoch(self, epoch: int) -> None:
        """Run epoch ``epoch`` in the next iteration (from its start), in every worker."""
        self.loader.set_epoch(epoch)
        self._prefetcher = None
        self._position(_SET)

    def state_dict(self) -> dict[str, Any]:
        """The state to resume from.

        In the main process: the loader's
        [`Loader.state_dict`][daskzarr_batches.Loader.state_dict], the
        epochs workers finished included.  In a DataLoader worker (as
        torchdata's ``StatefulDataLoader`` asks): this worker's part.

        Raises
        ------
        ArgumentValueError
            In the main process, while DataLoader workers are mid-epoch.
        """
        if get_worker_info() is not None:
            return self._worker_state()
        if self._prefetcher is not None and self._prefetcher.state is not None:
            return dict(self._prefetcher.state)  # the batches put ahead are not counted
        mem = self._shared_view()
        _advance_if_complete(mem)
        epoch = int(mem[_EPOCH])
        workers = int(mem[_WORKERS])
        busy = [
            w
            for w, (_, slot_epoch, status) in enumerate(
                map(_decode, mem[_SLOTS : _SLOTS + workers])
            )
            if status == _RUNNING or (status == _DONE and slot_epoch == epoch)
        ]
        if busy:
            raise ArgumentValueError(
                f"DataLoader workers {busy} of {workers} are mid-epoch {epoch}: the main "
                "process cannot know which of their batches were consumed; use torchdata's "
                "StatefulDataLoader (its state_dict() holds every worker's part) or take the "
                "state at an epoch boundary"
            )
        if epoch != self.loader.epoch:  # workers finished the loader's epoch
            self.loader.set_epoch(epoch)
        return self.loader.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` (from ``state_dict``).

        In the main process: a loader state
        ([`Loader.load_state_dict`][daskzarr_batches.Loader.load_state_dict]);
        the next iteration continues from it, with or without workers (load
        it before the workers start).  In a worker (torchdata's
        ``StatefulDataLoader``): that worker's part, served by its next
        iteration.

        Raises
        ------
        ArgumentValueError
            ``state`` is not a state of this dataset's kind (see
            [`Loader.load_state_dict`][daskzarr_batches.Loader.load_state_dict]), or a worker's
            state given in the
            main process or for another worker.
        """
        if get_worker_info() is not None:
            self._pending = _check_worker_state(state)
            return
        if isinstance(state, Mapping) and "workers" in state:  # a worker's, not a loader's
            raise ArgumentValueError(
                "this is one DataLoader worker's state (from StatefulDataLoader): load the "
                "StatefulDataLoader's own state_dict() into a StatefulDataLoader instead"
            )
        self.loader.load_state_dict(state)
        self._prefetcher = None
        self._position(_LOADED)

    def __len__(self) -> int:
        """Batches this rank yields in a whole epoch (over all workers)."""
        return len(self.loader)

    # ------------------------------------------------------------ iteration

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        if os.getpid() not in (self._pid, _reset_in[0]):
            _reset_event_loops()
        if info is None:
            if self.device is None:
                return self._main_epoch()
            return self._device_epoch(self.device)
        if self.device is not None:
            return _raise(
                ArgumentValueError(
                    f"device={self.device} puts batches on the device in the main process: "
                    "under DataLoader workers make the dataset without device= and wrap the "
                    "DataLoader in daskzarr_batches.torch.DevicePrefetcher"
                )
            )
        try:
            run = self._start_run(info.id, info.num_workers, info.seed)
        except DaskZarrBatchesError as error:  # raised at the first batch, which the
            return _raise(error)  # DataLoader hands to the main process as it is
        return self._worker_epoch(run)

    def _main_epoch(self) -> Generator[Any, None, None]:
        mem = self._shared_view()
        _advance_if_complete(mem)
        if int(mem[_EPOCH]) != self.loader.epoch:  # workers ran epochs meanwhile
            self.loader.set_epoch(int(mem[_EPOCH]))
        mem[_SLOTS:] = _EMPTY  # whatever workers left is superseded
        convert: Callable[[Any], Any] | None = None
        with contextlib.closing(iter(self.loader)) as epoch:
            for batch in epoch:
                if convert is None:
                    convert = _converter(batch)
                yield convert(batch)
        mem[_EPOCH] = self.loader.epoch  # the next epoch, also for later workers
        mem[_SLOTS:] = _EMPTY

    def _device_epoch(self, device: torch.device) -> Iterator[Any]:
        """The epoch on ``device``; left early, the loader goes back to the last handed out."""
        start, host = self.loader.state_dict(), self._main_epoch()
        stated = StatedBatches(host, self.loader)
        prefetcher = DevicePrefetcher(
            stated, device, pin_memory=self.pin_memory, prefetch=self.prefetch
        )
        self._prefetcher = prefetcher
        batches = prefetcher.__iter__()  # a generator, closed if left early
        try:
            for batch in batches:
                # the loader's own state_dict() too is that after the batch handed out
                self.loader._handed = stated.pulled.popleft()
                yield batch
            self.loader._handed = None
        except BaseException:  # GeneratorExit (a break, a loop body's error) included
            batches.close()
            host.close()
            self.loader.load_state_dict(prefetcher.state or start)
            self._shared_view()[_EPOCH] = self.loader.epoch
            self._prefetcher = None
            raise

    def _start_run(self, worker: int, workers: int, seed: int) -> _Run:
        """Decide (in worker ``worker``) what this iteration serves, and record it."""
        if workers > MAX_WORKERS:
            raise ArgumentValueError(
                f"num_workers={workers}: ZarrIterableDataset serves at most {MAX_WORKERS}"
            )
        mem = self._shared_view()
        if self.loader.spec.client is not None:  # inherited through fork: read locally
            import dask

            with dask.config.set(scheduler="threads"):
                self.loader.spec = dataclasses.replace(self.loader.spec, client=None)
        self._iterations += 1
        # The same for every worker of one DataLoader iteration: the DataLoader's base
        # seed (new per iterator) and the iterations of this (persistent) worker.
        run = (hash((seed - worker, self._iterations)) & _RUN_BITS) or 1
        mem[_WORKERS] = workers
        pending, self._pending = self._pending, None
        if pending is not None:  # StatefulDataLoader resuming this worker's part
            if (pending["worker"], pending["workers"]) != (worker, workers):
                raise ArgumentValueError(
                    f"the state is of worker {pending['worker']} of {pending['workers']}, "
                    f"not of worker {worker} of {workers}"
                )
            self.loader.load_state_dict(pending["rank"])
            part = self.loader.worker(worker, workers)
            if pending["part"] is not None:
                part.load_state_dict(pending["part"])
            epoch = int(pending["epoch"])
            mem[_EPOCH] = epoch
            done = pending["part"] is None
            self._run = _Run(worker, workers, run, epoch, pending["rank"], part, done)
            mem[_SLOTS + worker] = _encode(run, epoch, _DONE if done else _RUNNING)
            if done:
                _advance_if_complete(mem)
            return self._run
        if int(mem[_GEN]) != self._gen:  # the main process moved after this copy
            if int(mem[_KIND]) == _LOADED:
                raise ArgumentValueError(
                    "load_state_dict() was called after the DataLoader's persistent "
                    "workers started: load the state before iterating, or make a new "
                    "DataLoader"
                )
            self._gen = int(mem[_GEN])
            self.loader.set_epoch(int(mem[_EPOCH]))
        epoch = -1
        while epoch != int(mem[_EPOCH]):  # again if the epoch moved on meanwhile
            _advance_if_complete(mem)
            epoch = int(mem[_EPOCH])
            if epoch != self.loader.epoch:  # the epochs before were finished
                self.loader.set_epoch(epoch)
            mem[_SLOTS + worker] = _encode(run, epoch, _RUNNING)
        rank_state = self.loader.state_dict()
        self._run = _Run(worker, workers, run, epoch, rank_state, None, False)
        self._run.part = self.loader.worker(worker, workers)
        return self._run

    def _worker_epoch(self, run: _Run) -> Iterator[Any]:
        if run.done or run.part is None:
            return
        import dask

        convert: Callable[[Any], Any] | None = None
        with dask.config.set(scheduler="threads"):  # never an inherited distributed client
            for batch in run.part:
                if convert is None:
                    convert = _converter(batch)
                yield convert(batch)
        run.done = True
        mem = self._shared_view()
        mem[_SLOTS + run.worker] = _encode(run.run, run.epoch, _DONE)
        _advance_if_complete(mem)

    def _worker_state(self) -> dict[str, Any]:
        run = self._run
        if run is None:
            raise ArgumentValueError("state_dict() in a DataLoader worker before its iteration")
        return {
            "version": WORKER_STATE_VERSION,
            "worker": run.worker,
            "workers": run.workers,
            "epoch": run.epoch,
            "rank": run.rank_state,
            "part": None if run.done or run.part is None else run.part.state_dict(),
        }

    # ------------------------------------------------------------ shared block

    def _shared_view(self) -> np.ndarray:
        if self._mem is None:
            self._mem = self._shared.numpy()
        return self._mem

    def _position(self, kind: int) -> None:
        """Tell every worker, present and future, where the next iteration starts."""
        mem = self._shared_view()
        mem[_SLOTS:] = _EMPTY
        mem[_EPOCH] = self.loader.epoch
        mem[_KIND] = kind
        mem[_GEN] += 1
        self._gen = int(mem[_GEN])

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_mem"] = None  # a view; the shared tensor itself travels
        state["_prefetcher"] = None
        return state

    def __repr__(self) -> str:
        return f"<ZarrIterableDataset of {self.loader!r}>"


class DevicePrefetcher:
    """Batches of tensors put on ``device`` ahead of the step that uses them.

    Parameters
    ----------
    batches : iterable
        Batches of tensors (a ``DataLoader``, a
        [`ZarrIterableDataset`][daskzarr_batches.torch.ZarrIterableDataset],
        any iterable; tensors in dicts, tuples and lists are moved, anything
        else passes through).  If it has ``state_dict()``, it is taken after
        each batch is pulled, and ``state`` is the one after the last
        batch handed out (what to checkpoint: prefetched batches not counted).
    device : str or torch.device
        Where the batches go (``"cuda"``, ``"cuda:1"``, ``"cpu"``).
    pin_memory : bool, optional
        Pin each host tensor before its copy (default: when ``device`` is
        CUDA; a ``DataLoader(pin_memory=True)`` pins in its own thread
        already, and pinned tensors are not pinned again).  Ignored for a CPU
        device (pinned memory serves copies to an accelerator only).
    prefetch : int, default 2
        Batches whose copies are started before the current one is handed
        out.
    dlpack : bool, default False
        Hand each tensor over as a DLPack capsule
        (``torch.utils.dlpack.to_dlpack``) for a consumer that takes one.

    Notes
    -----
    On CUDA the copies are ``non_blocking`` on a side stream of the device,
    one event recorded after each batch; handing a batch out makes the
    current stream wait on its event and records the tensors on it, so the
    step never reads a batch before its copy ends and the caching allocator
    does not reuse its memory early.  On a CPU device the same steps run
    with no stream, no event and no pinning.
    """

    def __init__(
        self,
        batches: Any,
        device: str | torch.device,
        *,
        pin_memory: bool | None = None,
        prefetch: int = 2,
        dlpack: bool = False,
    ) -> None:
        self.batches = batches
        self.device = _device(device)
        cuda = self.device.type == "cuda"
        if pin_memory is not None and not isinstance(pin_memory, bool):
            raise ArgumentTypeError(f"pin_memory must be a bool or None, got {pin_memory!r}")
        self.pin_memory = cuda if pin_memory is None else pin_memory and cuda
        self.prefetch = checked_prefetch(prefetch)
        self.dlpack = bool(dlpack)
        self._stream = torch.cuda.Stream(self.device) if cuda else None
        #: the state of ``batches`` after the last batch handed out (None: none taken)
        self.state: dict[str, Any] | None = None

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Generator[Any, None, None]:
        stated = getattr(self.batches, "state_dict", None)
        ahead: deque[tuple[Any, Any, dict[str, Any] | None]] = deque()
        for batch in self.batches:
            ahead.append((*self._start(batch), None if stated is None else stated()))
            if len(ahead) > self.prefetch:
                yield self._hand_out(*ahead.popleft())
        while ahead:
            yield self._hand_out(*ahead.popleft())
        self.state = None if stated is None else stated()

    def _start(self, batch: Any) -> tuple[Any, Any]:
        """Start ``batch``'s copies; (the batch on the device, the event ending them)."""
        if self._stream is None:
            return _map_tensors(batch, self._copy), None
        with torch.cuda.stream(self._stream):
            moved = _map_tensors(batch, self._copy)
            event = torch.cuda.Event()
            event.record(self._stream)
        return moved, event

    def _copy(self, tensor: Any) -> Any:
        if self.pin_memory and tensor.device.type == "cpu" and not tensor.is_pinned():
            tensor = tensor.pin_memory()
        return tensor.to(self.device, non_blocking=True)

    def _hand_out(self, batch: Any, event: Any, state: dict[str, Any] | None) -> Any:
        if event is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(event)
            _map_tensors(batch, lambda t: t.record_stream(current))
        self.state = state
        if self.dlpack:
            return _map_tensors(batch, torch.utils.dlpack.to_dlpack)
        return batch

    def __repr__(self) -> str:
        return f"<DevicePrefetcher to {self.device} of {self.batches!r}>"


def _device(device: Any) -> torch.device:
    try:
        return torch.device(device)
    except (TypeError, RuntimeError) as error:
        raise ArgumentValueError(f"device must name a torch device, got {device!r}") from error


def _raise(error: Exception) -> Iterator[Any]:
    raise error
    yield  # a generator


class _Run:
    """What one worker serves in one iteration: its part of one epoch."""

    __slots__ = ("done", "epoch", "part", "rank_state", "run", "worker", "workers")

    def __init__(
        self,
        worker: int,
        workers: int,
        run: int,
        epoch: int,
        rank_state: dict[str, Any],
        part: Loader | None,
        done: bool,
    ) -> None:
        self.worker, self.workers, self.run, self.epoch = worker, workers, run, epoch
        self.rank_state, self.part, self.done = rank_state, part, done


def _encode(run: int, epoch: int, status: int) -> int:
    return (run << 40) | ((epoch & _EPOCH_BITS) << 2) | status


def _decode(slot: Any) -> tuple[int, int, int]:
    value = int(slot)
    return value >> 40, (value >> 2) & _EPOCH_BITS, value & 3


def _advance_if_complete(mem: np.ndarray) -> None:
    """Move the shared epoch on once every worker of one iteration finished it."""
    workers = int(mem[_WORKERS])
    if workers == 0:
        return
    slots = {_decode(slot) for slot in mem[_SLOTS : _SLOTS + workers]}
    if len(slots) == 1:
        _, epoch, status = slots.pop()
        if status == _DONE and epoch == int(mem[_EPOCH]):
            mem[_EPOCH] = epoch + 1


def _check_worker_state(state: Mapping[str, Any]) -> Mapping[str, Any]:
    keys = {"version", "worker", "workers", "epoch", "rank", "part"}
    if (
        not isinstance(state, Mapping)
        or state.get("version") != WORKER_STATE_VERSION
        or not keys <= set(state)
    ):
        raise ArgumentValueError(
            f"not a ZarrIterableDataset worker state of version {WORKER_STATE_VERSION} "
            f"(StatefulDataLoader with the same num_workers): {state!r}"
        )
    return state


def _reset_event_loops() -> None:
    """Forget the event-loop threads a forked process inherited (they do not run here).

    Zarr and fsspec each keep an asyncio loop on a daemon thread and a lock
    guarding its creation; after ``fork`` the thread is gone but the
    references remain, and the first read would wait forever on them.
    """
    import fsspec.asyn

    from .store.zarr_adapter import forget_loop

    forget_loop()
    fsspec.asyn.reset_lock()
    _reset_in[0] = os.getpid()
