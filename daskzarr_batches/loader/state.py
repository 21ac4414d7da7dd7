"""A Loader's state: what it records (``_state_at``), and the checks a state passes
before it is applied.

Every field is checked (type, range, consistency with the loader's data and
order, the rank and the worker part); a bad one raises a library error naming
it.  Only the current version (3) is read: 0.1 was never released with another, and a
state of any other version is refused with an error that says so (version 2 by the
order it was saved under: the buffered order changed in version 3, so a buffered
state's position would be applied to another order; sequential and exact states of
version 2 are read, their orders are unchanged).
"""

from __future__ import annotations

import reprlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..errors import (
    ArgumentTypeError,
    ArgumentValueError,
)
from ..plan.batching import (
    Ranges,
    count_batches,
)
from ..plan.index_shuffle import ORDER_VERSION

if TYPE_CHECKING:  # the loader imports this module
    from .epochs import Loader


def _size(ranges: Ranges) -> int:
    return sum(stop - start for start, stop in ranges)


_IDENTITY = (
    "seed",
    "n_samples",
    "batch_size",
    "shuffle",
    "shuffle_buffer_size",
    "window_rows",
    "even_batches",
    "drop_remainder",
)


_PROGRESS = ("version", "epoch", "batches", "rank", "world_size", "resumed")


#: the version ``Loader.state_dict()`` writes (``epochs.STATE_VERSION``), the only one read
_VERSION = 3

#: The orders (``shuffle`` modes) each older version saved states under that changed
#: since: a state of that version and order is refused (its position would be applied to
#: another order); of another order it is read as the current version.  Version 3:
#: buffered windows are balanced (issue 35), so a buffered order of a seed differs.
_CHANGED_ORDERS: dict[int, tuple[str, ...]] = {2: ("buffer",)}
_FIELDS = {*_PROGRESS, *_IDENTITY, "position", "worker", "on_error", "order"}
#: fields a state may lack: ``order`` (the exact order's version) came after version 2
_OPTIONAL = {"order"}


def _check_order(state: Mapping[str, Any]) -> None:
    """``state['order']`` names this version's exact order, or the state is refused.

    A state saved before the field existed was of the exact order drawn by
    numpy's permutation (order 1): its positions name other samples in the
    keyed bijection's order (``ORDER_VERSION``), so an exact state without the
    field is refused; other shuffles' orders did not change with it.
    """
    order = state.get("order")
    if order is None and "order" not in state and state.get("shuffle") != "exact":
        return
    if order is None and "order" not in state:
        raise ArgumentValueError(
            "the Loader state has no 'order' field: it was saved by an earlier version, "
            "whose exact shuffle drew each epoch as numpy's permutation of (seed, epoch) "
            f"(order 1); this version's exact order is a keyed bijection (order "
            f"{ORDER_VERSION}), so the state's positions would name other samples. Restart "
            "the epoch (a fresh Loader, or set_epoch), or resume with the version that "
            "saved it"
        )
    if type(order) is not int or order != ORDER_VERSION:
        raise ArgumentValueError(
            f"state['order']={reprlib.repr(order)}: a state of another exact order than this "
            f"version's ({ORDER_VERSION}, the keyed bijection); restart the epoch"
        )


def _state_at(loader: Loader, progress: tuple[Any, ...]) -> dict[str, Any]:
    """``loader.state_dict()`` as it was at ``progress`` (``Loader._progress()``)."""
    epoch, batches, position, resumed, base = progress
    part = loader._part
    return {
        "version": _VERSION,
        "order": ORDER_VERSION,
        "epoch": epoch,
        "batches": batches,
        "position": position,
        "rank": loader.rank,
        "world_size": loader.world_size,
        "worker": None if part is None else [*part, base],
        "resumed": None if resumed is None else [list(r) for r in resumed],
        "on_error": loader.spec.on_error,
        **loader._identity(),
    }


def _validated_states(state: Any, loader: Loader) -> list[dict[str, Any]]:
    """The states of ``state`` (one or a list), each checked field by field."""
    if isinstance(state, Mapping):
        states = [state]
    elif isinstance(state, list | tuple) and state and all(isinstance(s, Mapping) for s in state):
        states = list(state)
    else:
        raise ArgumentTypeError(
            "state must be a Loader state (a dict from state_dict()) or a list of them, got "
            f"{reprlib.repr(state)}"
        )
    out = [_validated(one, loader) for one in states]
    for key in ("epoch", "world_size", "resumed", "on_error", "worker"):
        values = {repr(one[key]) for one in out}
        if len(values) > 1:
            raise ArgumentValueError(f"the states disagree on {key!r}: {sorted(values)}")
    ranks = [one["rank"] for one in out]
    if len(set(ranks)) != len(ranks):
        raise ArgumentValueError(f"the states repeat a rank: {ranks}")
    return out


def _validated(state: Mapping[str, Any], loader: Loader) -> dict[str, Any]:
    """One state's fields, each checked (type, range, this loader's order), or raise."""
    version = state.get("version")
    changed = _CHANGED_ORDERS.get(version) if type(version) is int else None
    if changed is not None and loader.spec.shuffle in changed:
        raise ArgumentValueError(
            f"state['version']={version}: a Loader state saved under the {loader.spec.shuffle} "
            f"order of version {version}, which version {_VERSION} changed (a buffered epoch's "
            "windows are balanced now), so its position would resume a different order and "
            "repeat or skip samples; restart the epoch, or save the state again with this version"
        )
    if changed is not None:
        version = _VERSION  # an order that did not change: the state reads as the current one
    if type(version) is int and 0 < version < _VERSION:
        raise ArgumentValueError(
            f"state['version']={version}: a Loader state of an older format, which this "
            f"version does not read (it reads version {_VERSION}, what state_dict() "
            "writes); save the state again with this version, or restart the epoch"
        )
    if type(version) is not int or version != _VERSION:
        raise ArgumentValueError(
            f"state['version']={reprlib.repr(version)}: not a Loader state (version {_VERSION})"
        )
    fields = _FIELDS
    lacking = sorted(fields - _OPTIONAL - set(state))
    if lacking:
        raise ArgumentValueError(f"the Loader state lacks the field(s) {lacking}")
    unknown = sorted(map(str, set(state) - fields))
    if unknown:
        raise ArgumentValueError(f"the Loader state has unknown field(s) {unknown}")
    _check_order(state)
    mine = loader._identity()
    # an exact or sequential order does not depend on its windows (an exact window
    # is smaller on a cluster for collections, whose join holds it twice)
    keys = (
        _IDENTITY
        if mine["shuffle"] == "buffer"
        else tuple(k for k in _IDENTITY if k != "window_rows")
    )
    differ = [
        f"{key}={reprlib.repr(state[key])} (here {mine[key]!r})"
        for key in keys
        if type(state[key]) is not type(mine[key]) or state[key] != mine[key]
    ]
    if differ:
        raise ArgumentValueError(
            "the state is of a loader with another order or data: " + ", ".join(differ)
        )
    out: dict[str, Any] = {key: _count(state, key) for key in ("epoch", "batches", "rank")}
    out["world_size"] = _count(state, "world_size", 1)
    if out["rank"] >= out["world_size"]:
        raise ArgumentValueError(
            f"state['rank']={out['rank']} is not below state['world_size']={out['world_size']}"
        )
    out["resumed"] = _ranges(state["resumed"], loader.spec.n_samples)
    out["position"] = _count(state, "position")
    out["worker"] = state["worker"]
    out["on_error"] = state["on_error"]
    if out["on_error"] not in ("raise", "skip"):
        raise ArgumentValueError(
            f"state['on_error']={reprlib.repr(out['on_error'])} is not 'raise' or 'skip'"
        )
    out["base"] = _worker(out["worker"], loader)
    return out


def _count(state: Mapping[str, Any], key: str, least: int = 0) -> int:
    value = state[key]
    if type(value) is not int:
        raise ArgumentTypeError(f"state[{key!r}] must be an integer, got {reprlib.repr(value)}")
    if value < least:
        raise ArgumentValueError(f"state[{key!r}] must be >= {least}, got {value}")
    return value


def _ranges(value: Any, n: int) -> Ranges | None:
    """``state['resumed']``: ``None``, or ascending, disjoint ``[start, stop]`` pairs in [0, n]."""
    if value is None:
        return None
    bad = ArgumentValueError(
        f"state['resumed'] must be None or a list of ascending, disjoint [start, stop] "
        f"pairs of positions in 0..{n}, got {reprlib.repr(value)}"
    )
    if not isinstance(value, list | tuple):
        raise bad
    out: Ranges = []
    at = 0
    for pair in value:
        if (
            not isinstance(pair, list | tuple)
            or len(pair) != 2
            or not all(type(v) is int for v in pair)
            or not at <= pair[0] < pair[1] <= n
        ):
            raise bad
        out.append((pair[0], pair[1]))
        at = pair[1]
    return out


def _worker(value: Any, loader: Loader) -> int:
    """``state['worker']`` checked against the loader's own part; its base position."""
    part = loader._part
    if value is None and part is None:
        return 0
    if (
        not isinstance(value, list | tuple)
        or len(value) != 3
        or not all(type(v) is int for v in value)
        or value[2] < 0
        or part is None
        or (value[0], value[1]) != part
    ):
        here = "not a worker's loader" if part is None else f"worker {part[0]} of {part[1]}"
        raise ArgumentValueError(
            f"state['worker']={reprlib.repr(value)} does not fit this loader ({here}); load "
            "a worker's state into loader.worker(worker, workers)"
        )
    return int(value[2])


def _check_progress(
    loader: Loader,
    batches: int,
    position: int,
    positions: Ranges,
    filled: bool,
    on_error: str = "skip",
) -> None:
    """``batches`` and ``position`` fit a share of ``positions`` (else raise, naming them).

    ``filled``: the share's stream fills skipped samples past its end (ranks).
    ``on_error``: the state's; with ``"raise"`` no sample was skipped, so the position
    is exactly where the batches yielded end.
    """
    total = _size(positions)
    size = loader.spec.batch_size
    length = count_batches(total, size, loader.drop_remainder)
    if batches > length:
        raise ArgumentValueError(
            f"state['batches']={batches} is more than the {length} batches of the "
            f"share's epoch ({total} samples)"
        )
    if position < min(batches * size, total):
        raise ArgumentValueError(
            f"state['position']={position} is behind the {batches} batch(es) of {size} "
            "samples yielded"
        )
    if position > total and not filled:
        raise ArgumentValueError(
            f"state['position']={position} is past the end of the share's {total} positions"
        )
    expected = min(batches * size, total)
    if on_error == "raise" and position != expected:
        raise ArgumentValueError(
            f"state['position']={position} does not fit state['batches']={batches}: with "
            f"state['on_error']='raise' no sample is skipped, so {batches} batch(es) of "
            f"{size} samples end at position {expected} (a corrupt or edited state?)"
        )


def _intersect(ranges: Ranges, within: list[tuple[int, int]]) -> Ranges:
    """The positions of ``ranges`` that lie in ``within``, in the order of ``within``."""
    out: Ranges = []
    for lo, hi in within:
        for start, stop in ranges:
            a, b = max(lo, start), min(hi, stop)
            if a < b:
                out.append((a, b))
    return out
