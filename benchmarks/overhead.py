#!/usr/bin/env python
"""Per-call overhead of posenc at small sizes, one thread; the full run
measures and reports the same (posenc_bench/overhead.py says what and how).

    python benchmarks/overhead.py [--quick] [--no-torch]
"""

import argparse
import os
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and calls")
    parser.add_argument("--no-torch", action="store_true",
                        help="only posenc.t5 at B=H=n=m=d=1, not posenc.torch against native")
    args = parser.parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # the suite, by path
    from posenc_bench import overhead

    torch = None
    if not args.no_torch:
        try:
            import torch
        except ImportError:
            print("torch is not installed: posenc.torch against native not measured")
    print(overhead.text(overhead.measure_overhead(torch, quick=args.quick)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
