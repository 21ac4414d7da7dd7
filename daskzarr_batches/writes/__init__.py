"""Per-chunk jobs that write: ``map_to_zarr`` and ``write_shuffled``.

Both cut the output into *write units* along the sample axis: one output
shard (sharded output) or one row of output chunks (every chunk of those rows,
all trailing axes), so each stored object of the output is written by exactly
one task and workers never write the same object.  A task is the read graph
of the batch streams (:func:`~daskzarr_batches.read.graphs.window_graph`: the
read policy, collections, subsets, dask arrays, a ``distributed`` client)
plus one write task that applies ``func`` (``map_to_zarr``) and writes its
units, returning a small report; only that report travels to the caller.

**Resume.**  A unit is *complete* when every stored object of it exists in
every output array and its rows decode to the right shape; a file truncated
by a killed process does not decode and is written again.  Outputs are
written with ``write_empty_chunks=True``, so a chunk that is entirely fill
value is stored like any other and counts as complete by the same rule (no
manifest to keep in step).  So that a resume does not decode what is known
good, the caller keeps a manifest of the sizes of the objects of every unit a
task reported written (:class:`_Manifest`); a unit whose objects have the
recorded sizes is complete without decoding.  A resumed run computes only the incomplete units;
every unit is a pure function of the input and the fingerprint, so the result
is bit-identical to an uninterrupted run.  The stored objects of a unit that is
not complete are deleted before it is written: Zarr writes a shard by
read-modify-write, and a torn one would fail the write.  The fingerprint (the
job: ``job_id`` or ``func``'s qualified name, the seed of a shuffle; each
input's name, which for a Zarr array is its store and path, shape, dtype and a
fingerprint of its contents; without a ``job_id``, a fingerprint of ``func``:
:mod:`~daskzarr_batches.fingerprints`) is stored in the output's attributes
under ``"daskzarr_batches"``; a resume across a different one is refused with
:class:`ResumeMismatchError` naming what changed.
"""

# importable from here as when this package was one module
from .jobs import DEFAULT_WRITE_BUDGET as DEFAULT_WRITE_BUDGET
from .jobs import map_to_zarr, shuffle_order, write_shuffled
from .outputs import output_store as output_store
from .resume import FINGERPRINT_KEY as FINGERPRINT_KEY
from .resume import MANIFEST_NAME as MANIFEST_NAME
from .resume import MANIFEST_SECONDS as MANIFEST_SECONDS
from .tasks import WriteStats

__all__ = ["WriteStats", "map_to_zarr", "shuffle_order", "write_shuffled"]
