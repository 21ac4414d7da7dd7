"""Planning: pure index math (batches, windows, shards, budgets); numpy only."""
