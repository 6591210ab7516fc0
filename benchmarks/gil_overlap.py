"""Do posenc kernels release the GIL?  Two Python threads, one posenc thread each.

Runs the same batch of calls (a) serially in one Python thread and (b) split
over two Python threads, with posenc.set_num_threads(1) so that any overlap
comes from the GIL being released around the kernels.  On a machine with two
free cores, (b) takes about half the time of (a); with the GIL held it would
take as long.  A measurement, not a test:

    python benchmarks/gil_overlap.py [--method t5] [--calls 40]
"""

import argparse
import os
import threading
import time

import numpy as np

import posenc
from posenc._examples import make_inputs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="t5", choices=posenc.METHODS)
    parser.add_argument("--calls", type=int, default=40, help="calls in total (even)")
    parser.add_argument("--shape", type=int, nargs=5, default=[2, 12, 512, 512, 64],
                        metavar=("B", "H", "n", "m", "d"))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)

    B, H, n, m, d = args.shape
    inputs, kwargs = make_inputs(args.method, B, H, n, m, d, dtype=np.float32,
                                 rng=np.random.default_rng(0))
    fn = getattr(posenc, args.method)
    outs = [np.empty((B, H, n, m), np.float32) for _ in range(2)]
    previous = posenc.get_num_threads()
    posenc.set_num_threads(1)

    def work(count, out):
        for _ in range(count):
            fn(*inputs, out=out, **kwargs)

    def serial():
        work(args.calls, outs[0])

    def two_threads():
        threads = [threading.Thread(target=work, args=(args.calls // 2, outs[t])) for t in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    try:
        work(2, outs[0])   # warm-up
        best = {}
        for name, run in (("one Python thread", serial), ("two Python threads", two_threads)):
            times = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                run()
                times.append(time.perf_counter() - start)
            best[name] = min(times)
    finally:
        posenc.set_num_threads(previous)

    print(f"posenc.{args.method} at B={B} H={H} n={n} m={m} d={d}, float32, {args.calls} calls, "
          f"posenc threads = 1, {os.cpu_count()} CPUs, best of {args.repeats}")
    for name, seconds in best.items():
        print(f"  {name:20s} {seconds * 1e3:8.1f} ms  ({seconds / args.calls * 1e3:.2f} ms per call)")
    speedup = best["one Python thread"] / best["two Python threads"]
    print(f"  overlap: two threads run {speedup:.2f}x faster (2.00x = perfect overlap, 1.00x = none)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
