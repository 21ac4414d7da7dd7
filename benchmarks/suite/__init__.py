"""The benchmark suite behind ``python -m benchmarks`` (see ``docs/benchmarks.md``).

Modules, in the order a run uses them:

- ``dataset``: the generated dataset (made once, opened read-only) and the default sizes;
- ``measure``: peak-RSS sampling, ``Result`` (wall and CPU seconds of every round), ``Case``
  and interleaved rounds;
- ``cases``: the measured cases (L0, zarr threads, raw decode, this library's
  streams and ``Loader`` (alone and through a torch ``DataLoader``), naive dask,
  xbatcher, torch, LocalCluster) and the prefetch case;
- ``stores_cases``: every stream kind against zarr's ``x[:]`` on the same store where data
  really lives (issue 10): a sharded copy, ``benchmarks.latency_store`` at 20 / 100 ms,
  moto's S3 on loopback, zarrs' codec pipeline; and their report table;
- ``patch_cases``: issue 16's N-D patches and forecast pairs over a ``(T, 721, 1440)`` field
  in two chunkings, against L0 (chunk by chunk) and xbatcher; ``patches.md``;
- ``memory``: memory cases, each in a fresh subprocess (``python -m benchmarks.suite.memory``),
  and the exact-shuffle budget sweep;
- ``collection``, ``mixture``: issue 18's collections (many stores as one) and two-source
  mixtures against their sources streamed alone; ``collection.md``, ``mixture.md``;
- ``peers``: issue 27's peers, insitubatch and annbatch, beside this library on the same
  stores (the ``peers`` extra, Python >= 3.12); ``peers.md``;
- ``quality``: shuffle quality computed from plans (nothing read);
- ``cpu``: issue 20's CPU cases (the raw-decode floor, L0, every stream kind with zarrs
  and zarr's pipeline, a child pinned to one core) and their table;
- ``targets``: the targets of issues 3, 9, 10 and 16 as a table, evaluated on a ``SuiteRun``;
- ``report``: ``results.md``, ``results.json``, ``throughput.png`` and the printed summary;
- ``run``: the benchmarks ``suite`` (every step above, in order) and ``stores`` (the
  store cases alone), as ``python -m benchmarks`` runs them.

The public API of ``daskzarr_batches`` is used, and ``benchmarks.internals`` where
there is none (one exact-shuffle budget computation).
"""

from pathlib import Path

#: the repository root (``benchmarks/..``)
ROOT = Path(__file__).resolve().parents[2]
