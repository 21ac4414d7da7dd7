"""Streams: validated settings, the stream iterators and their public constructors."""
