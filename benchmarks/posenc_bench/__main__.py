"""`python -m posenc_bench` with benchmarks/ on the path: the suite's command line."""

import sys

from .cli import main

sys.exit(main(prog="python -m posenc_bench"))
