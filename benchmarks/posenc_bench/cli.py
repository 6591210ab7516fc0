"""The suite's command line (`python benchmarks/run.py`, `python -m posenc bench`):
posenc against the peers a user would pick, and against the machine's limits
(with the logits' speed and memory targets).

For every method, forward and backward, float32: posenc at each thread count;
PyTorch eager (posenc.torch.native, with torch's thread count set the same)
and torch.compile of it; the NumPy reference at the smallest shape; NumPy's
matmul content peer with and without OPENBLAS_CORETYPE; peak memory in
subprocesses; the per-call overhead at small sizes.  Writes
<date>-<host>.json, .md and -*.png under --out; --report-only redraws the
.md and the charts from a run's .json.

The modules, each importing only those before it: cases (inputs, FLOPs,
memory estimates, from posenc's method registry), machine (header, FMA and
store limits), measure (timers, progress, workers), worker (the subprocess
side), overhead (per-call cost at small sizes), plan (what runs), report (the
run's data: derived rates, targets, Table 1), markdown (the page), charts
(the PNGs), cli (this).
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

import numpy as np

import posenc

from . import cases, charts, machine, markdown, measure, overhead, report
from .cases import shape_text
from .plan import FULL, QUICK, Plan, estimate_seconds, print_plan

RESULTS = os.path.join(measure.SUITE_ROOT, "results")
QUICK_RESULTS = os.path.join(RESULTS, "tmp")     # never over a committed run of the same day


def parse_args(argv, prog, epilog=None):
    parser = argparse.ArgumentParser(
        prog=prog, epilog=epilog,
        description="Benchmark posenc against PyTorch eager, torch.compile and NumPy, and "
                    "against the machine's FMA peak and store bandwidth.")
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes (seconds; the smoke test), compile of content only")
    parser.add_argument("--out", default=None,
                        help=f"directory for <date>-<host>.json/.md/-*.png (default "
                             f"{os.path.relpath(RESULTS)}; with --quick "
                             f"{os.path.relpath(QUICK_RESULTS)}, which git ignores)")
    parser.add_argument("--report-only", metavar="JSON",
                        help="measure nothing: write the .md and the charts of a run's .json "
                             "into --out")
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
    if args.out is None:
        args.out = os.path.relpath(QUICK_RESULTS if args.quick else RESULTS)
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


def _run_task(task, args, kwargs, G, torch, compiled, timing, progress):
    method, impl, direction, thr, shape = task["key"]
    record = {"method": method, "impl": impl, "direction": direction, "threads": thr,
              "shape": list(shape), "sections": sorted(task["sections"])}
    if task["requested"]:
        record["requested_shape"] = list(task["requested"])
    progress.start(f"{method} {direction} {impl} {thr or '-'}t {shape_text(shape)}")
    try:
        if impl in ("posenc", "posenc_out"):
            out = np.empty(shape[:4], np.float32) if impl == "posenc_out" else None
            record.update(measure.time_posenc(method, direction, args, kwargs, G, thr, timing,
                                              out=out))
        elif impl == "reference":
            record.update(measure.time_reference(method, direction, args, kwargs, G, timing))
        elif impl == "eager":
            from posenc.torch import native
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
        progress.note(f"  {method} {direction} {impl} at {shape_text(shape)} failed: "
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
            from posenc.torch import native
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


def main(argv=None, prog="python benchmarks/run.py", epilog=None) -> int:
    argv = list(argv) if argv is not None else sys.argv[1:]
    opts = parse_args(argv, prog, epilog)
    if opts.report_only:
        return report_only(opts.report_only, opts.out)
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
    info["argv"] = [*prog.split(), *argv]
    print(markdown.header_text(info, timing, no_torch_reason), flush=True)

    plan = Plan(config, methods, threads, torch is not None, compile_methods, budget, opts)
    units = _units(plan, opts, torch, methods, threads, timing)
    total = sum(units.values())
    print(f"plan        {len(list(plan.all_tasks()))} timings in {len(plan.groups)} (shape, "
          f"method) groups, {units['memory'] / units['unit']:.0f} memory and "
          f"{units['numpy'] / units['unit']:.0f} NumPy-matmul subprocesses; rough estimate "
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
    interleaved = run_interleaved(methods, config["headline"], max(threads), opts.quick,
                                  progress)
    small = None
    if "t5" in methods:
        progress.start("per-call overhead at small sizes, 1 thread")
        small = overhead.measure_overhead(torch, quick=opts.quick)
        progress.done(units["overhead"])
    memory_rows, numpy_rows = [], []
    scaled = _Scaled(progress, units["unit"])
    if units["memory"]:
        memory_rows = run_memory(methods, config["headline"], max(threads), torch is not None,
                                 scaled)
    if units["numpy"]:
        numpy_rows = run_numpy_matmul(config["grid"], threads, timing, scaled)
    progress.close()

    data = report.assemble(info=info, config=config, timing=timing, threads=threads,
                           methods=methods, limits=limits, results=results,
                           interleaved=interleaved, overhead=small,
                           memory=memory_rows, numpy_matmul=numpy_rows, skipped=plan.skipped,
                           no_torch_reason=no_torch_reason, compile_methods=compile_methods,
                           quick=opts.quick, budget=budget,
                           duration_s=time.perf_counter() - began, stamp=stamp.isoformat())
    os.makedirs(opts.out, exist_ok=True)
    base = os.path.join(opts.out, f"{stamp:%Y-%m-%d}-{host}")
    data["files"] = {"json": base + ".json", "markdown": base + ".md",
                     "charts": charts.draw(data, base)}
    with open(base + ".json", "w") as f:
        json.dump(data, f, indent=1, default=str)
    with open(base + ".md", "w") as f:
        f.write(markdown.render(data))
    print(markdown.summary_text(data), flush=True)
    print(f"\nwrote {base}.json, {base}.md" +
          "".join(f", {p}" for p in data["files"]["charts"]), flush=True)
    return 0


def _units(plan, opts, torch, methods, threads, timing) -> dict:
    """The progress bar's weights, in rough seconds, by part of the run."""
    for task in plan.all_tasks():
        task["weight"] = estimate_seconds(task, timing)
    isas = [isa for isa in posenc.capabilities() if isa != "scalar"] or ["scalar"]
    unit = 1.0 if opts.quick else 8.0          # rough seconds per subprocess
    memory = 0 if opts.no_subprocess else (2 if torch is not None else 1)
    numpy = 0 if opts.no_subprocess or "content" not in methods else 2 * len(threads)
    return {"timings": sum(t["weight"] for t in plan.all_tasks()),
            "limits": len(threads) * (len(isas) + 2), "overhead": 0.5 if opts.quick else 3.0,
            "memory": memory * unit, "numpy": numpy * unit, "unit": unit}


def run_interleaved(methods, headline, threads, quick, progress):
    """The additive methods against content, forwards taken in turns
    (measure.interleaved_forward): {} unless content and one of them run."""
    additive = [m for m in ("content",) + cases.ADDITIVE if m in methods]
    if "content" not in additive or len(additive) < 2:
        return {}
    progress.start("additive methods vs content, interleaved")
    return measure.interleaved_forward(
        {method: cases.case_inputs(method, *headline) for method in additive}, threads,
        rounds=5 if quick else 15)


def report_only(path, out) -> int:
    """The .md and charts of a run, from its .json, into `out` under the run's name."""
    with open(path) as f:
        data = json.load(f)
    os.makedirs(out, exist_ok=True)
    base = os.path.join(out, os.path.splitext(os.path.basename(path))[0])
    data.setdefault("files", {})["charts"] = charts.draw(data, base)
    with open(base + ".md", "w") as f:
        f.write(markdown.render(data))
    print(f"wrote {base}.md" + "".join(f", {p}" for p in data["files"]["charts"]))
    return 0


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
