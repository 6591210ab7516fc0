#!/usr/bin/env python
"""The speed of the ten papers' methods and rope, alibi, kerple in this checkout against
another build of posenc, in interleaved turns: a change to the engine left them as fast.

    python benchmarks/before_after.py --before PATH [--turns 5] [--threads 2] [--quick]

PATH is a checkout of posenc with its extension built in place (`git worktree add
PATH <commit> && cd PATH && python setup.py build_ext --inplace`).  Each turn runs
one process on PATH's posenc, then one on the posenc this Python imports (the
installed one, as the rest of the suite measures; a slow stretch of the
machine hits a turn's two alike); each process times every method's fused attention
(`posenc.<method>_attention`, then `_attention_backward`), float32 and bfloat16,
B=8 H=12 n=m=512 d=dv=64, the best of 3 calls.  Reported per method, dtype and
direction: the medians over the turns and their ratio (after ÷ before), and the
ratio of the best turns (the least disturbed: on a shared machine the medians carry
bursts of another tenant).  Target: within 1.03x.
Results: <out>/before-after-<date>.json and .md.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

METHODS = ("content", "diet_abs", "diet_rel", "tupe", "t5", "shaw", "m2", "m4", "m4m",
           "deberta", "rope", "alibi", "kerple")
DTYPES = ("float32", "bfloat16")
DIRECTIONS = ("fwd", "fwd+bwd")
HEADLINE = dict(B=8, H=12, n=512, d=64)
QUICK = dict(B=1, H=2, n=33, d=16)
TARGET = 1.03


def worker(spec: dict) -> dict:
    """One process: spec["tree"]'s posenc, every method x dtype, best of 3 calls (ms)."""
    sys.path.insert(0, spec["tree"])
    import ml_dtypes
    import numpy as np
    import posenc
    from posenc._examples import make_inputs

    assert os.path.dirname(os.path.dirname(os.path.abspath(posenc.__file__))) == \
        os.path.abspath(spec["tree"]), f"posenc came from {posenc.__file__}"
    posenc.set_num_threads(spec["threads"])
    B, H, n, d = (spec["shape"][x] for x in "BHnd")
    times = {}
    for dtype in DTYPES:
        dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
        for method in METHODS:
            rng = np.random.default_rng(0)
            args, kwargs = make_inputs(method, B, H, n, n, d, dtype=dt, rng=rng)
            kwargs = {k: x for k, x in kwargs.items() if k != "query_offset"}
            v, d_out = (rng.standard_normal((B, H, n, d)).astype(dt) for _ in range(2))
            call = tuple(args[:2]) + (v,) + tuple(args[2:])
            forward = getattr(posenc, method + "_attention")
            backward = getattr(posenc, method + "_attention_backward")
            best = [math.inf, math.inf]
            for _ in range(3):
                t0 = time.perf_counter()
                out, lse = forward(*call, **kwargs)[:2]
                t1 = time.perf_counter()
                backward(d_out, *call, out, lse, **kwargs)
                t2 = time.perf_counter()
                best = [min(best[0], t1 - t0), min(best[1], t2 - t0)]
            times[f"{dtype}/{method}"] = [x * 1e3 for x in best]
    return times


def _commit(tree: str) -> str:
    try:
        return subprocess.run(["git", "-C", tree, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


def run(args) -> dict:
    from posenc._paths import package_home
    from posenc_bench.machine import cpu_family, cpu_model

    before = os.path.abspath(args.before or "")
    if not args.before or not os.path.isdir(os.path.join(before, "posenc")):
        raise SystemExit(f"--before {before}: not a checkout of posenc (no posenc/ in it)")
    shape = QUICK if args.quick else HEADLINE
    turns = 1 if args.quick else args.turns
    after = os.path.abspath(package_home())
    trees = {"before": before, "after": after}
    runs = {name: [] for name in trees}
    for turn in range(turns):
        for name, tree in trees.items():
            spec = dict(tree=tree, threads=args.threads, shape=shape)
            print(f"turn {turn + 1}/{turns}: {name} ({tree})", file=sys.stderr, flush=True)
            done = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker",
                                   json.dumps(spec)], capture_output=True, text=True, cwd=tree,
                                  env=dict(os.environ, PYTHONPATH=tree))
            if done.returncode:
                raise SystemExit(f"{name}'s process failed:\n{done.stderr[-2000:]}")
            runs[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
    return dict(cpu=f"{cpu_model()} ({cpu_family()})", threads=args.threads,
                shape=shape, turns=turns, before=dict(tree=before, commit=_commit(before)),
                after=dict(tree=after, commit=_commit(after)), runs=runs)


def _ratios(results: dict) -> list:
    """(key, direction, median before, median after, median ratio, best ratio) rows."""
    rows = []
    for key in results["runs"]["before"][0]:
        for i, direction in enumerate(DIRECTIONS):
            b = [r[key][i] for r in results["runs"]["before"]]
            a = [r[key][i] for r in results["runs"]["after"]]
            mb, ma = statistics.median(b), statistics.median(a)
            rows.append((key, direction, mb, ma, ma / mb, min(a) / min(b)))
    return rows


def markdown(results: dict) -> str:
    rows = _ratios(results)
    s = results["shape"]
    lines = [f"# Before and after: {results['after']['commit']} ÷ {results['before']['commit']}, "
             f"B={s['B']} H={s['H']} n=m={s['n']} d=dv={s['d']}, {results['threads']} threads", "",
             f"CPU {results['cpu']}; {results['turns']} interleaved turns, each process "
             f"the best of 3 calls; before: `{results['before']['tree']}`.", "",
             "| method | direction | before ms (median) | after ms | ÷ | ÷ of the best turns |",
             "|---|---|---|---|---|---|"]
    for key, direction, mb, ma, r, best in rows:
        lines.append(f"| {key} | {direction} | {mb:.3g} | {ma:.3g} | {r:.3f}× | {best:.3f}× |")
    medians = [r[4] for r in rows]
    bests = [r[5] for r in rows]
    geo = lambda x: math.exp(sum(map(math.log, x)) / len(x))
    lines += ["", f"Medians' ratios {min(medians):.3f}–{max(medians):.3f}× (geometric mean "
              f"{geo(medians):.3f}); the best turns' {min(bests):.3f}–{max(bests):.3f}× "
              f"({geo(bests):.3f}).  Target: within {TARGET}×."]
    return "\n".join(lines) + "\n"


def _add_arguments(parser):
    parser.add_argument("--before", metavar="PATH",
                        help="a checkout of posenc with its extension built in place (required)")
    parser.add_argument("--turns", type=int, default=5)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:   # a turn's process: its tree's posenc alone, no posenc_bench
        print(json.dumps(worker(json.loads(argv[1]))))
        return 0
    from posenc_bench.report import script_main

    return script_main(argv, doc=__doc__, prefix="before-after", run=run, markdown=markdown,
                       out=os.path.join(HERE, "results"), add_arguments=_add_arguments)


if __name__ == "__main__":
    sys.exit(main())
