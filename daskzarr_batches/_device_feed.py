"""A loader's batches put on devices ahead of the step: what the JAX and cupy adapters share.

[`DeviceFeed`][daskzarr_batches._device_feed.DeviceFeed] wraps a ``Loader``: each
iteration is one of its epochs, every batch handed to the subclass's ``put`` (which
starts the batch's transfer and returns what to hand out) on a thread at most
``prefetch`` batches ahead, and to ``hand_out`` on the consumer's thread when it is
its turn.  The state it reports is the loader's after the last batch handed out, so
the batches prefetched but not handed out are not counted and a resume is exact; an
iteration left early (a ``break``, an exception in the loop body or from the loader)
puts the loader back at that state, so the next iteration goes on with the first batch
not handed out, as a plain ``Loader`` does (the batches put ahead are read again).
The package's warnings raised on the prefetch thread are emitted on the consumer's,
attributed to its line, when the batch they came with is handed out.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from .errors import ArgumentTypeError, ArgumentValueError, deferred_warnings, warn_caller

__all__ = ["DeviceFeed", "checked_prefetch", "map_arrays"]


def map_arrays(batch: Any, fn: Callable[[np.ndarray], Any]) -> Any:
    """``batch`` (an array, or arrays in tuples, lists and dicts) with ``fn`` of each array."""
    if isinstance(batch, np.ndarray):
        return fn(batch)
    if isinstance(batch, Mapping):
        return {key: map_arrays(value, fn) for key, value in batch.items()}
    if isinstance(batch, tuple | list):
        return type(batch)(map_arrays(value, fn) for value in batch)
    return batch


def checked_prefetch(prefetch: Any) -> int:
    """``prefetch`` as a non-negative int, or the error naming it."""
    if isinstance(prefetch, bool) or not isinstance(prefetch, int | np.integer):
        raise ArgumentTypeError(f"prefetch must be an int, got {prefetch!r}")
    if prefetch < 0:
        raise ArgumentValueError(f"prefetch must be >= 0, got {prefetch}")
    return int(prefetch)


class DeviceFeed:
    """A loader's epochs with each batch put on devices ``prefetch`` batches ahead.

    Subclasses define :meth:`put` (start a batch's transfer, on the prefetch
    thread) and may define :meth:`hand_out` (make the consumer's work wait for
    the transfer, on its thread).
    """

    def __init__(self, loader: Any, prefetch: int) -> None:
        self.loader = loader
        self.prefetch = checked_prefetch(prefetch)
        self._state: dict[str, Any] | None = None  # after the last batch handed out

    def put(self, batch: Any) -> Any:
        """Start ``batch``'s transfer; what :meth:`hand_out` gets."""
        raise NotImplementedError

    def hand_out(self, item: Any) -> Any:
        """What the consumer gets for ``item`` (from :meth:`put`): here, ``item`` itself."""
        return item

    # ------------------------------------------------------------ forwarding

    def __len__(self) -> int:
        """Batches of a whole epoch (this rank's share)."""
        return len(self.loader)

    @property
    def epoch(self) -> int:
        """The epoch the next (or current) iteration runs, as far as handed out."""
        state = self._state
        return int(self.loader.epoch if state is None else state["epoch"])

    def set_epoch(self, epoch: int) -> None:
        """Run epoch ``epoch`` in the next iteration (from its start)."""
        self.loader.set_epoch(epoch)
        self._state = None

    def state_dict(self) -> dict[str, Any]:
        """The loader's state after the last batch this iterator handed out."""
        return dict(self.loader.state_dict() if self._state is None else self._state)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` (from ``state_dict``; see
        [`Loader.load_state_dict`][daskzarr_batches.Loader.load_state_dict])."""
        self.loader.load_state_dict(state)
        self._state = None

    get_state = state_dict
    set_state = load_state_dict

    def bottleneck(self) -> Any:
        """What limited the current (or last) epoch: ``Loader.bottleneck``."""
        return self.loader.bottleneck()

    # ------------------------------------------------------------ iteration

    def __iter__(self) -> Iterator[Any]:
        return self._epoch()

    def _epoch(self) -> Iterator[Any]:
        """One epoch; left early (a break, an error), the loader goes back to the last
        batch handed out, so the batches put ahead are read again, not lost."""
        start = self.loader.state_dict()
        try:
            yield from self._direct() if self.prefetch == 0 else self._prefetched()
        except BaseException:  # GeneratorExit (a break, a loop body's error) included
            # the loader's iteration is closed by now
            self.loader.load_state_dict(start if self._state is None else self._state)
            self._state = None  # the loader's own state is exact again
            raise

    def _direct(self) -> Iterator[Any]:
        """The epoch without a thread: each batch put when it is asked for."""
        host = iter(self.loader)
        try:
            for batch in host:
                item = self.put(batch)
                self._state = self.loader.state_dict()
                yield self.hand_out(item)
        finally:
            host.close()
        self._state = None  # the epoch is over: the loader's own state is exact

    def _prefetched(self) -> Iterator[Any]:
        """The epoch with a thread that pulls host batches and starts their transfers,
        at most ``prefetch`` ahead: the transfers (and their dispatch) overlap the step."""
        ahead: queue.Queue[tuple[str, Any, Any, list[Warning]]] = queue.Queue(self.prefetch)
        stop = threading.Event()
        producer = threading.Thread(
            target=self._produce, args=(ahead, stop), name=type(self).__name__, daemon=True
        )
        producer.start()
        try:
            while True:
                kind, item, state, warned = ahead.get()
                for warning in warned:  # raised on the prefetch thread: the caller's now
                    warn_caller(warning)
                if kind == "end":
                    self._state = None  # the epoch is over: the loader's state is exact
                    return
                if kind == "error":
                    raise item
                self._state = state
                yield self.hand_out(item)
        finally:
            stop.set()
            while producer.is_alive():  # let it see the stop, however full the queue
                with contextlib.suppress(queue.Empty):
                    ahead.get(timeout=0.05)
            producer.join()

    def _produce(
        self, ahead: queue.Queue[tuple[str, Any, Any, list[Warning]]], stop: threading.Event
    ) -> None:
        """Pull the loader's batches and start their transfers (the prefetch thread).

        The package's warnings raised here go with the batch they came with, to be
        emitted on the consumer's thread, at its line.
        """
        with deferred_warnings() as warned:

            def taken() -> list[Warning]:
                out = warned[:]
                warned.clear()
                return out

            host = iter(self.loader)
            try:
                for batch in host:
                    item = ("batch", self.put(batch), self.loader.state_dict(), taken())
                    while not stop.is_set():
                        try:
                            ahead.put(item, timeout=0.05)
                            break
                        except queue.Full:
                            continue
                    if stop.is_set():
                        return
                ahead.put(("end", None, None, taken()))
            except BaseException as error:  # handed to the consumer, raised there
                if not stop.is_set():
                    ahead.put(("error", error, None, taken()))
            finally:
                host.close()
