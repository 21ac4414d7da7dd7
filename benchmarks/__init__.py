"""Benchmarks of daskzarr_batches; run them with ``python benchmarks/run.py``.

The measured cases, targets and report live in :mod:`benchmarks.suite`;
``run.py``, ``defaults.py`` and ``bench_cluster.py`` are the scripts.
"""
