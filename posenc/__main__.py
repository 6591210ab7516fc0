"""The posenc command line: `python -m posenc info|check|bench|rank|plot`."""

from __future__ import annotations

import argparse
import platform
import sys
import time


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") or line.startswith("Model"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cmd_info(args) -> int:
    import numpy as np

    import posenc

    info = posenc.build_info()
    print(f"posenc      {posenc.__version__}")
    print(f"python      {platform.python_version()} ({sys.executable})")
    print(f"numpy       {np.__version__}")
    print(f"compiler    {info['compiler']}")
    print(f"openmp      {info['openmp'] or 'not built with OpenMP'}")
    print(f"cpu         {_cpu_model()} ({platform.machine()})")
    print(f"isa built   {', '.join(info['compiled_isas'])}")
    print(f"isa usable  {', '.join(posenc.capabilities())}")
    print(f"isa active  {posenc.get_isa()}   (POSENC_ISA or posenc.set_isa to choose)")
    print(f"threads     {posenc.get_num_threads()} of {info['max_threads']} "
          "(OMP_NUM_THREADS or posenc.set_num_threads to choose)")
    return 0


def cmd_check(args) -> int:
    import posenc
    from posenc import _check

    methods = args.methods or list(posenc.METHODS)
    isas = args.isa or posenc.capabilities()
    unknown = [m for m in methods if m not in posenc.METHODS]
    if unknown:
        print(f"unknown method(s) {', '.join(unknown)}; choose from {', '.join(posenc.METHODS)}",
              file=sys.stderr)
        return 2
    for isa in isas:
        if isa not in posenc.capabilities():
            print(f"ISA {isa!r} is not available here; available: "
                  f"{', '.join(posenc.capabilities())}", file=sys.stderr)
            return 2
    shape = dict(B=args.B, H=args.H, n=args.n, m=args.m, d=args.d, shared=args.shared,
                 seed=args.seed)
    print(f"posenc {posenc.__version__} check: every method x ISA x dtype against "
          f"posenc.reference (B={args.B} H={args.H} n={args.n} m={args.m} d={args.d}"
          f"{' shared parameters' if args.shared else ''}, seed {args.seed})")
    start = time.perf_counter()
    rows = _check.run_check(methods, isas, **shape)
    print(_check.format_table(rows))
    failed = [r for r in rows if not r.ok]
    print(f"\nerr: float64 = max|posenc - reference| / max|reference| (limit {_check.F64_RTOL:g});"
          " float32 = max |posenc - reference| / bound, bound = (depth + 8) eps32 x"
          " (method on |inputs|) (limit 1)")
    print(f"{len(rows) - len(failed)} passed, {len(failed)} failed "
          f"({len(methods)} methods x {len(isas)} ISAs x 2 dtypes, forward and backward) "
          f"in {time.perf_counter() - start:.1f} s")
    return 1 if failed else 0


BENCH_SUITE_ENV = "POSENC_BENCH_SUITE"
BENCH_SUITE_MISSING = (
    "posenc bench: the benchmark suite is not part of the installed package; it lives in "
    "benchmarks/ of posenc's source checkout: run `python benchmarks/run.py` there, or "
    "`python -m posenc bench --suite PATH/TO/benchmarks` (or set POSENC_BENCH_SUITE)")


def _bench_suite(explicit):
    """The directory holding the suite's package posenc_bench: `explicit` (--suite or
    POSENC_BENCH_SUITE; a checkout or its benchmarks/), else the benchmarks/ next to
    the package (an editable install), else ./benchmarks; None if none holds it."""
    import os

    import posenc

    if explicit:
        places = [explicit, os.path.join(explicit, "benchmarks")]
    else:
        checkout = os.path.dirname(os.path.dirname(os.path.abspath(posenc.__file__)))
        places = [os.path.join(checkout, "benchmarks"), "benchmarks"]
    for place in places:
        if os.path.isfile(os.path.join(place, "posenc_bench", "cli.py")):
            return os.path.abspath(place)
    return None


def cmd_bench(args) -> int:
    """Run the suite of a source checkout against this posenc (--suite PATH to choose)."""
    import os

    rest, suite = list(args.rest), os.environ.get(BENCH_SUITE_ENV)
    for at, arg in enumerate(rest):
        if arg == "--suite" or arg.startswith("--suite="):
            value = rest[at + 1:at + 2] if arg == "--suite" else [arg.split("=", 1)[1]]
            suite = value[0] if value else ""
            del rest[at:at + 1 + (arg == "--suite")]
            break
    where = _bench_suite(suite)
    if where is None:
        print(BENCH_SUITE_MISSING + (f"; no suite in {suite!r}" if suite else ""),
              file=sys.stderr)
        return 2
    sys.path.insert(0, where)
    from posenc_bench.cli import main as bench_main

    return bench_main(rest, prog="python -m posenc bench",
                      epilog=f"--suite PATH: the suite to run (here {where}); "
                             f"{BENCH_SUITE_ENV} sets it too.")


def cmd_rank(args) -> int:
    from posenc import analysis

    return analysis.main(args.rest) or 0


def cmd_plot(args) -> int:
    from posenc import plot

    try:
        return plot.main(args.rest) or 0
    except ImportError as exc:     # no matplotlib: one line saying how to get it
        if str(exc) != plot.INSTALL_HINT:
            raise
        print(f"posenc plot: {exc}", file=sys.stderr)
        return 2


PASSTHROUGH = {"bench": cmd_bench, "rank": cmd_rank, "plot": cmd_plot}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # bench, rank and plot parse their own options (argparse.REMAINDER would not
    # take ones that start with '-')
    if argv and argv[0] in PASSTHROUGH:
        return PASSTHROUGH[argv[0]](argparse.Namespace(rest=argv[1:]))
    parser = argparse.ArgumentParser(
        prog="python -m posenc",
        description="posenc: fused C kernels for positional-encoding attention logits.")
    sub = parser.add_subparsers(dest="command", required=True)

    sub.add_parser("info", help="version, compiler, ISAs available and selected, threads")

    check = sub.add_parser("check", help="every method x ISA x dtype against the reference")
    check.add_argument("--methods", nargs="+", metavar="METHOD", help="methods to check (default all)")
    check.add_argument("--isa", nargs="+", metavar="ISA", help="ISAs to check (default all available)")
    check.add_argument("--B", type=int, default=2)
    check.add_argument("--H", type=int, default=3)
    check.add_argument("--n", type=int, default=33)
    check.add_argument("--m", type=int, default=17)
    check.add_argument("--d", type=int, default=16)
    check.add_argument("--shared", action="store_true", help="positional parameters with head axis 1")
    check.add_argument("--seed", type=int, default=0)

    for name, text in (("bench", "benchmarks against PyTorch and the machine's limits (--help)"),
                       ("rank", "DIET Theorem 1: rank of additive vs per-head positional attention (--help)"),
                       ("plot", "heatmaps of positional attention (--help)")):
        sub.add_parser(name, help=text, add_help=False)

    args = parser.parse_args(argv)
    return {"info": cmd_info, "check": cmd_check}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
