"""cupy adapter: a [`Loader`][daskzarr_batches.Loader]'s batches as arrays on a GPU.

``import daskzarr_batches.cupy`` imports no GPU library; cupy is imported when a
[`CupyLoader`][daskzarr_batches.cupy.CupyLoader] is made without ``xp=``
(``pip install cupy-cuda12x``, or the build for your CUDA).  The package itself
never imports this module.

Each batch's numpy arrays are copied to the device by ``xp.asarray``
``prefetch`` batches before the batch is handed out.  With cupy the copies run on a side
stream (``cupy.cuda.Stream(non_blocking=True)``) from pinned host memory, one
event recorded per batch, and handing a batch out makes the consumer's current
stream wait on its event, so the step never reads a batch before its copy ends.
With an array module without CUDA streams (``xp=numpy``, what the CPU tests run)
the same code path runs without streams or pinning.
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np

from ._device_feed import DeviceFeed, map_arrays
from .errors import ArgumentTypeError
from .loader import Loader

__all__ = ["CupyLoader"]


def _cupy() -> Any:
    try:
        return importlib.import_module("cupy")
    except ImportError as error:
        raise ImportError(
            "CupyLoader needs cupy (pip install cupy-cuda12x, or the build for your CUDA); "
            "pass xp=numpy to run the same path on the host"
        ) from error


class CupyLoader(DeviceFeed):
    """A [`Loader`][daskzarr_batches.Loader] whose batches are device arrays (cupy by default).

    Parameters
    ----------
    loader : Loader
        The epochs, shuffle, share and state to serve.
    xp : module, optional
        The array module the batches are made with: ``cupy`` (``None``, the
        current CUDA device), or any module with ``asarray`` (``numpy`` runs
        the same logic on the host, as the CPU tests do).
    prefetch : int, default 2
        Batches (not windows, as the ``Loader``'s ``prefetch``) copied to the
        device ahead of the one handed out, so that their copies overlap the
        step (``0``: copy each when asked).

    Raises
    ------
    ArgumentTypeError
        ``loader`` is not a [`Loader`][daskzarr_batches.Loader], ``xp`` has no
        ``asarray``, or ``prefetch`` is not an int.
    ArgumentValueError
        ``prefetch`` is negative.
    ImportError
        ``xp=None`` and cupy is not installed.

    Notes
    -----
    Batches keep the loader's structure (an array, a tuple, a dict); every
    numpy array becomes an ``xp`` array, of the same dtype.  ``state_dict()``
    is the state after the last batch handed out (prefetched batches are not
    counted): ``load_state_dict()`` on a ``CupyLoader`` over a new loader
    yields exactly the rest of the uninterrupted run.  An iteration left
    early (a ``break``, an exception) puts the loader back after the last
    batch handed out, so the next one goes on with the batches prefetched.
    """

    def __init__(self, loader: Loader, *, xp: Any = None, prefetch: int = 2) -> None:
        if not isinstance(loader, Loader):
            raise ArgumentTypeError(f"loader must be a daskzarr_batches.Loader, got {loader!r}")
        xp = _cupy() if xp is None else xp
        if not callable(getattr(xp, "asarray", None)):
            raise ArgumentTypeError(f"xp must be an array module with asarray, got {xp!r}")
        super().__init__(loader, prefetch)
        self.xp = xp
        cuda = getattr(xp, "cuda", None)
        #: the side stream the copies run on (``None``: a module without CUDA streams)
        self.stream = None if cuda is None else cuda.Stream(non_blocking=True)

    def put(self, batch: Any) -> Any:
        """Copy ``batch``'s arrays to the device; with cupy, on the side stream."""
        if self.stream is None:
            return map_arrays(batch, self.xp.asarray), None
        pinned = map_arrays(batch, self._pinned)
        with self.stream:
            out = map_arrays(pinned, self.xp.asarray)
            event = self.stream.record()
        return out, event

    def hand_out(self, item: Any) -> Any:
        """The batch, once the consumer's current stream waits for its copy."""
        out, event = item
        if event is not None:
            self.xp.cuda.get_current_stream().wait_event(event)
        return out

    def _pinned(self, array: Any) -> Any:
        """``array`` in page-locked host memory, so its copy to the device is asynchronous."""
        memory = self.xp.cuda.alloc_pinned_memory(array.nbytes)
        pinned = np.frombuffer(memory, array.dtype, array.size).reshape(array.shape)
        pinned[...] = array
        return pinned

    def __repr__(self) -> str:
        return (
            f"<CupyLoader of {self.loader!r}, xp={getattr(self.xp, '__name__', self.xp)}, "
            f"prefetch={self.prefetch}>"
        )
