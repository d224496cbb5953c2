"""The ``emgmm`` command line (:mod:`.command`), its progress reports and the demo."""

from .command import main

__all__ = ["main"]
