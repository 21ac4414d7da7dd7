"""The scalar argument checks of every entry point, each naming the parameter and the value.

Each check returns the normalised value or raises an error that names the
parameter and shows the offending value.  Numpy integers are accepted wherever
an ``int`` is; ``bool`` is rejected even though it is an ``int`` subclass,
because ``batch_size=True`` is always a mistake.  Re-exported by
``streams.spec``, where they were first.
"""

from __future__ import annotations

import math
import numbers
import os
import threading
from typing import Any

from ..errors import ArgumentTypeError, ArgumentValueError
from ..plan.defaults import DEFAULT_IO_BYTES, DEFAULT_PREFETCH
from ..plan.windows import ShuffleMode
from ..store.open import open_array
from ..store.sparse import anndata_node

__all__ = [
    "AUTO",
    "NotGiven",
    "as_array",
    "buffer_samples",
    "byte_size",
    "default_prefetch",
    "flag",
    "given_value",
    "io_concurrency",
    "merged_io_concurrency",
    "non_negative_int",
    "not_given",
    "positive_int",
    "sample_count",
    "shuffle_mode",
    "timeout_seconds",
]


def _is_integer(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _integer(name: str, value: object, minimum: int, wanted: str, bound: str) -> int:
    if not _is_integer(value):
        raise ArgumentTypeError(
            f"{name} must be a {wanted}, got {value!r} of type {type(value).__name__}"
        )
    result = int(value)  # type: ignore[call-overload]
    if result < minimum:
        raise ArgumentValueError(f"{name} must be {bound}, got {result}")
    return result


def positive_int(name: str, value: object) -> int:
    """Return ``value`` as an ``int`` >= 1, or raise naming ``name``."""
    return _integer(name, value, 1, "positive integer", "a positive integer")


#: The largest count of samples a plan represents: positions, batches and ids are 64-bit.
MAX_COUNT = 2**63 - 1


def sample_count(name: str, value: object) -> int:
    """``value`` as an ``int`` in ``[1, MAX_COUNT]`` (a count of samples), or raise naming ``name``.

    A count above ``2**63 - 1`` cannot be represented by the plan's 64-bit
    positions and batch arithmetic: refused here, rather than by numpy deep
    inside a plan.
    """
    result = positive_int(name, value)
    if result > MAX_COUNT:
        raise ArgumentValueError(
            f"{name}={result} cannot be represented: sample counts, positions and batch "
            f"arithmetic are 64-bit integers, at most 2**63 - 1 = {MAX_COUNT}"
        )
    return result


def non_negative_int(name: str, value: object) -> int:
    """Return ``value`` as an ``int`` >= 0, or raise naming ``name``."""
    return _integer(name, value, 0, "non-negative integer", ">= 0")


def timeout_seconds(value: object) -> float | None:
    """Validate ``timeout``: seconds > 0; ``None`` means wait forever.

    ``float("inf")`` and values of ``threading.TIMEOUT_MAX`` or more (which
    the waits below cannot take) also mean "no timeout", and become ``None``.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ArgumentTypeError(f"timeout must be a number of seconds or None, got {value!r}")
    seconds = float(value)
    if not seconds > 0:  # also NaN
        raise ArgumentValueError(f"timeout must be > 0 seconds, got {value!r}")
    if math.isinf(seconds) or seconds >= threading.TIMEOUT_MAX:
        return None
    return seconds


def io_concurrency(value: object) -> int | None:
    """Validate ``io_concurrency``: an ``int`` >= 1, or ``None`` (the default)."""
    return None if value is None else positive_int("io_concurrency", value)


def byte_size(name: str, value: object) -> int:
    """A size in bytes: an ``int`` >= 1, or a string such as ``"256MiB"`` or ``"1GB"``.

    Strings are read by :func:`dask.utils.parse_bytes` (``kB``/``MB``/``GB``
    are powers of 1000, ``KiB``/``MiB``/``GiB`` of 1024; a bare number is
    bytes).  The one parser of sizes for every argument that takes them.
    """
    if isinstance(value, str):
        from dask.utils import parse_bytes

        try:
            nbytes = int(parse_bytes(value))
        except (ValueError, TypeError) as error:
            raise ArgumentValueError(
                f"{name}={value!r} is not a size in bytes (e.g. '256MiB', '1GB'): {error}"
            ) from None
        if nbytes < 1:
            raise ArgumentValueError(f"{name}={value!r} must be at least 1 byte")
        return nbytes
    if not _is_integer(value):
        raise ArgumentTypeError(
            f"{name} must be a number of bytes or a size string such as '256MiB', "
            f"got {value!r} of type {type(value).__name__}"
        )
    return positive_int(name, value)


#: ``shuffle_buffer_size`` that asks for the smallest buffer meeting ``shuffle_quality``.
AUTO = "auto"


def buffer_samples(value: object, row_bytes: int) -> int:
    """``shuffle_buffer_size`` in samples: an ``int`` is samples, a string bytes.

    A size string (``"256MiB"``, read by :func:`byte_size`) holds
    ``bytes // row_bytes`` samples (``row_bytes``: a sample's decoded bytes,
    summed over the stream's arrays), at least 1.  A plain ``int`` is a count
    of samples, as before sizes in bytes were accepted; a string without a unit
    (``"8"``) is refused rather than guessed.
    """
    if isinstance(value, str):
        if value.strip().replace(".", "", 1).isdigit():  # "8": samples or bytes?
            raise ArgumentTypeError(
                f"shuffle_buffer_size={value!r} has no unit: give samples as an int "
                f"({value.strip()}) or bytes with a unit ('{value.strip()}B', '256MiB')"
            )
        return max(1, byte_size("shuffle_buffer_size", value) // max(row_bytes, 1))
    if not _is_integer(value):
        raise ArgumentTypeError(
            "shuffle_buffer_size must be a number of samples (int) or a size in bytes "
            f"such as '256MiB' (str), got {value!r} of type {type(value).__name__}"
        )
    return positive_int("shuffle_buffer_size", value)


#: windows a sequential or buffered stream on a cluster keeps in flight per worker thread
#: by default: one being read, one waiting for the thread (issue 40)
CLUSTER_WINDOWS = 2


def default_prefetch(spec: Any, buffer: object) -> int:
    """``prefetch`` of a sequential or buffered stream when none is given.

    Locally ``DEFAULT_PREFETCH``.  On a cluster (``spec.client``) at least
    that, and enough that ``CLUSTER_WINDOWS`` windows per worker thread are
    in flight beside the one being consumed, as long as those windows hold
    at most ``DEFAULT_IO_BYTES``: with three windows in flight on two
    threads, each worker idled between finishing a window and the consumer
    asking for the next one (issue 40).  A window is ``spec.window_bytes``
    (sequential), the shuffle buffer ``buffer``, or for ``"auto"`` the
    largest buffer its memory budget allows.
    """
    client = spec.client
    if client is None:
        return DEFAULT_PREFETCH
    try:
        threads = sum(client.nthreads().values())
    except Exception:  # a closed client: its first window says so (WindowError)
        return DEFAULT_PREFETCH
    if spec.shuffle == "none":
        window = spec.window_bytes
    elif isinstance(buffer, int | str) and buffer != AUTO:
        window = buffer_samples(buffer, spec.row_bytes) * spec.row_bytes
    else:
        window = spec.memory_budget // (DEFAULT_PREFETCH + 1)
    fits = DEFAULT_IO_BYTES // max(window, 1)
    return max(DEFAULT_PREFETCH, min(CLUSTER_WINDOWS * threads, fits))


def flag(name: str, value: object) -> bool:
    """Require a real ``bool`` so that ``ordered="no"`` is not silently true."""
    if not isinstance(value, bool):
        raise ArgumentTypeError(f"{name} must be True or False, got {value!r}")
    return value


def shuffle_mode(
    shuffle: object, shuffle_buffer_size: object, shuffle_quality: object = None
) -> ShuffleMode:
    """The mode of the public ``shuffle`` flag: exact unless a buffer size is given.

    The one place the flag becomes a mode (``plan_epoch``, ``Loader``, the
    shuffled constructors, ``patch_stream`` and ``bench``).  A buffer size
    without a shuffle is an error, and so is a ``shuffle_quality`` without
    ``shuffle_buffer_size="auto"`` (it would be ignored).
    """
    if shuffle_quality is not None and shuffle_buffer_size != AUTO:
        raise ArgumentValueError(
            f"shuffle_quality={shuffle_quality!r} sizes shuffle_buffer_size='auto' only "
            f"(got shuffle_buffer_size={shuffle_buffer_size!r})"
        )
    if not flag("shuffle", shuffle):
        if shuffle_buffer_size is not None:
            raise ArgumentValueError(
                f"shuffle_buffer_size={shuffle_buffer_size!r} needs shuffle=True"
            )
        return "none"
    return "exact" if shuffle_buffer_size is None else "buffer"


def as_array(value: object) -> object:
    """``value``, or the array a path or URL names (:func:`open_array` semantics).

    Every public entry point that takes an array passes it through here: a
    ``str`` or ``os.PathLike`` is opened with :func:`open_array` (a
    ``path=``-less store whose root is an array); anything else is returned
    as is, for :func:`as_source` to describe or refuse, but an anndata
    ``csr_matrix`` or categorical group, which becomes the array it encodes
    (``store.sparse``).
    """
    if isinstance(value, str | os.PathLike):
        return open_array(value)
    encoded = anndata_node(value)  # a zarr.Group of anndata's csr_matrix or categorical
    return value if encoded is None else encoded


class NotGiven:
    """A keyword's default in a signature, standing for ``value`` while it is not given.

    Equal to ``value`` and shown as it (``repr``, ``str``: signatures and the
    reference show the real default), yet told apart from the same value
    given explicitly (``isinstance(x, NotGiven)``): what lets ``read_options``
    refuse a flat read keyword given at its default beside a ``read=`` that
    holds another value.  Pickles as the same marker (``_not_given``).
    """

    __slots__ = ("name", "value")

    def __init__(self, name: str, value: object) -> None:
        self.name, self.value = name, value

    def __repr__(self) -> str:
        return repr(self.value)

    def __str__(self) -> str:
        return str(self.value)

    def __eq__(self, other: object) -> bool:
        return other is self or bool(other == self.value)

    def __hash__(self) -> int:
        return hash(self.value)

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return _not_given, (self.name,)


#: the markers made, by name (``_not_given``: one per keyword in a process)
_MARKERS: dict[str, NotGiven] = {}


def not_given(name: str, value: object) -> NotGiven:
    """The :class:`NotGiven` marker of keyword ``name`` (default ``value``), made once."""
    return _MARKERS.setdefault(name, NotGiven(name, value))


def _not_given(name: str) -> NotGiven:
    return _MARKERS[name]


def given_value(value: object) -> object:
    """``value``, or the default a :class:`NotGiven` marker stands for."""
    return value.value if isinstance(value, NotGiven) else value


def merged_io_concurrency(concurrency: object, io: object) -> object:
    """``io_concurrency``, or its former name ``concurrency``; both must agree.

    Without ``concurrency``, ``io`` as given (a :class:`NotGiven` marker stays
    one, for ``read_options`` to tell from a value given).
    """
    if concurrency is None:
        return io
    old = positive_int("concurrency", concurrency)
    new = io_concurrency(given_value(io))
    if old is not None and new is not None and old != new:
        raise ArgumentValueError(
            f"concurrency={old} and io_concurrency={new} disagree; concurrency is the "
            "former name of io_concurrency: pass io_concurrency only"
        )
    return new if new is not None else old


def _quality_target(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ArgumentTypeError(
            f"shuffle_quality must be a number in (0, 1], got {value!r} of type "
            f"{type(value).__name__}"
        )
    if not 0 < float(value) <= 1:
        raise ArgumentValueError(
            f"shuffle_quality must be in (0, 1] (a fraction of an exact shuffle's "
            f"batch mixing), got {value!r}"
        )
    return float(value)
