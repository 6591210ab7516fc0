#!/usr/bin/env python
"""Run posenc's benchmark suite (benchmarks/posenc_bench) against the installed
posenc; `python -m posenc bench` runs the same code from a source checkout.

    python benchmarks/run.py            # the full run (about 15-20 minutes on 2 cores)
    python benchmarks/run.py --quick    # tiny sizes, seconds
    python benchmarks/run.py --report-only benchmarks/results/<run>.json --out DIR
                                        # the .md and charts of a run, from its JSON
    python benchmarks/run.py --help     # every option

Results go to benchmarks/results/<date>-<host>.{json,md} and -*.png.
"""

import os
import sys

if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # the suite, by path
    from posenc_bench.cli import main

    sys.exit(main(sys.argv[1:]))
