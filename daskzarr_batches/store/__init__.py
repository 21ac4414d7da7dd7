"""Zarr layout: sources, opening, codec pipelines, the read policy, shards."""
