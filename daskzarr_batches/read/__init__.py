"""Reading: task functions and the dask graphs built from them."""
