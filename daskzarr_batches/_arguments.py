"""Validation of the scalar parameters every public function shares.

Each check returns the normalised value or raises an error that names the
parameter and shows the offending value.  Numpy integers are accepted wherever
an ``int`` is; ``bool`` is rejected even though it is an ``int`` subclass,
because ``batch_size=True`` is always a mistake.
"""

from __future__ import annotations

import numbers

from ._errors import ArgumentTypeError, ArgumentValueError


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


def non_negative_int(name: str, value: object) -> int:
    """Return ``value`` as an ``int`` >= 0, or raise naming ``name``."""
    return _integer(name, value, 0, "non-negative integer", ">= 0")


def optional_positive_int(name: str, value: object) -> int | None:
    """Like :func:`positive_int` but ``None`` passes through."""
    return None if value is None else positive_int(name, value)


def seed_value(value: object) -> int | None:
    """Validate a shuffle seed: ``None`` or a non-negative integer."""
    return None if value is None else non_negative_int("seed", value)


def optional_timeout(value: object) -> float | None:
    """Validate ``timeout``: ``None`` (wait forever) or seconds > 0."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ArgumentTypeError(f"timeout must be a number of seconds or None, got {value!r}")
    seconds = float(value)
    if not seconds > 0:
        raise ArgumentValueError(f"timeout must be > 0 seconds, got {value!r}")
    return seconds


def flag(name: str, value: object) -> bool:
    """Require a real ``bool`` so that ``ordered="no"`` is not silently true."""
    if not isinstance(value, bool):
        raise ArgumentTypeError(f"{name} must be True or False, got {value!r}")
    return value
