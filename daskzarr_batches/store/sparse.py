"""Sparse rows: anndata's CSR matrices on Zarr as a source of samples (cells).

anndata writes a sparse matrix as a group with the attributes
``encoding-type: csr_matrix`` and ``shape``, and three 1-D arrays: ``data``
(the non-zeros), ``indices`` (their columns) and ``indptr`` (where each row's
non-zeros start).  :class:`CsrSource` is such a group as a source whose
samples are its rows: ``indptr`` (small) is read once, and its axis-0
"chunks" are runs of rows whose non-zeros cover :data:`UNIT_CHUNKS` whole
stored chunks of ``data`` (a run ends at the first row that starts in the
next group of chunks), so the plan, ranks, resume and shuffles take them as
any array's chunks, and a window reads each stored chunk of ``data`` and
``indices`` it needs once (a row across a run's last chunk boundary makes
that chunk read by two runs: at most ``1 / UNIT_CHUNKS`` more).  A window's
rows come out as a ``scipy.sparse.csr_matrix`` (:func:`gather_rows`).

An anndata categorical column (``encoding-type: categorical``: ``codes``
and ``categories``) is opened as its codes, its categories beside
(:func:`categorical_codes`, :class:`Categories`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zarr

from ..errors import CorruptChunkError, InvalidMetadataError
from .pipelines import resolve_codec_pipeline, with_codec_pipeline
from .sources import Source, SourceLike, as_source

__all__ = [
    "UNIT_CHUNKS",
    "CategoricalArray",
    "CsrArray",
    "CsrSource",
    "anndata_node",
    "categorical_codes",
    "csr_source",
    "encoding_type",
    "gather_rows",
    "unit_bounds",
]

#: Stored chunks of ``data`` per axis-0 unit of a CSR source: a row across a unit's last
#: chunk boundary makes that chunk read twice, so an epoch reads at most 1 / UNIT_CHUNKS
#: more than its data (about 1.04).
UNIT_CHUNKS = 24


def encoding_type(node: Any) -> str | None:
    """anndata's ``encoding-type`` attribute of a Zarr group (``None``: not a group, or none)."""
    if not isinstance(node, zarr.Group):
        return None
    value = node.attrs.get("encoding-type")
    return value if isinstance(value, str) else None


@dataclass(frozen=True)
class CsrSource(Source):
    """An anndata CSR group as a source of rows.

    ``indptr`` is read once (int64); ``unit`` is ``data``'s stored chunk length
    (elements).  The axis-0 chunks are :func:`unit_bounds` of ``indptr``.
    """

    data: Any = field(repr=False, compare=False, default=None)
    indices: Any = field(repr=False, compare=False, default=None)
    indptr: np.ndarray = field(repr=False, compare=False, default=None)  # type: ignore[arg-type]
    token: str = field(repr=False, default="")

    @property
    def nnz(self) -> int:
        """The stored non-zeros."""
        return int(self.indptr[-1])

    @property
    def row_bytes(self) -> int:
        """Stored bytes of an average row (its non-zeros and their columns), at least 1.

        What sizes a window: the decoded bytes a row costs, not a dense row's.
        """
        rows = max(self.n_samples, 1)
        per_value = np.dtype(self.data.dtype).itemsize + np.dtype(self.indices.dtype).itemsize
        return max(1, -(-self.nnz * per_value // rows))

    @property
    def sparse(self) -> bool:
        """Whether a window of this source is a ``scipy.sparse`` matrix of its rows."""
        return True

    @property
    def meta(self) -> Any:
        """An empty CSR matrix (a dask array's ``meta``)."""
        return self.empty_rows()

    def empty_rows(self) -> Any:
        """No rows, as a CSR matrix of the columns."""
        import scipy.sparse

        return scipy.sparse.csr_matrix((0, self.shape[1]), dtype=self.dtype)

    def unit_of(self, array: Any) -> int:
        """The stored chunk length (elements) of ``data`` or ``indices``."""
        return int(array.chunks[0])


def unit_bounds(indptr: np.ndarray, unit: int, chunks_per_unit: int | None = None) -> np.ndarray:
    """Where each axis-0 unit of rows starts, and the end: ascending, first 0, last ``n``.

    A unit holds the rows whose first non-zero lies in one group of
    ``chunks_per_unit`` stored chunks of ``unit`` elements; empty rows go with
    the rows after them.  A row spanning many groups makes one unit of its own.
    """
    n = len(indptr) - 1
    if n <= 0:
        return np.zeros(1 if n < 0 else 2, dtype=np.int64)[: max(n, 0) + 1]
    step = unit * (UNIT_CHUNKS if chunks_per_unit is None else chunks_per_unit)
    marks = np.arange(step, int(indptr[-1]), step, dtype=np.int64)
    # the first row starting at or after each mark (empty rows at a mark join the next)
    bounds = np.searchsorted(indptr[:-1], marks, side="left")
    bounds = np.unique(np.concatenate([[0], bounds, [n]]))
    return bounds.astype(np.int64)


def csr_source(group: zarr.Group, codec_pipeline: Any = None) -> CsrSource:
    """``group`` (anndata's ``csr_matrix`` encoding) as a :class:`CsrSource`.

    ``codec_pipeline``: what decodes ``data`` and ``indices``, as
    :func:`~daskzarr_batches.open_array` takes it (``None``: the environment
    variable, else ``"auto"``).

    Raises
    ------
    InvalidMetadataError
        The group is another sparse encoding (CSC: its arrays run along
        columns, not cells), lacks ``data``, ``indices`` or ``indptr`` or
        its ``shape``, or its ``indptr`` does not start at 0, is not
        monotone, or does not end at ``len(data)``; the message names the
        group.
    """
    name = str(group.store_path)
    role = f"group {name!r}"
    kind = encoding_type(group)
    if kind == "csc_matrix":
        raise InvalidMetadataError(
            f"{role} is a CSC matrix (encoding-type csc_matrix): its non-zeros are "
            "stored column by column, so a row would read every stored chunk; write it as CSR "
            "(anndata: adata.X = adata.X.tocsr(), then write_zarr)"
        )
    if kind != "csr_matrix":
        raise InvalidMetadataError(
            f"{role} is a group with encoding-type {kind!r}, not a csr_matrix"
        )
    arrays = {}
    for part in ("data", "indices", "indptr"):
        node = group.get(part)
        if not isinstance(node, zarr.Array) or node.ndim != 1:
            raise InvalidMetadataError(
                f"{role} is a csr_matrix group without a 1-D array {part!r} "
                f"(it holds {sorted(group.keys())})"
            )
        arrays[part] = node
    shape = _shape_of(group, role, name)
    indptr = np.asarray(arrays["indptr"][:], dtype=np.int64)
    _check_indptr(indptr, shape, arrays["data"].shape[0], arrays["indices"].shape[0], role, name)
    # read as open_array reads an array: zarrs' pipeline when installed ("auto")
    choice = resolve_codec_pipeline(codec_pipeline)
    data, indices = (with_codec_pipeline(arrays[part], choice) for part in ("data", "indices"))
    bounds = unit_bounds(indptr, int(data.chunks[0]))
    chunks = (tuple(np.diff(bounds).tolist()), (shape[1],))
    dtype = np.dtype(data.dtype)
    token = f"{id(group):x}-{os.urandom(4).hex()}"
    return CsrSource(name, shape, dtype, chunks, data, indices, indptr, token)


def _shape_of(group: zarr.Group, role: str, name: str) -> tuple[int, int]:
    shape: Any = group.attrs.get("shape")
    if (
        not isinstance(shape, list | tuple)
        or len(shape) != 2
        or not all(isinstance(s, int) and s >= 0 for s in shape)
    ):
        raise InvalidMetadataError(
            f"{role} is a csr_matrix group whose 'shape' attribute is {shape!r}, "
            "not two non-negative integers"
        )
    return int(shape[0]), int(shape[1])


def _check_indptr(
    indptr: np.ndarray, shape: tuple[int, int], nnz: int, n_indices: int, role: str, name: str
) -> None:
    where = role
    if len(indptr) != shape[0] + 1:
        raise InvalidMetadataError(
            f"{where}: indptr has {len(indptr)} entries for shape {shape}; a csr_matrix's "
            f"indptr has one per row and one more ({shape[0] + 1})"
        )
    if n_indices != nnz:
        raise InvalidMetadataError(f"{where}: data has {nnz} values but indices {n_indices}")
    if indptr[0] != 0 or indptr[-1] != nnz:
        raise InvalidMetadataError(
            f"{where}: indptr runs from {indptr[0]} to {indptr[-1]}, but must run from 0 to "
            f"len(data) = {nnz}"
        )
    steps = np.diff(indptr)
    if len(steps) and steps.min() < 0:
        row = int(np.argmax(steps < 0))
        raise InvalidMetadataError(
            f"{where}: indptr is not monotone: row {row} starts at {indptr[row]} and ends at "
            f"{indptr[row + 1]}"
        )


def needed_chunks(source: CsrSource, rows: np.ndarray, unit: int) -> np.ndarray:
    """The stored chunks (of ``unit`` elements) holding the non-zeros of ``rows``, ascending."""
    starts, ends = source.indptr[rows], source.indptr[rows + 1]
    full = ends > starts
    first, last = starts[full] // unit, (ends[full] - 1) // unit
    if not len(first):
        return np.empty(0, dtype=np.int64)
    counts = last - first + 1
    # every chunk first..last of every row: a run per row, made without a Python loop
    base = np.repeat(first - np.concatenate([[0], np.cumsum(counts)[:-1]]), counts)
    return np.unique(base + np.arange(int(counts.sum())))


def chunk_runs(chunks: np.ndarray) -> list[tuple[int, int]]:
    """``chunks`` (ascending) as runs ``(first, end)`` of consecutive chunks."""
    if not len(chunks):
        return []
    breaks = np.flatnonzero(np.diff(chunks) != 1) + 1
    firsts = chunks[np.concatenate([[0], breaks])]
    lasts = chunks[np.concatenate([breaks - 1, [len(chunks) - 1]])]
    return [(int(a), int(b) + 1) for a, b in zip(firsts, lasts, strict=True)]


#: A part's decoded chunks: the values of its runs one after another, where each run
#: starts in the array (ascending) and where it starts among the values.
Decoded = tuple[np.ndarray, np.ndarray, np.ndarray]


def gather_rows(source: CsrSource, rows: np.ndarray, parts: dict[str, Decoded]) -> Any:
    """``rows`` (global ids, in the order wanted) as a ``scipy.sparse.csr_matrix``.

    ``parts[name]`` (``"data"``, ``"indices"``): the decoded chunks the rows
    need (:data:`Decoded`).  A row's non-zeros lie in one run (its chunks are
    consecutive and all decoded).

    Raises
    ------
    CorruptChunkError
        A column index is negative or not below the matrix's column count.
    """
    import scipy.sparse

    starts, ends = source.indptr[rows], source.indptr[rows + 1]
    lengths = ends - starts
    indptr = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lengths, out=indptr[1:])
    total = int(indptr[-1])
    gathered = {}
    # runs of consecutive rows (a sequential window: one; a buffered one: its units) are
    # contiguous non-zeros, copied as slices; scattered rows (exact) are gathered by index
    breaks = np.flatnonzero(np.diff(rows) != 1) + 1
    firsts = np.concatenate([[0], breaks]).astype(np.int64)
    ends = np.concatenate([breaks, [len(rows)]]).astype(np.int64)
    by_runs = len(rows) > 0 and len(firsts) * 16 <= len(rows)
    for part, (values, run_starts, run_at) in parts.items():
        run = np.maximum(np.searchsorted(run_starts, starts, side="right") - 1, 0)
        shift = run_at[run] - run_starts[run] if len(run_starts) else np.zeros_like(starts)
        at = starts + shift  # where each row's non-zeros start in ``values``
        if by_runs:
            spans = zip(at[firsts], indptr[ends] - indptr[firsts], strict=True)
            pieces = [values[a : a + n] for a, n in spans]
            gathered[part] = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
        else:
            where = np.repeat(at - indptr[:-1], lengths) + np.arange(total)
            gathered[part] = values[where]
    columns = gathered["indices"]
    _check_columns(source, columns)
    index_dtype = np.int32 if max(total, source.shape[1]) < 2**31 else np.int64
    return scipy.sparse.csr_matrix(
        (gathered["data"], columns.astype(index_dtype, copy=False), indptr.astype(index_dtype)),
        shape=(len(rows), source.shape[1]),
    )


def _check_columns(source: CsrSource, columns: np.ndarray) -> None:
    if not len(columns):
        return
    low, high = columns.min(), columns.max()
    if low < 0 or high >= source.shape[1]:
        bad = int(high) if high >= source.shape[1] else int(low)
        raise CorruptChunkError(
            f"{source.name}: the csr_matrix's indices hold column {bad}, outside its "
            f"{source.shape[1]} columns (shape {source.shape}); the group's indices do not "
            "match its shape"
        )


def categorical_codes(group: zarr.Group, name: str) -> tuple[zarr.Array, np.ndarray]:
    """An anndata categorical column's ``codes`` array and its ``categories``.

    Raises
    ------
    InvalidMetadataError
        ``codes`` or ``categories`` is missing or not 1-D.
    """
    arrays = []
    for part in ("codes", "categories"):
        node = group.get(part)
        if not isinstance(node, zarr.Array) or node.ndim != 1:
            raise InvalidMetadataError(
                f"{name} is a categorical column (encoding-type categorical) without a 1-D "
                f"array {part!r} (it holds {sorted(group.keys())})"
            )
        arrays.append(node)
    codes, categories = arrays
    return codes, np.asarray(categories[:])


class CsrArray(SourceLike):
    """An anndata ``csr_matrix`` group opened as an array of rows (cells x genes).

    What [`open_array`][daskzarr_batches.open_array] returns for such a
    group, and what every entry point makes of a ``zarr.Group`` with
    ``encoding-type: csr_matrix`` (annbatch's ``write_sharded`` layout, or
    ``AnnData.write_zarr``'s): batches of its rows are
    ``scipy.sparse.csr_matrix`` of shape ``(batch, genes)``, in the stream's
    order; densify them in a ``transform`` (``rows.toarray()``).  ``indptr``
    is read once, when it is opened, and checked.

    Parameters
    ----------
    group : zarr.Group
        The ``csr_matrix`` group (``data``, ``indices``, ``indptr``, a
        ``shape`` attribute).
    codec_pipeline : {"auto", "zarrs", "zarr"}, optional
        What decodes ``data`` and ``indices``, as ``open_array`` takes it.

    Raises
    ------
    InvalidMetadataError
        A CSC matrix, a group without ``data``, ``indices`` or ``indptr``, or
        an ``indptr`` that is not monotone or does not match ``shape`` and
        ``data``; the message names the group.
    """

    __slots__ = ("_source", "group")

    def __init__(self, group: zarr.Group, codec_pipeline: Any = None) -> None:
        self.group = group
        self._source = csr_source(group, codec_pipeline)

    @property
    def shape(self) -> tuple[int, ...]:
        """``(cells, genes)``: the group's ``shape`` attribute."""
        return self._source.shape

    @property
    def dtype(self) -> np.dtype[Any]:
        """The non-zeros' dtype (``data``'s)."""
        return self._source.dtype

    @property
    def ndim(self) -> int:
        """2."""
        return 2

    @property
    def nnz(self) -> int:
        """The stored non-zeros."""
        return self._source.nnz

    @property
    def chunks(self) -> tuple[tuple[int, ...], ...]:
        """The units of rows a stream plans with, dask style.

        Each holds the rows whose first non-zero lies in one group of 24
        stored chunks of ``data``, so a window reads each stored chunk once.
        """
        return self._source.chunks

    def __len__(self) -> int:
        return self.shape[0]

    def describe(self, role: str) -> Source:
        """The source streams read the rows through."""
        return self._source

    def to_dask(self) -> Any:
        """The rows as a dask array of ``scipy.sparse.csr_matrix`` blocks, one per unit.

        Returns
        -------
        dask.array.Array
            Chunks ``chunks``; ``meta`` an empty CSR matrix, so ``compute()``
            gives one CSR matrix of the rows.  Each block reads its rows'
            non-zeros with one slice of ``data`` and of ``indices``.
        """
        import dask.array as da
        from dask.highlevelgraph import HighLevelGraph

        source = self._source
        name = f"csr-rows-{source.token}"
        bounds = np.concatenate([[0], np.cumsum(source.chunks[0])]).astype(np.int64)
        dsk: dict[Any, Any] = {
            (name, i, 0): (_block_rows, source, int(bounds[i]), int(bounds[i + 1]))
            for i in range(len(source.chunks[0]))
        }
        graph = HighLevelGraph.from_collections(name, dsk, dependencies=())
        return da.Array(graph, name, source.chunks, meta=source.meta)

    def __repr__(self) -> str:
        source = self._source
        return f"CsrArray({source.name!r}, shape={self.shape}, nnz={self.nnz}, dtype={self.dtype})"


def _block_rows(source: CsrSource, start: int, stop: int) -> Any:
    """Rows ``start:stop`` of ``source`` as a CSR matrix (a block of :meth:`CsrArray.to_dask`).

    One slice of ``data`` and of ``indices`` (the rows' non-zeros are contiguous).
    """
    lo, hi = int(source.indptr[start]), int(source.indptr[stop])
    parts: dict[str, Decoded] = {}
    for part, array in (("data", source.data), ("indices", source.indices)):
        parts[part] = (np.asarray(array[lo:hi]), np.array([lo]), np.array([0]))
    return gather_rows(source, np.arange(start, stop, dtype=np.int64), parts)


class CategoricalArray(SourceLike):
    """An anndata categorical column (``obs/<name>``) opened as its integer codes.

    What [`open_array`][daskzarr_batches.open_array] returns for a group with
    ``encoding-type: categorical``; usable as labels wherever an array is
    (paired streams, ``Loader(labels=...)``, ``ClassSampler(np.asarray(column))``).
    ``categories[code]`` is a code's category (code ``-1``: missing).

    Parameters
    ----------
    group : zarr.Group
        The column's group (``codes``, ``categories``).

    Attributes
    ----------
    codes : zarr.Array
        One integer code per row.
    categories : numpy.ndarray
        The categories, in code order.
    """

    __slots__ = ("categories", "codes")

    def __init__(self, group: zarr.Group) -> None:
        self.codes, self.categories = categorical_codes(group, str(group.store_path))

    @property
    def shape(self) -> tuple[int, ...]:
        """``(rows,)``."""
        return tuple(self.codes.shape)

    @property
    def dtype(self) -> np.dtype[Any]:
        """The codes' dtype."""
        return np.dtype(self.codes.dtype)

    def __len__(self) -> int:
        return self.shape[0]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        codes = np.asarray(self.codes[:])
        return codes if dtype is None else codes.astype(dtype)

    def describe(self, role: str) -> Source:
        """The codes' source."""
        return as_source(self.codes, role)

    def __repr__(self) -> str:
        return (
            f"CategoricalArray({str(self.codes.store_path)!r}, shape={self.shape}, "
            f"{len(self.categories)} categories)"
        )


def anndata_node(node: Any, codec_pipeline: Any = None) -> CsrArray | CategoricalArray | None:
    """``node`` as the array it encodes, if it is an anndata sparse or categorical group.

    Raises
    ------
    InvalidMetadataError
        A sparse group that cannot be read as rows (see :func:`csr_source`).
    """
    kind = encoding_type(node)
    if kind in ("csr_matrix", "csc_matrix"):
        return CsrArray(node, codec_pipeline)
    if kind == "categorical":
        return CategoricalArray(node)
    return None
