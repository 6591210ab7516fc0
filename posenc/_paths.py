"""Where the imported posenc lives, for the code that starts another Python on it
(the benchmarks' workers, the tests' subprocesses) or looks beside it (``python -m
posenc bench`` finding a checkout's benchmarks/)."""

from __future__ import annotations

import os


def package_home() -> str:
    """The directory that holds the imported posenc package: an in-place build's
    checkout, or site-packages.  A Python started with it first on PYTHONPATH imports
    this posenc, not the sources of its working directory (which in an unpacked sdist
    are not built)."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
