"""``python -m benchmarks``: see :mod:`benchmarks.command`."""

import contextlib

from .command import main

if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
