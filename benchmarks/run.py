#!/usr/bin/env python
"""Run the posenc benchmark suite: the same code as `python -m posenc bench`.

    python benchmarks/run.py            # the full run (about 15-20 minutes on 2 cores)
    python benchmarks/run.py --quick    # tiny sizes, seconds
    python benchmarks/run.py --help     # every option

Results go to benchmarks/results/<date>-<host>.{json,md} and -*.png.
"""

import os
import sys

if __name__ == "__main__":
    # a source checkout: import the package next to this directory
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from posenc import bench

    sys.exit(bench.main(sys.argv[1:]))
