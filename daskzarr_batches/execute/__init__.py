"""Running graphs: the threaded and distributed runners, cancellation."""
