"""Collections: many arrays (or stores) as one dataset along the sample axis.

:func:`concat` joins arrays of the same trailing shape and dtype end to end
along axis 0; :func:`open_collection` opens many stores (a glob of local
paths or a list of URLs, their metadata read concurrently) and joins them.
A :class:`Collection` is a :class:`~daskzarr_batches.store.sources.SourceLike`:
streams read it through a :class:`ConcatSource`, whose axis-0 chunks are the
members' chunks one after another, so the plan, ranks and resume see one
array; the read layer splits a window's pieces per member and reads each
member in place with the reader it would use alone.  :class:`SourcesSource`
is the provenance output of ``return_sources=True``: computed from the
sample ids, never read.  Those sources (and a mixture's ``MixSource``) are
``store.joined``'s, exported here too.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import ArgumentTypeError, ArgumentValueError, renamed_keywords
from .joined import ConcatSource, MixSource, SourcesSource
from .joined import sources_source as sources_source  # imported from here (streams.spec)
from .open import open_array
from .sources import Source, SourceLike, as_source
from .threads import DaemonExecutor

__all__ = [
    "OPEN_THREADS",
    "Collection",
    "ConcatSource",
    "MixSource",
    "Mixture",
    "SourcesSource",
    "concat",
    "mix",
    "open_collection",
]

#: Threads that open a collection's stores at once (each waits on metadata reads).
OPEN_THREADS = 32


class Collection(SourceLike):
    """Arrays joined end to end along axis 0: one dataset of many arrays or stores.

    Made by [`concat`][daskzarr_batches.concat] and
    [`open_collection`][daskzarr_batches.open_collection]; pass it wherever an
    array is accepted (the batch stream constructors, [`Loader`][daskzarr_batches.Loader],
    [`plan_epoch`][daskzarr_batches.plan_epoch],
    [`count_batches`][daskzarr_batches.count_batches],
    [`chunk_stream`][daskzarr_batches.chunk_stream],
    [`map_chunks`][daskzarr_batches.map_chunks],
    [`reduce_chunks`][daskzarr_batches.reduce_chunks],
    [`feature_moments`][daskzarr_batches.feature_moments],
    [`chunk_split`][daskzarr_batches.chunk_split]).  Streams read each member in place: its own
    chunks
    are the collection's chunks, so windows mix chunks of different members,
    and each chunk is decoded once per window as for one array.

    Attributes
    ----------
    members : tuple
        The arrays, in order (paths opened; zero-length ones kept, so member
        indices are the positions given).
    lengths : tuple of int
        Each member's length along axis 0.
    offsets : tuple of int
        Where each member starts in the collection (``len(members) + 1``
        values, the last the total).
    shape, dtype, ndim
        Of the joined data.
    """

    __slots__ = ("_members", "_source", "names")

    def __init__(self, members: Sequence[Any], names: Sequence[str] | None = None) -> None:
        self._members = tuple(members)
        self.names = tuple(names) if names is not None else None
        self._source: ConcatSource | None = None

    members = property(lambda self: self._members, doc="The member arrays, in order.")

    def _concat(self, role: str) -> ConcatSource:
        if self._source is None:
            self._source = _concat_source(self._members, role, self.names)
        return self._source

    @property
    def lengths(self) -> tuple[int, ...]:
        """Each member's length along axis 0."""
        return tuple(member.n_samples for member in self._concat("collection").members)

    @property
    def offsets(self) -> tuple[int, ...]:
        """Where each member starts, and the total."""
        return tuple(int(v) for v in self._concat("collection").offsets)

    @property
    def shape(self) -> tuple[int, ...]:
        """The joined shape (the sum of lengths, then the members' trailing shape)."""
        return self._concat("collection").shape

    @property
    def dtype(self) -> np.dtype[Any]:
        """The members' dtype."""
        return self._concat("collection").dtype

    @property
    def ndim(self) -> int:
        """Dimensions of the joined data."""
        return len(self.shape)

    def __len__(self) -> int:
        return self.shape[0]

    def provenance(self, samples: Any) -> np.ndarray:
        """``(member, position within the member)`` of sample ids, an int64 ``(n, 2)`` array."""
        return self._concat("collection").provenance(np.asarray(samples))

    def describe(self, role: str) -> Source:
        """The `ConcatSource` streams read."""
        return self._concat(role)

    def __repr__(self) -> str:
        try:
            source = self._concat("collection")
        except Exception:  # a mismatch: still say what it holds
            return f"Collection({len(self._members)} members, not joinable)"
        return (
            f"Collection({len(self._members)} members, shape={source.shape}, dtype={source.dtype})"
        )


def _concat_source(members: Sequence[Any], role: str, names: Sequence[str] | None) -> ConcatSource:
    """The members as sources, checked: same trailing shape and dtype as the first."""
    if not members:
        raise ArgumentValueError(f"{role} is a collection of no arrays; concat needs at least one")
    sources = []
    for m, member in enumerate(members):
        label = f"member {m}" + (f" ({names[m]})" if names is not None else "")
        source = as_source(member, f"{role} {label}")
        if isinstance(source, ConcatSource):  # a collection inside a collection: flattened
            raise ArgumentTypeError(
                f"{role} {label} is itself a collection; pass its members "
                "(concat([*a.members, *b.members]))"
            )
        sources.append((label, source))
    first_label, first = sources[0]
    for label, source in sources[1:]:
        if source.shape[1:] != first.shape[1:]:
            raise ArgumentValueError(
                f"{role} {label} has trailing shape {source.shape[1:]} (shape {source.shape}), "
                f"but {first_label} has {first.shape[1:]} (shape {first.shape}); the members "
                "of a collection differ only in length along axis 0"
            )
        if source.dtype != first.dtype:
            raise ArgumentValueError(
                f"{role} {label} has dtype {source.dtype}, but {first_label} has "
                f"{first.dtype}; the members of a collection must share one dtype "
                "(cast them first, e.g. a dask array's .astype)"
            )
    parts = tuple(source for _, source in sources)
    total = sum(source.n_samples for source in parts)
    chunks0 = tuple(size for source in parts for size in source.chunks[0] if size > 0)
    nonempty = next((s for s in parts if s.n_samples > 0), parts[0])
    chunks = ((*chunks0,) if chunks0 else (0,), *nonempty.chunks[1:])
    name = f"collection of {len(parts)} ({parts[0].name}, ...)"
    if len(parts) == 1:
        name = f"collection of 1 ({parts[0].name})"
    return ConcatSource(name, (total, *first.shape[1:]), first.dtype, chunks, parts)


@renamed_keywords(datas="sources")
def concat(sources: Sequence[Any]) -> Any:
    """Many arrays or stores as one dataset along the sample axis (axis 0).

    Parameters
    ----------
    sources : sequence
        The members, in order: arrays (``zarr.Array``, ``dask.array.Array``,
        ``numpy.ndarray``, ``xarray.DataArray``, a path or URL), or each a
        dict or tuple of such arrays (paired data per source, e.g.
        ``{"x": x1, "y": y1}``), as [`mix`][daskzarr_batches.mix]'s ``sources``
        (the former name ``datas=`` still works, with a
        ``DeprecationWarning``).  Lengths and chunkings may differ; the
        trailing shape and dtype must match across members (per name).

    Returns
    -------
    Collection, or a dict / tuple of Collection
        One [`Collection`][daskzarr_batches.Collection] for arrays; for dicts, a dict of one
        collection per name (what [`Loader`][daskzarr_batches.Loader] takes for dict batches);
        for tuples, a tuple of collections (``paired_batch_stream(*pairs, ...)``).

    Raises
    ------
    ArgumentValueError
        No members; a trailing shape, dtype or (paired) length that does not
        match: the message names the first mismatching member and value.
    ArgumentTypeError
        Members of different kinds (an array beside a dict), dicts with
        different names, or a member that is not an array.
    """
    if isinstance(sources, str | os.PathLike | Mapping) or not isinstance(sources, Sequence):
        raise ArgumentTypeError(
            f"concat takes a list or tuple of arrays (or of dicts / tuples of arrays), "
            f"got {type(sources).__name__}"
        )
    members = [open_member(data) for data in sources]
    if not members:
        raise ArgumentValueError("concat needs at least one array, got an empty sequence")
    first = members[0]
    if isinstance(first, Mapping):
        names = list(first)
        for m, member in enumerate(members):
            if not isinstance(member, Mapping) or list(member) != names:
                got = list(member) if isinstance(member, Mapping) else type(member).__name__
                raise ArgumentTypeError(
                    f"member {m} is {got!r}, but member 0 is a dict of {names!r}; every member "
                    "of a paired collection has the same names, in the same order"
                )
        _check_paired(members, names)
        return {name: _checked([member[name] for member in members], repr(name)) for name in names}
    if isinstance(first, tuple | list):
        width = len(first)
        for m, member in enumerate(members):
            if not isinstance(member, tuple | list) or len(member) != width:
                raise ArgumentTypeError(
                    f"member {m} is not a tuple of {width} arrays like member 0; every member "
                    "of a paired collection holds the same number of arrays"
                )
        _check_paired(members, list(range(width)))
        return tuple(_checked([member[i] for member in members], f"[{i}]") for i in range(width))
    for m, member in enumerate(members):
        if isinstance(member, Mapping | tuple | list):
            raise ArgumentTypeError(
                f"member {m} is a {type(member).__name__} but member 0 is an array; a "
                "collection's members are all arrays or all dicts / tuples of arrays"
            )
    return _checked(members, "")


def _checked(members: Sequence[Any], which: str) -> Collection:
    """A collection of ``members``, its mismatches raised now (``which``: the name, if paired)."""
    collection = Collection(members)
    collection.describe(f"collection{which and ' ' + which}")
    return collection


def open_member(data: Any) -> Any:
    """A member with every path opened."""
    if isinstance(data, Mapping):
        return {key: open_member(value) for key, value in data.items()}
    if isinstance(data, tuple | list):
        return tuple(open_member(value) for value in data)
    if isinstance(data, str | os.PathLike):
        return open_array(data)
    return data


def _check_paired(members: Sequence[Any], keys: Sequence[Any]) -> None:
    """Each member's arrays have one length (pairs stay aligned across members)."""
    for m, member in enumerate(members):
        lengths = {key: as_source(member[key], f"member {m} {key!r}").n_samples for key in keys}
        if len(set(lengths.values())) > 1:
            described = ", ".join(f"{key!r} has {n}" for key, n in lengths.items())
            raise ArgumentValueError(
                f"member {m}'s arrays differ in length ({described}); paired arrays of one "
                "member must have the same length"
            )


def _label(path: Any) -> str:
    """How errors name a member given as ``path`` (a path, URL or store object)."""
    return os.fspath(path) if isinstance(path, str | os.PathLike) else repr(path)


@renamed_keywords(array_path="path", threads="io_concurrency")
def open_collection(
    urls_or_glob: str | os.PathLike[str] | Sequence[Any],
    path: str | None = None,
    *,
    storage_options: dict[str, Any] | None = None,
    codec_pipeline: str | None = None,
    io_concurrency: int = OPEN_THREADS,
) -> Collection:
    """Open many Zarr stores as one [`Collection`][daskzarr_batches.Collection] (their metadata
    read concurrently).

    Parameters
    ----------
    urls_or_glob : str, os.PathLike or sequence
        A glob of local paths (``"data/plate-*.zarr"``, sorted), or a list of
        paths / URLs (in the order given).
    path : str, optional
        The array inside each store (``None``: the store's root is the
        array), as ``open_array``'s ``path``.  Its former name
        ``array_path=`` still works, with a ``DeprecationWarning``.
    storage_options : dict, optional
        Passed to fsspec for URLs (credentials, endpoint, ...).
    codec_pipeline : {"auto", "zarrs", "zarr"}, optional
        As for [`open_array`][daskzarr_batches.open_array].
    io_concurrency : int, default 32
        Metadata reads in flight (``OPEN_THREADS``), as the streams'
        ``io_concurrency``: stores opened at once, each opening one read at a time.  Its former name
        ``threads=`` still works, with a ``DeprecationWarning``.

    Returns
    -------
    Collection

    Raises
    ------
    ArgumentValueError
        A glob that matches nothing, an empty list, or members that do not
        join (see [`concat`][daskzarr_batches.concat]).
    ArrayNotFoundError
        A store without the array (the first such member, as
        [`open_array`][daskzarr_batches.open_array] names it).
    """
    if isinstance(urls_or_glob, str | os.PathLike):
        pattern = os.fspath(urls_or_glob)
        paths: list[Any] = sorted(glob.glob(pattern))
        if not paths:
            raise ArgumentValueError(f"open_collection: the glob {pattern!r} matches no path")
    elif isinstance(urls_or_glob, Sequence):
        paths = list(urls_or_glob)
        if not paths:
            raise ArgumentValueError("open_collection: the list of stores is empty")
    else:
        raise ArgumentTypeError(
            f"open_collection takes a glob or a list of paths / URLs, got "
            f"{type(urls_or_glob).__name__}"
        )
    if isinstance(io_concurrency, bool) or not isinstance(io_concurrency, int):
        raise ArgumentTypeError(f"io_concurrency must be a positive int, got {io_concurrency!r}")
    if io_concurrency < 1:
        raise ArgumentValueError(f"io_concurrency must be a positive int, got {io_concurrency!r}")

    def one(member: Any) -> Any:
        return open_array(
            member, path, storage_options=storage_options,
            codec_pipeline=codec_pipeline,  # type: ignore[arg-type]
        )  # fmt: skip

    if len(paths) == 1:
        members = [one(paths[0])]
    else:
        pool = DaemonExecutor(min(io_concurrency, len(paths)), "dzb-open")  # a hung store: no join
        try:
            members = list(pool.map(one, paths))
        finally:
            pool.shutdown(wait=False)
    collection = Collection(members, names=[_label(member) for member in paths])
    collection.describe("collection")  # the mismatch errors now, naming the store
    return collection


class Mixture(Collection):
    """A seeded mixture of datasets by weight; made by [`mix`][daskzarr_batches.mix].

    A [`Collection`][daskzarr_batches.Collection] of its sources (``members``) whose epoch order
    draws from each source by its weight, each source in its own order.

    Attributes
    ----------
    weights : tuple of float
        The weights, normalised to sum to 1.
    stop : str
        ``"first_exhausted"``, ``"all_exhausted"`` or ``"never"``.
    samples_per_epoch : int or None
    seed : int
        Seed of the schedule (which source each draw takes).
    """

    __slots__ = ("samples_per_epoch", "seed", "stop", "weights")

    def __init__(
        self,
        members: Sequence[Any],
        weights: Sequence[float],
        stop: str,
        samples_per_epoch: int | None,
        seed: int,
    ) -> None:
        super().__init__(members)
        total = float(sum(weights))
        self.weights = tuple(float(w) / total for w in weights)
        self.stop = stop
        self.samples_per_epoch = samples_per_epoch
        self.seed = seed

    def _concat(self, role: str) -> ConcatSource:
        if self._source is None:
            joined = _concat_source(self._members, role, self.names)
            self._source = MixSource(
                f"mixture of {len(joined.members)}", joined.shape, joined.dtype,
                joined.chunks, joined.members, self.weights, self.stop,
                self.samples_per_epoch, self.seed,
            )  # fmt: skip
        return self._source

    @property
    def counts(self) -> tuple[int, ...]:
        """Samples drawn from each source per epoch (the stop rule's)."""
        from ..plan.mix import mix_counts

        return tuple(
            int(c)
            for c in mix_counts(self.lengths, self.weights, self.stop, self.samples_per_epoch)
        )

    def __len__(self) -> int:
        """Samples per epoch."""
        return sum(self.counts)

    def __repr__(self) -> str:
        weights = ", ".join(f"{w:.3g}" for w in self.weights)
        return (
            f"Mixture({len(self._members)} sources, weights=({weights}), stop={self.stop!r}, "
            f"samples per epoch={len(self)})"
        )


def mix(
    sources: Sequence[Any],
    weights: Sequence[float],
    *,
    seed: int = 0,
    samples_per_epoch: int | None = None,
    stop: str = "first_exhausted",
) -> Any:
    """A seeded mixture of datasets by weight, streamed as one dataset.

    Each epoch draws from source ``k`` a share ``weights[k]`` of its samples
    (to within a sample or two per source in every window), each source in
    the order its own stream would give (the stream's ``shuffle``: sequential,
    buffered or exact; seeded by `mix_seed`),
    the interleave drawn per ``(seed, epoch)``.  Pass the result wherever an
    array is accepted ([`Loader`][daskzarr_batches.Loader], the batch stream constructors,
    [`plan_epoch`][daskzarr_batches.plan_epoch]); ``return_sources=True`` gives each sample's source
    and position in it.

    Parameters
    ----------
    sources : sequence
        The datasets: arrays or stores (as [`concat`][daskzarr_batches.concat] takes them), or
        each a dict / tuple of paired arrays (then a dict / tuple of
        mixtures, drawn together, is returned).
    weights : sequence of float
        One positive weight per source (normalised).
    seed : int, default 0
        Seed of the interleave.
    samples_per_epoch : int, optional
        Samples per epoch: required for ``stop="never"``; a cap (a prefix
        of the epoch) for the other rules.
    stop : {"first_exhausted", "all_exhausted", "never"}, default "first_exhausted"
        ``"first_exhausted"``: the epoch ends when a source is used up (no
        sample twice).  ``"all_exhausted"``: when every source has been used
        once, the others cycled meanwhile.  ``"never"``: every source cycled,
        ``samples_per_epoch`` samples.

    Returns
    -------
    Mixture, or a dict / tuple of Mixture

    Raises
    ------
    ArgumentValueError, ArgumentTypeError
        Weights that do not match the sources or are not positive, an
        unknown ``stop``, ``"never"`` without ``samples_per_epoch``, an
        empty source, or sources that do not join ([`concat`][daskzarr_batches.concat]).

    Notes
    -----
    A mixture's epoch order is held whole, per draw: about 16 bytes a draw
    kept for the epoch (its sample id and source, int64) and about 40 bytes a
    draw while it is drawn (the schedule's times and their sort, each
    source's own order), so 10**8 draws hold 1.6 GB; unlike the exact
    shuffle of one dataset, whose order is computed window by window.
    """
    from ..plan.mix import STOP_RULES

    if isinstance(sources, str | os.PathLike | Mapping) or not isinstance(sources, Sequence):
        raise ArgumentTypeError(
            f"mix takes a list or tuple of datasets, got {type(sources).__name__}"
        )
    if any(isinstance(s, Collection) for s in sources):
        raise ArgumentTypeError(
            "a mixture's source is an array or a store; a collection as one source is not "
            "supported yet (mix its members, or concat them into one store)"
        )
    try:
        weights = [float(w) for w in weights]
    except (TypeError, ValueError):
        raise ArgumentTypeError(f"weights must be numbers, got {weights!r}") from None
    if len(weights) != len(sources):
        raise ArgumentValueError(
            f"{len(weights)} weights for {len(sources)} sources; give one weight per source"
        )
    if not all(np.isfinite(w) and w > 0 for w in weights):
        raise ArgumentValueError(f"weights must be finite and positive, got {weights!r}")
    if stop not in STOP_RULES:
        raise ArgumentValueError(f"stop must be one of {STOP_RULES}, got {stop!r}")
    if not isinstance(seed, int | np.integer) or isinstance(seed, bool) or seed < 0:
        raise ArgumentValueError(f"seed must be a non-negative int, got {seed!r}")
    if samples_per_epoch is not None and (
        not isinstance(samples_per_epoch, int | np.integer)
        or isinstance(samples_per_epoch, bool)
        or samples_per_epoch < 1
    ):
        raise ArgumentValueError(
            f"samples_per_epoch must be a positive int or None, got {samples_per_epoch!r}"
        )
    if stop == "never" and samples_per_epoch is None:
        raise ArgumentValueError(
            "stop='never' cycles every source, so it needs samples_per_epoch (the epoch's length)"
        )
    joined = concat(sources)

    def mixture(collection: Collection) -> Mixture:
        out = Mixture(collection.members, weights, stop, samples_per_epoch, int(seed))
        for k, n in enumerate(out.lengths):
            if n == 0:
                raise ArgumentValueError(f"source {k} of the mixture is empty (0 samples)")
        return out

    if isinstance(joined, dict):
        return {name: mixture(c) for name, c in joined.items()}
    if isinstance(joined, tuple):
        return tuple(mixture(c) for c in joined)
    return mixture(joined)
