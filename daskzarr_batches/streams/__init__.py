"""Streams: validated settings, the stream iterators and their public constructors.

``StreamSpec`` (what ``stream.spec`` is: a stream's validated settings) is shown here
for inspection and type hints (``from daskzarr_batches.streams import StreamSpec``).
"""

from .spec import StreamSpec

__all__ = ["StreamSpec"]
