"""The command line: a thin click layer over the Python API (``commands``, ``options``)."""
from .commands import main

__all__ = ["main"]
