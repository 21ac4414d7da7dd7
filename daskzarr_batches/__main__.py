"""``python -m daskzarr_batches demo``: the same command line as ``daskzarr-batches``."""

import sys

from .tools.cli import main

if __name__ == "__main__":
    sys.exit(main())
