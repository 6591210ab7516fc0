"""The posenc command line: `python -m posenc info|check|bench|rank|plot`."""

from __future__ import annotations

import argparse
import sys


def cmd_info(args) -> int:
    import posenc

    print(posenc.info())
    return 0


def cmd_check(args) -> int:
    import posenc

    try:
        result = posenc.check(args.methods, args.isa, dtypes=args.dtypes, B=args.B, H=args.H,
                              n=args.n, m=args.m, d=args.d, shared=args.shared, seed=args.seed)
    except ValueError as error:     # an unknown method, an ISA this CPU lacks
        print(error, file=sys.stderr)
        return 2
    print(result)
    return 0 if result.passed else 1


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

    from ._paths import package_home

    if explicit:
        places = [explicit, os.path.join(explicit, "benchmarks")]
    else:
        places = [os.path.join(package_home(), "benchmarks"), "benchmarks"]
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


def cmd_lab(args) -> int:
    from posenc import lab

    try:
        return lab.main(args.rest) or 0
    except ImportError as exc:      # no torch (or matplotlib, transformers): how to get it
        print(f"posenc lab: {exc}", file=sys.stderr)
        return 2


PASSTHROUGH = {"bench": cmd_bench, "rank": cmd_rank, "plot": cmd_plot, "lab": cmd_lab}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # bench, rank, plot and lab parse their own options (argparse.REMAINDER would not
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
    check.add_argument("--dtypes", nargs="+", metavar="DTYPE",
                       help="float32 float64 bfloat16 float16 (default all; bfloat16 with ml_dtypes)")
    sizes = (("B", 2, "batch rows"), ("H", 3, "query heads"), ("n", 33, "queries per row"),
             ("m", 17, "keys per row"), ("d", 16, "head width"))
    for name, default, what in sizes:
        check.add_argument(f"--{name}", type=int, default=default,
                           help=f"{what} of every case (default {default})")
    check.add_argument("--shared", action="store_true", help="positional parameters with head axis 1")
    check.add_argument("--seed", type=int, default=0, help="the inputs' random seed (default 0)")

    for name, text in (("bench", "benchmarks against PyTorch and the machine's limits (--help)"),
                       ("rank", "DIET Theorem 1: rank of additive vs per-head positional attention (--help)"),
                       ("plot", "heatmaps of positional attention (--help)"),
                       ("lab", "train encodings short, test them long: extrapolate, tasks, plot "
                               "(--help)")):
        sub.add_parser(name, help=text, add_help=False)

    args = parser.parse_args(argv)
    return {"info": cmd_info, "check": cmd_check}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
