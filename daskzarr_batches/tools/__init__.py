"""The command line: ``demo``, ``info`` and ``bench``."""
