#!/usr/bin/env python
"""Spread of fresh-output forwards: p50, p95 and p95/p50 of posenc.content
returning a new ~100 MB float32 array (B=8, H=12, n=m=512, d=64) each call.

A fresh result's first touch faults its pages in; with transparent huge pages
in madvise mode (NumPy advises huge pages for large arrays) a fault now and
then waits for the kernel to compact memory, and that call takes several
times the median.  posenc keeps a small cache of pre-faulted result blocks
(posenc.set_result_cache), which this measures; --no-cache measures without.

    python benchmarks/allocation.py [--calls 50] [--threads 2] [--no-cache] [--out-param]
"""

import argparse
import sys
import time

import numpy as np


def measure(calls: int, threads: int, cache: bool, out_param: bool, shape) -> list:
    import posenc

    B, H, n, m, d = shape
    posenc.set_num_threads(threads)
    if not cache and hasattr(posenc, "set_result_cache"):   # absent before the cache
        posenc.set_result_cache(0)
    rng = np.random.default_rng(0)
    q = rng.standard_normal((B, H, n, d), dtype=np.float32)
    k = rng.standard_normal((B, H, m, d), dtype=np.float32)
    out = np.empty((B, H, n, m), np.float32) if out_param else None
    for _ in range(3):      # warm up: the pool of threads, the cache
        posenc.content(q, k, out=out)
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        result = posenc.content(q, k, out=out)
        times.append(time.perf_counter() - start)
        del result          # freed before the next call, as a training loop would
    return times


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-cache", action="store_true",
                        help="posenc.set_result_cache(0): every result freshly allocated")
    parser.add_argument("--out-param", action="store_true",
                        help="write into one preallocated out= (no allocation at all)")
    parser.add_argument("--shape", type=int, nargs=5, default=(8, 12, 512, 512, 64),
                        metavar=("B", "H", "n", "m", "d"))
    args = parser.parse_args(argv)
    times = np.array(measure(args.calls, args.threads, not args.no_cache, args.out_param,
                             tuple(args.shape))) * 1e3
    p50, p95 = np.percentile(times, 50), np.percentile(times, 95)
    B, H, n, m, _ = args.shape
    import posenc

    if args.out_param:
        what = "out="
    elif not hasattr(posenc, "set_result_cache"):
        what = "fresh (a posenc without the result cache)"
    else:
        what = "fresh, no cache" if args.no_cache else "fresh, cache"
    print(f"content {tuple(args.shape)} float32 ({B * H * n * m * 4 / 1e6:.0f} MB), "
          f"{args.threads} threads, {args.calls} calls, {what}")
    print(f"p50 {p50:.2f} ms  p95 {p95:.2f} ms  p95/p50 {p95 / p50:.2f}  "
          f"min {times.min():.2f} ms  max {times.max():.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
