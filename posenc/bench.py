"""`python -m posenc bench`: posenc against the peers a user would pick, and
against the machine's limits (issue 5; issue 3's targets).

For every method, forward and backward, float32: posenc at each thread count;
PyTorch eager (posenc.torch.native, with torch's thread count set the same)
and torch.compile of it; the NumPy reference at the smallest shape; NumPy's
matmul content peer with and without OPENBLAS_CORETYPE; peak memory in
subprocesses.  Writes <date>-<host>.json, .md and -*.png under --out.

The modules: _bench_cases (inputs, FLOPs, memory estimates), _bench_machine
(header, FMA and store limits), _bench_measure (timers, progress, workers),
_bench_worker (subprocess side), _bench_report (targets, Table 1, Markdown,
charts).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import socket
import sys
import time
from collections import OrderedDict

import numpy as np

import posenc

from . import _bench_cases as cases
from . import _bench_machine as machine
from . import _bench_measure as measure
from . import _bench_report as report

FULL = dict(
    headline=(8, 12, 512, 512, 64),
    grid=[(8, 12, 128, 128, 64), (8, 12, 512, 512, 64), (8, 12, 2048, 2048, 64),
          (8, 12, 512, 512, 128)],
    scaling_n=(128, 256, 512, 1024, 2048, 4096),
    scaling_work=96 * 2048 * 2048,      # B·H·n² cap of the scaling series (B·H shrinks past it)
    repeats=5, max_seconds=2.0, fma_seconds=0.5, store_bytes=256 << 20, store_repeats=5,
    peer_threads_logits=16 << 20,       # peers at every thread count up to these logits
)
QUICK = dict(
    headline=(1, 2, 32, 32, 16),
    grid=[(1, 2, 16, 16, 8), (1, 2, 32, 32, 16), (1, 2, 32, 32, 32)],
    scaling_n=(16, 32, 64, 128),
    scaling_work=2 * 64 * 64,
    repeats=2, max_seconds=0.05, fma_seconds=0.02, store_bytes=8 << 20, store_repeats=2,
    peer_threads_logits=256 << 20,
)
SCALING_METHODS = ("content", "t5", "shaw")


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m posenc bench",
        description="Benchmark posenc against PyTorch eager, torch.compile and NumPy, and "
                    "against the machine's FMA peak and store bandwidth.")
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes (seconds; the smoke test), compile of content only")
    parser.add_argument("--out", default=os.path.join("benchmarks", "results"),
                        help="directory for <date>-<host>.json/.md/-*.png (default %(default)s)")
    parser.add_argument("--methods", nargs="+", metavar="METHOD", default=None,
                        help="methods to run (default all)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="timed repeats per measurement after one warm-up (default 5, quick 2)")
    parser.add_argument("--max-seconds", type=float, default=None,
                        help="stop repeating a measurement after this many seconds once two "
                             "repeats are in (default 2, quick 0.05)")
    parser.add_argument("--threads", default=None,
                        help="comma-separated thread counts (default 1,2, capped at the cores)")
    parser.add_argument("--no-torch", action="store_true",
                        help="skip the PyTorch peers (automatic when torch is missing)")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument("--compile-all-shapes", action="store_true",
                        help="torch.compile at every shape, not only the headline shape")
    parser.add_argument("--peer-threads-all", action="store_true",
                        help="run the PyTorch peers at every thread count at every shape "
                             "(default: at the headline shape and where the logits are "
                             "<= 16 MiB; elsewhere at the largest count only)")
    parser.add_argument("--mem-budget-gib", type=float, default=12.0,
                        help="shrink B·H (or skip) a run whose estimated memory exceeds this")
    parser.add_argument("--no-subprocess", action="store_true",
                        help="skip the memory and NumPy-matmul subprocesses")
    parser.add_argument("--plan", action="store_true",
                        help="print what would run (shapes, shrinks, skips, a rough time "
                             "estimate) and exit")
    args = parser.parse_args(argv)
    unknown = [m for m in args.methods or () if m not in cases.METHODS]
    if unknown:
        parser.error(f"unknown method(s) {', '.join(unknown)}; choose from "
                     f"{', '.join(cases.METHODS)}")
    return args


def _threads(text):
    cores = machine.usable_cores()
    if text is None:
        return sorted({1, min(2, cores)})
    threads = sorted({int(t) for t in text.split(",") if t.strip()})
    if not threads or threads[0] < 1:
        raise SystemExit(f"--threads: expected counts >= 1 such as 1,2, got {text!r}")
    return threads


def _import_torch(disabled: bool):
    if disabled:
        return None, "--no-torch given"
    try:
        import torch
    except ImportError as exc:
        return None, f"torch is not installed ({exc})"
    return torch, None


class Plan:
    """Every timing to run, grouped by (shape, method) so inputs are built once."""

    def __init__(self, config, methods, threads, torch_ok, compile_methods, budget, opts):
        self.groups = OrderedDict()     # (shape, method) -> {key: task}
        self.skipped = []
        self.config = config
        T = max(threads)
        headline = config["headline"]

        def add(shape, method, impl, direction, thr, sections, requested=None):
            key = (method, impl, direction, thr, tuple(shape))
            tasks = self.groups.setdefault((tuple(shape), method), OrderedDict())
            task = tasks.setdefault(key, {"key": key, "sections": set(), "requested": requested})
            task["sections"].update(sections)

        def skip(item):
            if item not in self.skipped:
                self.skipped.append(item)

        def add_peer(shape, method, impl, peer_threads, sections):
            B, H, n, m, d = shape
            fit = cases.fit_shape(method, impl, B, H, n, m, d, budget)
            need = cases.peer_bytes(method, impl, B, H, n, m, d)
            if fit is None:
                least = cases.peer_bytes(method, impl, 1, 1, n, m, d)
                skip({"what": f"{impl} {method} at {_shape_text(shape)}",
                      "reason": f"needs ~{cases.gib(need)}, and ~{cases.gib(least)} even at "
                                f"B=H=1: over the budget of {cases.gib(budget)}, skipped"})
                return
            run_shape = (fit[0], fit[1], n, m, d)
            if run_shape != tuple(shape):
                skip({"what": f"{impl} {method} at {_shape_text(shape)}",
                                     "reason": f"needs ~{cases.gib(need)} > budget "
                                               f"{cases.gib(budget)}: run at B={fit[0]} H={fit[1]} "
                                               "(posenc measured there too)",
                                     "shrunk": True})
            for thr in peer_threads:
                for direction in ("fwd", "bwd"):
                    add(run_shape, method, impl, direction, thr, sections,
                        requested=tuple(shape) if run_shape != tuple(shape) else None)
                    if run_shape != tuple(shape):
                        add(run_shape, method, "posenc", direction, thr, sections)

        for shape in config["grid"]:
            B, H, n, m, d = shape
            all_threads = opts.peer_threads_all or tuple(shape) == headline or \
                cases.logits_bytes(B, H, n, m) <= config["peer_threads_logits"]
            peer_threads = threads if all_threads else [T]
            for method in methods:
                for thr in threads:
                    for direction in ("fwd", "bwd"):
                        add(shape, method, "posenc", direction, thr, {"grid"})
                    if tuple(shape) == headline:
                        add(shape, method, "posenc_out", "fwd", thr, {"grid"})
                if torch_ok:
                    add_peer(shape, method, "eager", peer_threads, {"grid"})
                    if method in compile_methods and (opts.compile_all_shapes
                                                      or tuple(shape) == headline):
                        add_peer(shape, method, "compile", [T], {"grid"})
                    if method == "content" and tuple(shape) == headline:
                        add_peer(shape, method, "torch_matmul", threads, {"grid"})
                if shape == config["grid"][0]:
                    if cases.peer_bytes(method, "reference", B, H, n, m, d) <= budget:
                        for direction in ("fwd", "bwd"):
                            add(shape, method, "reference", direction, None, {"grid"})
                    else:
                        skip({"what": f"reference {method}",
                                             "reason": "over the memory budget"})
        for n in config["scaling_n"]:
            shape = _scaling_shape(headline, n, config["scaling_work"])
            for method in (m for m in SCALING_METHODS if m in methods):
                for direction in ("fwd", "bwd"):
                    add(shape, method, "posenc", direction, T, {"scaling"})
                if torch_ok:
                    add_peer(shape, method, "eager", [T], {"scaling"})

    def tasks(self):
        for (shape, method), tasks in self.groups.items():
            yield shape, method, list(tasks.values())


def _scaling_shape(headline, n, work):
    B, H, _, _, d = headline
    if B * H * n * n <= work:
        return (B, H, n, n, d)
    for b, h in cases.shrink_ladder(B, H):
        if b * h * n * n <= work:
            return (b, h, n, n, d)
    return (1, 1, n, n, d)


def _shape_text(shape):
    B, H, n, m, d = shape
    return f"B={B} H={H} n={n} m={m} d={d}"


def _estimate_seconds(task, timing):
    """A rough cost model for the progress bar and --plan (rates seen on a 2-core AVX-512
    machine); not a result."""
    method, impl, direction, thr, shape = task["key"]
    work = cases.flops(method, direction, *shape)
    rate = {"posenc": 40e9, "posenc_out": 40e9, "torch_matmul": 25e9, "eager": 25e9,
            "compile": 25e9, "reference": 1.5e9}[impl] * (thr or 1) ** 0.85
    if impl in ("eager", "compile") and method in cases.HEAVY:
        rate /= 2
    timed = work / rate                         # the timed part of one call
    per_call = timed * (1.5 if impl in ("eager", "compile", "torch_matmul")
                        and direction == "bwd" else 1)   # + the untimed forward
    calls, spent = 0, 0.0
    while calls < timing["repeats"]:
        calls, spent = calls + 1, spent + timed
        if calls >= 2 and spent >= timing["max_seconds"]:
            break
    return 0.01 + per_call * (1 + calls) + (15.0 if impl == "compile" else 0.0)


def _run_task(task, args, kwargs, G, torch, compiled, timing, progress):
    method, impl, direction, thr, shape = task["key"]
    record = {"method": method, "impl": impl, "direction": direction, "threads": thr,
              "shape": list(shape), "sections": sorted(task["sections"])}
    if task["requested"]:
        record["requested_shape"] = list(task["requested"])
    progress.start(f"{method} {direction} {impl} {thr or '-'}t {_shape_text(shape)}")
    try:
        if impl in ("posenc", "posenc_out"):
            out = np.empty(shape[:4], np.float32) if impl == "posenc_out" else None
            record.update(measure.time_posenc(method, direction, args, kwargs, G, thr, timing,
                                              out=out))
        elif impl == "reference":
            record.update(measure.time_reference(method, direction, args, kwargs, G, timing))
        elif impl == "eager":
            from .torch import native
            record.update(measure.time_torch(torch, getattr(native, method), direction, args,
                                             kwargs, G, thr, timing))
        elif impl == "torch_matmul":
            function = measure.torch_matmul_content(torch, shape[4])
            record.update(measure.time_torch(torch, function, direction, args[:2], {}, G, thr,
                                             timing))
        elif impl == "compile":
            record["compile_s"] = measure.compile_first_call(torch, compiled, direction, args,
                                                             kwargs, G, thr)
            record.update(measure.time_torch(torch, compiled, direction, args, kwargs, G, thr,
                                             timing))
    except Exception as exc:   # a failed compile or an out-of-memory is a result, not a crash
        message = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
        record["error"] = f"{type(exc).__name__}: {message}"
        progress.note(f"  {method} {direction} {impl} at {_shape_text(shape)} failed: "
                      f"{record['error']}")
    return record


def run_timings(plan, torch, timing, progress):
    results = []
    G_shape, G = None, None
    for shape, method, tasks in plan.tasks():
        if shape[:4] != G_shape:
            G = None
            gc.collect()
            G_shape, G = shape[:4], cases.upstream_gradient(*shape[:4])
        args, kwargs = cases.case_inputs(method, *shape)
        compiled = None
        if any(t["key"][1] == "compile" for t in tasks):
            from .torch import native
            compiled = torch.compile(getattr(native, method), dynamic=False)
        for task in tasks:
            results.append(_run_task(task, args, kwargs, G, torch, compiled, timing, progress))
            progress.done(task["weight"])
        if compiled is not None:
            del compiled
            torch._dynamo.reset()
        del args, kwargs
    return results


def run_memory(methods, shape, threads, torch_ok, progress):
    rows = []
    for impl in ("posenc", "eager") if torch_ok else ("posenc",):
        remaining = [m for m in cases.MEMORY_METHODS if m in methods]
        while remaining:
            progress.start(f"peak memory {impl} ({', '.join(remaining)})")
            answer = measure.run_worker({"kind": "memory", "impl": impl, "methods": remaining,
                                         "shape": list(shape), "threads": threads})
            if "error" in answer:
                progress.note(f"  memory {impl}: {answer['error']}")
                rows.append({"impl": impl, "methods": remaining, "error": answer["error"]})
                break
            rows.extend(answer["results"])
            remaining = answer["remaining"]
        progress.done(1)
    for row in rows:
        if "method" in row:
            row["estimate_bytes"] = cases.peer_bytes(row["method"], row["impl"], *row["shape"])
    return rows


def run_numpy_matmul(shapes, threads, timing, progress):
    rows = []
    variants = [("OPENBLAS_CORETYPE=Haswell", {"OPENBLAS_CORETYPE": "Haswell"}),
                ("OPENBLAS_CORETYPE unset", {"OPENBLAS_CORETYPE": None})]
    here = os.environ.get("OPENBLAS_CORETYPE")
    for label, changes in variants:
        for thr in threads:
            progress.start(f"numpy matmul peer, {label}, {thr}t")
            env = dict(changes, OPENBLAS_NUM_THREADS=thr)
            spec = {"kind": "numpy_matmul", "shapes": [list(s) for s in shapes],
                    "timing": timing}
            answer = measure.run_worker(spec, env)
            common = {"variant": label, "threads": thr,
                      "as_in_this_process": changes["OPENBLAS_CORETYPE"] == here}
            if "error" in answer:
                progress.note(f"  numpy matmul {label} {thr}t: {answer['error']}")
                rows.append(dict(common, error=answer["error"]))
            else:
                rows.extend(dict(common, openblas_core=answer["openblas_core"], **r)
                            for r in answer["records"])
            progress.done(1)
    return rows


def main(argv=None) -> int:
    argv = list(argv) if argv is not None else sys.argv[1:]
    opts = parse_args(argv)
    config = QUICK if opts.quick else FULL
    methods = [m for m in cases.METHODS if opts.methods is None or m in opts.methods]
    threads = _threads(opts.threads)
    timing = {"repeats": opts.repeats or config["repeats"],
              "max_seconds": (config["max_seconds"] if opts.max_seconds is None
                              else opts.max_seconds)}
    torch, no_torch_reason = _import_torch(opts.no_torch)
    compile_methods = () if opts.no_compile or torch is None else (
        ("content",) if opts.quick else tuple(methods))
    budget = opts.mem_budget_gib * 2**30
    began = time.perf_counter()
    stamp = datetime.datetime.now()
    host = socket.gethostname().split(".")[0] or "host"

    info = machine.header(torch, threads)
    info["argv"] = ["python", "-m", "posenc", "bench", *argv]   # or benchmarks/run.py: same code
    print(report.header_text(info, config, timing, no_torch_reason), flush=True)

    plan = Plan(config, methods, threads, torch is not None, compile_methods, budget, opts)
    tasks = [t for _, _, group in plan.tasks() for t in group]
    for task in tasks:
        task["weight"] = _estimate_seconds(task, timing)
    isas = [isa for isa in posenc.capabilities() if isa != "scalar"] or ["scalar"]
    limits_units = len(threads) * (len(isas) + 2)
    memory_units = 0 if opts.no_subprocess else (2 if torch is not None else 1)
    numpy_units = 0 if opts.no_subprocess or "content" not in methods else 2 * len(threads)
    unit = 1.0 if opts.quick else 8.0          # rough seconds per subprocess
    total = sum(t["weight"] for t in tasks) + limits_units + (memory_units + numpy_units) * unit
    print(f"plan        {len(tasks)} timings in {len(plan.groups)} (shape, method) groups, "
          f"{memory_units} memory and {numpy_units} NumPy-matmul subprocesses; rough estimate "
          f"{total / 60:.0f} min", flush=True)
    if opts.plan:
        print_plan(plan, total)
        return 0
    progress = measure.Progress(total)
    for item in plan.skipped:
        progress.note(f"  {item['what']}: {item['reason']}")

    limits = machine.machine_limits(threads, fma_seconds=config["fma_seconds"],
                                    store_bytes=config["store_bytes"],
                                    store_repeats=config["store_repeats"], progress=progress)
    results = run_timings(plan, torch, timing, progress)
    # the additive methods against content: interleaved, see interleaved_forward
    additive = [m for m in ("content",) + tuple(cases.ADDITIVE) if m in methods]
    interleaved = {}
    if "content" in additive and len(additive) > 1:
        progress.start("additive methods vs content, interleaved")
        B, H, n, m, d = config["headline"]
        interleaved = measure.interleaved_forward(
            {meth: cases.case_inputs(meth, B, H, n, m, d) for meth in additive}, max(threads),
            rounds=5 if opts.quick else 15)
    memory_rows, numpy_rows = [], []
    if memory_units:
        memory_rows = run_memory(methods, config["headline"], max(threads), torch is not None,
                                 _Scaled(progress, unit))
    if numpy_units:
        numpy_rows = run_numpy_matmul(config["grid"], threads, timing, _Scaled(progress, unit))
    progress.close()

    data = report.assemble(info=info, config=config, timing=timing, threads=threads,
                           methods=methods, limits=limits, results=results,
                           interleaved=interleaved,
                           memory=memory_rows, numpy_matmul=numpy_rows, skipped=plan.skipped,
                           no_torch_reason=no_torch_reason, compile_methods=compile_methods,
                           quick=opts.quick, budget=budget,
                           duration_s=time.perf_counter() - began, stamp=stamp.isoformat())
    os.makedirs(opts.out, exist_ok=True)
    base = os.path.join(opts.out, f"{stamp:%Y-%m-%d}-{host}")
    data["files"] = {"json": base + ".json", "markdown": base + ".md",
                     "charts": report.charts(data, base)}
    with open(base + ".json", "w") as f:
        json.dump(data, f, indent=1, default=str)
    markdown = report.markdown(data)
    with open(base + ".md", "w") as f:
        f.write(markdown)
    print(report.summary_text(data), flush=True)
    print(f"\nwrote {base}.json, {base}.md" +
          "".join(f", {p}" for p in data["files"]["charts"]), flush=True)
    return 0


def print_plan(plan, total):
    for (shape, method), tasks in plan.groups.items():
        kinds = OrderedDict()
        for task in tasks.values():
            _, impl, direction, thr, _ = task["key"]
            kinds.setdefault(f"{impl} {direction}", []).append(str(thr or "-"))
        print(f"  {_shape_text(shape)} {method}: " +
              "; ".join(f"{k} at {','.join(v)}t" for k, v in kinds.items()) +
              f"  (~{sum(t['weight'] for t in tasks.values()):.0f} s)")
    for item in plan.skipped:
        print(f"  {item['what']}: {item['reason']}")
    print(f"rough total {total / 60:.1f} min (a cost model, not a measurement)")


class _Scaled:
    """A view of Progress whose done(1) counts as `weight` units."""

    def __init__(self, progress, weight):
        self.progress, self.weight = progress, weight

    def start(self, label):
        self.progress.start(label)

    def done(self, units):
        self.progress.done(units * self.weight)

    def note(self, text):
        self.progress.note(text)


if __name__ == "__main__":
    sys.exit(main())
