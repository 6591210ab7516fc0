"""The run's data as the report reads it: derived rates (GFLOP/s, fraction of
the FMA peak, of the store-bandwidth floor), the logits' targets, the DIET
paper's Table 1 next to this CPU's figures, all in one JSON-ready dict.
markdown.py and charts.py draw from that dict alone."""

from __future__ import annotations

import argparse
import datetime
import json
import os

from . import cases

# DIET (Chen et al. 2021), Table 1, quoted exactly: step time relative to the
# baseline BERT on TPU v2 (whole model; Training = forward+backward+update).
PAPER_TABLE1 = {
    "shaw": {"BERT_BASE training": "+13%", "BERT_BASE inference": "+33%",
             "BERT_SMALL training": "+24%", "BERT_SMALL inference": "+65%"},
    "tupe": {"BERT_BASE training": "+1%", "BERT_BASE inference": "+19%",
             "BERT_SMALL training": "+4%", "BERT_SMALL inference": "+27%"},
    "diet_abs": {"BERT_BASE training": "+0%", "BERT_BASE inference": "+0%",
                 "BERT_SMALL training": "+0%", "BERT_SMALL inference": "+1%"},
    "diet_rel": {"BERT_BASE training": "+0%", "BERT_BASE inference": "+0%",
                 "BERT_SMALL training": "+0%", "BERT_SMALL inference": "+0%"},
}
PAPER_NAMES = {"shaw": "Shaw et al. (2018)", "tupe": "Ke et al. (2020)", "diet_abs": "DIET-ABS",
               "diet_rel": "DIET-REL"}
PAPER_CAPTION = ("Table 1: Pre-training and inference time of Transformers with different "
                 "position encoding methods in comparison to the baseline BERT model on TPU v2.")

def save_run(out: str, stem: str, data: dict, text: str) -> str:
    """<out>/<stem>.json (a run's data) and <stem>.md (its page); the path without
    the suffix.  The benchmark scripts' one way of writing their results.  A stem
    already taken (a second run of the day) gets the first free letter, b, c, ...:
    a run never overwrites another's files."""
    os.makedirs(out, exist_ok=True)
    base = os.path.join(out, stem)
    for letter in "bcdefghijklmnopqrstuvwxyz":
        if not (os.path.exists(base + ".json") or os.path.exists(base + ".md")):
            break
        base = os.path.join(out, stem + letter)
    else:
        raise FileExistsError(f"{os.path.join(out, stem)}: every letter's files exist")
    with open(base + ".json", "w") as f:
        json.dump(data, f, indent=1)
    with open(base + ".md", "w") as f:
        f.write(text)
    return base


def script_main(argv, *, doc: str, prefix: str, run, markdown, out: str, add_arguments=None,
                worker=None) -> int:
    """A benchmark script's command line: --quick, --threads, --out, --report-only JSON
    (the page of a saved run), the script's own arguments (add_arguments(parser)) and,
    with `worker`, a hidden --worker SPEC for its subprocesses; a run is saved as
    <out>/<prefix>-<date>[-quick].json and .md (save_run) and its page printed."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny shapes: checks that it runs")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=out)
    parser.add_argument("--report-only", metavar="JSON", help="the .md of a run, from its JSON")
    if worker is not None:
        parser.add_argument("--worker", help=argparse.SUPPRESS)
    if add_arguments is not None:
        add_arguments(parser)
    args = parser.parse_args(argv)
    if worker is not None and args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return 0
    if args.report_only:
        with open(args.report_only) as f:
            print(markdown(json.load(f)))
        return 0
    results = run(args)
    text = markdown(results)
    stem = save_run(args.out, f"{prefix}-{datetime.date.today().isoformat()}"
                    + ("-quick" if args.quick else ""), results, text)
    print(text)
    print(f"wrote {stem}.json, .md")
    return 0


IMPL_NAMES = {"posenc": "posenc", "posenc_out": "posenc (out=)", "eager": "PyTorch eager",
              "compile": "torch.compile", "reference": "posenc.reference (NumPy)",
              "torch_matmul": "torch.matmul(q, kᵀ)·s"}


# ------------------------------------------------------------------ derived figures

def ms_text(seconds):
    return "—" if seconds is None else (f"{seconds * 1e3:.3g}" if seconds < 1 else
                                        f"{seconds * 1e3:.0f}")


def ratio_text(x, digits=2):
    return "—" if x is None else f"{x:.{digits}f}×"


def pct_text(x):
    return "—" if x is None else f"{x * 100:.0f}%" if x >= 0.1 else f"{x * 100:.1f}%"


def derive(results, limits, threads):
    """Add FLOPs, GFLOP/s and the fractions of the machine's limits to every timing."""
    peak, bandwidth = limits["peak_flops"], limits["store_bandwidth"]
    for r in results:
        if "median_s" not in r:
            continue
        T = r["threads"] or 1          # the NumPy reference: einsum runs on one core
        T = T if T in peak else max(threads)
        r["flops"] = cases.flops(r["method"], r["direction"], *r["shape"])
        r["gflops_per_s"] = r["flops"] / r["median_s"] / 1e9
        r["fraction_of_peak"] = r["flops"] / r["median_s"] / peak[T]
        if r["direction"] == "fwd":
            r["logits_bytes"] = cases.logits_bytes(*r["shape"][:4])
            r["store_floor_s"] = r["logits_bytes"] / bandwidth[T]
            r["fraction_of_store_floor"] = r["store_floor_s"] / r["median_s"]


def find(results, method, impl, direction, threads, shape):
    for r in results:
        if (r["method"], r["impl"], r["direction"], r["threads"]) == (method, impl, direction,
                                                                      threads) \
                and tuple(r["shape"]) == tuple(shape) and "median_s" in r:
            return r
    return None


def matched(results, method, impl, direction, threads, shape):
    """(peer, posenc) timings at the same shape: the peer's own if it was shrunk."""
    peer = find(results, method, impl, direction, threads, shape)
    if peer is None:
        peer = next((r for r in results if (r["method"], r["impl"], r["direction"], r["threads"])
                     == (method, impl, direction, threads) and "median_s" in r
                     and tuple(r.get("requested_shape", ())) == tuple(shape)), None)
    if peer is None:
        return None, None
    return peer, find(results, method, "posenc", direction, threads, peer["shape"])


def targets(results, memory, methods, shape, T, interleaved=None):
    """The logits' speed and memory targets (content vs torch.matmul, additive methods
    vs content, heavy methods vs eager, peak memory vs the logits) at the headline
    shape and the largest thread count."""
    rows = []

    def row(target, method, measured, required, ok, detail, info=False):
        verdict = "info" if info else ("n/a" if ok is None else "PASS" if ok else "SHORT")
        rows.append({"target": target, "method": method, "measured": measured,
                     "required": required, "verdict": verdict, "detail": detail})

    def speed(method, impl, direction, minimum, info=False):
        peer, ours = matched(results, method, impl, direction, T, shape)
        label = f"{direction} speed-up over {cases_impl(impl)}"
        required = "(none)" if info else f">= {minimum}×"
        if peer is None or ours is None:
            row(label, method, None, required, None, "not measured", info)
            return
        ratio = peer["median_s"] / ours["median_s"]
        note = "" if tuple(peer["shape"]) == tuple(shape) else \
            f" (at B={peer['shape'][0]} H={peer['shape'][1]}: memory)"
        row(label, method, ratio, required, ratio >= minimum,
            f"{ms_text(peer['median_s'])} ms vs posenc {ms_text(ours['median_s'])} ms{note}", info)

    if "content" in methods:
        for direction in ("fwd", "bwd"):
            impl = "torch_matmul" if find(results, "content", "torch_matmul", direction, T,
                                          shape) else "eager"
            speed("content", impl, direction, 0.9)
    # kernel against kernel: content and each additive method timed in turns
    # into preallocated out= (measure.interleaved_forward); the minimum over
    # the rounds is the ratio, medians shown beside it
    base = (interleaved or {}).get("content")
    for method in (m for m in cases.ADDITIVE if m in methods):
        ours = (interleaved or {}).get(method)
        label = "fwd time / content fwd (out=, interleaved, min)"
        if base is None or ours is None:
            row(label, method, None, "<= 1.15×", None, "not measured")
            continue
        ratio = ours["min_s"] / base["min_s"]
        row(label, method, ratio, "<= 1.15×", ratio <= 1.15,
            f"min {ms_text(ours['min_s'])} vs {ms_text(base['min_s'])} ms, median "
            f"{ms_text(ours['median_s'])} vs {ms_text(base['median_s'])} ms "
            f"({ours['median_s'] / base['median_s']:.2f}×) over {ours['rounds']} rounds")
    for method in methods:
        if method == "content":
            continue
        minimum = 3.0 if method in cases.HEAVY else 1.5
        for direction in ("fwd", "bwd"):
            speed(method, "eager", direction, minimum, info=method in cases.ADDITIVE)
    for m in memory:
        if "method" not in m:
            continue
        ratio = m["peak_above_baseline"] / m["logits_bytes"]
        info = m["impl"] != "posenc" or m["method"] not in cases.MEMORY_METHODS
        row(f"peak memory fwd+bwd / logits ({IMPL_NAMES.get(m['impl'], m['impl'])})",
            m["method"], ratio, "< 2×", ratio < 2,
            f"{m['peak_above_baseline'] / 2**20:.0f} MiB over a logits of "
            f"{m['logits_bytes'] / 2**20:.0f} MiB", info)
    return rows


def cases_impl(impl):
    return IMPL_NAMES.get(impl, impl)


def table1(results, methods, shape, T):
    """Each method's forward and forward+backward time relative to content (same impl)."""
    rows = []
    for impl in ("posenc", "eager", "compile"):
        cf = find(results, "content", impl, "fwd", T, shape)
        cb = find(results, "content", impl, "bwd", T, shape)
        if cf is None:
            continue
        ordered = [m for m in PAPER_TABLE1 if m in methods] + \
            [m for m in methods if m not in PAPER_TABLE1 and m != "content"]
        for method in ordered:
            f = find(results, method, impl, "fwd", T, shape)
            b = find(results, method, impl, "bwd", T, shape)
            inference = None if f is None else f["median_s"] / cf["median_s"] - 1
            training = None if (f is None or b is None or cb is None) else \
                (f["median_s"] + b["median_s"]) / (cf["median_s"] + cb["median_s"]) - 1
            if inference is None and training is None and impl != "posenc":
                continue
            rows.append({"method": method, "impl": impl, "inference": inference,
                         "training": training, "paper": PAPER_TABLE1.get(method)})
    return rows


def assemble(*, info, config, timing, threads, methods, limits, results, memory, numpy_matmul,
             skipped, no_torch_reason, compile_methods, quick, budget, duration_s, stamp,
             interleaved=None, overhead=None):
    derive(results, limits, threads)
    T = max(threads)
    headline = tuple(config["headline"])
    return {
        "schema": "posenc-bench/1",
        "date": stamp, "duration_s": duration_s, "quick": quick,
        "machine": info,
        "configuration": {
            "threads": threads, "methods": methods, "timing": timing,
            "headline_shape": list(headline), "grid_shapes": [list(s) for s in config["grid"]],
            "scaling_n": list(config["scaling_n"]), "scaling_work_cap": config["scaling_work"],
            "compile_methods": list(compile_methods), "memory_budget_bytes": budget,
            "torch": no_torch_reason or "used", "parameters": cases.parameters(),
            "flop_legend": cases.FLOP_LEGEND, "flop_formulas": cases.FLOP_FORMULAS,
        },
        "limits": {"fma": limits["fma"], "store": limits["store"],
                   "peak_flops": {str(k): v for k, v in limits["peak_flops"].items()},
                   "store_bandwidth": {str(k): v for k, v in limits["store_bandwidth"].items()}},
        "results": results,
        "memory": memory,
        "numpy_matmul": numpy_matmul,
        "additive_interleaved": interleaved or {},
        "targets": targets(results, memory, methods, headline, T, interleaved or {}),
        "table1": table1(results, methods, headline, T),
        "skipped": skipped,
        **({"overhead": overhead} if overhead else {}),
    }
