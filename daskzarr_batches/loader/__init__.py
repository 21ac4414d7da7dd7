"""The training loader: epochs, rank shares, resumable and validated state."""

from .epochs import Loader

__all__ = ["Loader"]
