"""Benchmarks of daskzarr_batches, one suite run by one command: ``python -m benchmarks``.

``python -m benchmarks --list`` names every benchmark; ``--only NAME,...`` picks
some; ``python -m benchmarks compare REF`` runs an earlier commit's library
beside this one.  Run from the repository root (nothing here edits ``sys.path``).

- ``command``: the command line and the table of benchmarks (what each runs and reads);
- ``suite/``: the measured report (``suite``, ``stores``, ``exact-sweep``): cases,
  targets, ``results.md``;
- one module per investigation: ``latency``, ``shards``, ``codec_pipelines``,
  ``cluster``, ``profile_cluster``, ``ramp_latency``, ``torch_workers``,
  ``defaults``, ``compare``;
- ``latency_store``: the one latency wrapper store (the tests use it too);
- ``s3_server``: moto's S3 on loopback and the guard that nothing else is reached
  (the tests use it too);
- ``internals``: every use of the library's private modules, in one place.
"""
