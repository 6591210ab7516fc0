#!/usr/bin/env python
"""The fused positional attention (SPEC §6) against what a user has today.

    python benchmarks/attention.py [--quick] [--out DIR] [--methods ...] [--threads 2]

For every method, at B=8, H=12, n=m=512, d=dv=64, float32 (the headline
shape), forward and forward+backward (q, k, v and the method's parameters
requiring grad; the backward of out against a fixed d_out):

* fused      posenc.torch.<m>_attention on CPU (the C kernels; no (B, H, n, m) tensor)
* logits     posenc.torch.<m> logits + torch softmax + matmul (the layer's path before)
* sdpa+bias  torch SDPA with the method's positional term materialised as attn_mask
             (computed by posenc.torch.native, requiring grad as in training)
* sdpa       torch SDPA with no positions at all (today's best CPU attention)
* flex       FlexAttention compiled, forward only (T5 score_mod; content), where it runs

plus causal against non-causal (fused content and t5, the two timed in turns),
the fused forwards of content and the methods whose target is a ratio to it,
again in turns, the peak memory of
forward+backward at n = 4096 (a subprocess per case, VmHWM above its inputs)
against that layer's (B, H, n, m) float32 logits, and a scaling table n = 512 ...
8192 at B=1, H=12 (time and peak memory, fused content and t5 beside SDPA),
with a chart.  Timings: median and spread (min, max) of repeated calls after a
warm-up, in one process, the peers measured in the same run.  Results:
<out>/attention-<date>.json and .md (and a PNG when matplotlib is installed).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADLINE = dict(B=8, H=12, n=512, d=64)
FORWARD_TARGETS = ("t5", "tupe", "diet_abs", "diet_rel", "deberta")   # fused fwd ÷ content's
SCALING = (512, 1024, 2048, 4096, 8192)


def _inputs(torch, method, B, H, n, d, seed=0):
    """Tensors of one call (float32, requiring grad) and its keywords."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from posenc_bench.cases import case_inputs

    args, kwargs = case_inputs(method, B, H, n, n, d, seed=seed)
    rng = np.random.default_rng(seed + 1)
    tensor = lambda x: (torch.from_numpy(x).requires_grad_(x.dtype.kind == "f")
                        if isinstance(x, np.ndarray) else x)
    v = torch.from_numpy(rng.standard_normal((B, H, n, d), dtype=np.float32)).requires_grad_()
    d_out = torch.from_numpy(rng.standard_normal((B, H, n, d), dtype=np.float32))
    return [tensor(a) for a in args], {k: tensor(x) for k, x in kwargs.items()}, v, d_out


def _variants(torch, method, args, kwargs, v, causal=False):
    """name -> callable returning out (B, H, n, dv)."""
    import posenc.torch as pt
    from posenc.torch import native

    F = torch.nn.functional
    q, k = args[0], args[1]
    n = q.shape[2]
    mask = torch.ones(n, n, dtype=torch.bool).tril() if causal else None
    content_scale = native._scale(kwargs.get("scale"), q.shape[-1],
                                  {"deberta": 3, "tupe": 2}.get(method, 1))
    if method == "t5":
        content_scale = 1.0

    def fused():
        return getattr(pt, method + "_attention")(*args[:2], v, *args[2:], **kwargs,
                                                  causal=causal).out

    def logits():
        A = getattr(pt, method)(*args, **kwargs)
        if causal:
            A = A.masked_fill(~mask, float("-inf"))
        return torch.matmul(torch.softmax(A, dim=-1), v)

    def sdpa_bias():
        with pt.use_native():
            positional = getattr(pt, method)(*args, **kwargs) - torch.matmul(
                q, k.transpose(-1, -2)) * content_scale
        if causal:
            positional = positional.masked_fill(~mask, float("-inf"))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=positional, scale=content_scale)

    def sdpa():
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    found = {"fused": fused, "logits": logits, "sdpa": sdpa}
    if method != "content":
        found["sdpa+bias"] = sdpa_bias
    return found


def _time(torch, call, d_out, backward: bool, repeats: int, max_seconds: float) -> dict:
    def once():
        out = call()
        if backward:
            out.backward(d_out)
        return out

    with torch.set_grad_enabled(backward):
        once()                                   # warm-up (and torch.compile's first call)
        times = []
        start = time.perf_counter()
        while len(times) < repeats and (len(times) < 2 or time.perf_counter() - start < max_seconds):
            t = time.perf_counter()
            once()
            times.append(time.perf_counter() - t)
    return _ms_stats(times)


def _ms_stats(times) -> dict:
    return {"median_ms": 1e3 * statistics.median(times), "min_ms": 1e3 * min(times),
            "max_ms": 1e3 * max(times), "calls": len(times)}


def _time_turns(torch, calls: dict, d_out, backward: bool, repeats: int, max_seconds: float) -> dict:
    """_time of several calls taken in turns (measure_interleaved), for the
    targets that are ratios of two of them: name -> _time's dict."""
    from posenc_bench.measure import measure_interleaved

    def timed(call):
        def once():
            start = time.perf_counter()
            out = call()
            if backward:
                out.backward(d_out)
            return time.perf_counter() - start
        return once

    with torch.set_grad_enabled(backward):
        taken = measure_interleaved({name: timed(call) for name, call in calls.items()},
                                    repeats, max_seconds)
    return {name: _ms_stats(m["times_s"]) for name, m in taken.items()}


def _flex(torch, method, args, kwargs, v, d_out, repeats, max_seconds):
    """FlexAttention compiled, forward (content, t5): its numbers, or why not."""
    if method not in ("content", "t5"):
        return None
    try:
        from torch.nn.attention.flex_attention import flex_attention
        import posenc.torch as pt   # noqa: F401  (the bucket index of the T5 score_mod)
        from posenc.torch._common import bucket_index

        q, k = args[0].detach(), args[1].detach()
        score_mod = None
        if method == "t5":
            bias = args[2].detach()
            index = bucket_index("t5", (kwargs["num_buckets"], kwargs["max_distance"], 1),
                                 q.shape[2], k.shape[2], q)

            def score_mod(score, b, h, i, j):
                return score + bias[h, index[i, j]]
        compiled = torch.compile(flex_attention)
        scale = 1.0 if method == "t5" else None
        result = _time(torch, lambda: compiled(q, k, v.detach(), score_mod=score_mod, scale=scale),
                       d_out, False, repeats, max_seconds)
        return result
    except Exception as exc:                      # noqa: BLE001  reported, not hidden
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"}


def _peak_worker(spec: dict) -> dict:
    """In a subprocess: the peak RSS of one forward+backward above its inputs."""
    import torch
    torch.set_num_threads(spec["threads"])
    import posenc
    posenc.set_num_threads(spec["threads"])
    small = _inputs(torch, spec["method"], 1, 1, 8, spec["d"])    # libraries and autograd warm
    _variants(torch, spec["method"], *small[:3])[spec["variant"]]().backward(small[3])
    args, kwargs, v, d_out = _inputs(torch, spec["method"], spec["B"], spec["H"], spec["n"], spec["d"])
    call = _variants(torch, spec["method"], args, kwargs, v)[spec["variant"]]
    base = _vm_hwm()
    out = call()
    out.backward(d_out)
    peak = (_vm_hwm() - base) * 1024
    # what any implementation returns: out and the gradient of every input
    leaves = [x for x in (*args, *kwargs.values(), v) if isinstance(x, torch.Tensor) and x.grad is not None]
    results = out.untyped_storage().nbytes() + sum(x.grad.untyped_storage().nbytes() for x in leaves)
    return {"peak_bytes": peak, "result_bytes": results}


def _vm_hwm() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def _peak(spec: dict, script: str = __file__) -> dict:
    """`script --worker spec` in a subprocess (its peak-memory worker): its JSON answer."""
    result = subprocess.run([sys.executable, os.path.abspath(script), "--worker", json.dumps(spec)],
                            capture_output=True, text=True, timeout=1800)
    if result.returncode != 0:
        return {"error": (result.stderr.strip().splitlines() or ["failed"])[-1][:200]}
    return json.loads(result.stdout.strip().splitlines()[-1])


def run(args) -> dict:
    import torch
    import posenc

    torch.set_num_threads(args.threads)
    posenc.set_num_threads(args.threads)
    shape = dict(HEADLINE, B=2, H=4, n=128) if args.quick else HEADLINE
    repeats, max_seconds = (3, 0.5) if args.quick else (7, 3.0)
    results = {"machine": {"python": platform.python_version(), "torch": torch.__version__,
                           "posenc": posenc.__version__, "isa": posenc.get_isa(),
                           "threads": args.threads, "cpu": platform.processor()},
               "shape": shape, "methods": {}, "causal": {}, "memory": {}, "scaling": []}
    for method in args.methods:
        tensors, kwargs, v, d_out = _inputs(torch, method, shape["B"], shape["H"], shape["n"],
                                            shape["d"])
        row = {}
        for name, call in _variants(torch, method, tensors, kwargs, v).items():
            row[name] = {"fwd": _time(torch, call, d_out, False, repeats, max_seconds),
                         "fwd+bwd": _time(torch, call, d_out, True, repeats, max_seconds)}
        row["flex"] = _flex(torch, method, tensors, kwargs, v, d_out, repeats, max_seconds)
        results["methods"][method] = row
        print(f"{method:9s} " + "  ".join(
            f"{name} {r['fwd']['median_ms']:.1f}/{r['fwd+bwd']['median_ms']:.1f} ms"
            for name, r in row.items() if r and "fwd" in r), flush=True)
        if method in ("content", "t5"):   # causal and non-causal in turns: their ratio
            pair = {"causal": _variants(torch, method, tensors, kwargs, v, causal=True)["fused"],
                    "full": _variants(torch, method, tensors, kwargs, v)["fused"]}
            turns = {direction: _time_turns(torch, pair, d_out, direction == "fwd+bwd",
                                            2 * repeats, max_seconds)
                     for direction in ("fwd", "fwd+bwd")}
            results["causal"][method] = {
                **{direction: t["causal"] for direction, t in turns.items()},
                "full": {direction: t["full"] for direction, t in turns.items()}}
    against = [m for m in ("content",) + FORWARD_TARGETS if m in args.methods]
    if "content" in against and len(against) > 1:   # the forward targets' methods in turns
        calls, d_out = {}, None
        for method in against:
            tensors, kwargs, v, d_out = _inputs(torch, method, shape["B"], shape["H"],
                                                shape["n"], shape["d"])
            calls[method] = _variants(torch, method, tensors, kwargs, v)["fused"]
        results["forward_turns"] = _time_turns(torch, calls, d_out, False, 2 * repeats,
                                               max_seconds)
        del calls
    memory_n = 512 if args.quick else 4096
    for method in ("content", "t5", "deberta"):
        if method not in args.methods:
            continue
        for variant in ("fused", "logits", "sdpa"):
            spec = dict(method=method, variant=variant, threads=args.threads, n=memory_n,
                        d=shape["d"], B=shape["B"], H=shape["H"])
            results["memory"][f"{method}/{variant}"] = dict(_peak(spec), n=memory_n)
    for n in (SCALING[:2] if args.quick else SCALING):
        for method in ("content", "t5"):
            tensors, kwargs, v, d_out = _inputs(torch, method, 1, 12, n, shape["d"])
            for variant in ("fused", "sdpa"):
                call = _variants(torch, method, tensors, kwargs, v)[variant]
                entry = {"n": n, "method": method, "variant": variant,
                         **_time(torch, call, d_out, True, 3 if n <= 2048 else 2, max_seconds)}
                entry.update(_peak(dict(method=method, variant=variant, threads=args.threads,
                                        n=n, d=shape["d"], B=1, H=12)))
                results["scaling"].append(entry)
                print(f"scaling n={n} {method} {variant}: {entry['median_ms']:.1f} ms, "
                      f"peak {entry.get('peak_bytes', 0) / 2**20:.0f} MiB", flush=True)
    return results


def markdown(results: dict) -> str:
    shape = results["shape"]
    lines = [f"# Fused attention, B={shape['B']} H={shape['H']} n=m={shape['n']} d=dv={shape['d']} "
             f"float32, {results['machine']['threads']} threads",
             "", f"posenc {results['machine']['posenc']} ({results['machine']['isa']}), "
             f"torch {results['machine']['torch']}. Median ms (min–max) of repeated calls.", "",
             "| method | fused fwd | fused fwd+bwd | logits+softmax fwd | fwd+bwd | SDPA+bias fwd | "
             "fwd+bwd | SDPA no bias fwd | fwd+bwd | flex fwd | fwd+bwd ÷ SDPA+bias |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    cell = lambda r: f"{r['median_ms']:.1f} ({r['min_ms']:.1f}–{r['max_ms']:.1f})" if r else "—"
    for method, row in results["methods"].items():
        bias = row.get("sdpa+bias")
        flex = row.get("flex")
        flex_cell = ("—" if flex is None else flex.get("error", "")[:60] if "error" in flex
                     else cell(flex))
        speedup = (f"{bias['fwd+bwd']['median_ms'] / row['fused']['fwd+bwd']['median_ms']:.2f}×"
                   if bias else "—")
        lines.append(f"| {method} | {cell(row['fused']['fwd'])} | {cell(row['fused']['fwd+bwd'])} | "
                     f"{cell(row['logits']['fwd'])} | {cell(row['logits']['fwd+bwd'])} | "
                     f"{cell(bias and bias['fwd'])} | {cell(bias and bias['fwd+bwd'])} | "
                     f"{cell(row['sdpa']['fwd'])} | {cell(row['sdpa']['fwd+bwd'])} | {flex_cell} | "
                     f"{speedup} |")
    content = results["methods"].get("content")
    lines += ["", "Targets (measured in this run):", ""]
    if content:
        for direction in ("fwd", "fwd+bwd"):
            ratio = content["fused"][direction]["median_ms"] / content["sdpa"][direction]["median_ms"]
            lines.append(f"* fused content {direction} ÷ SDPA without bias: {ratio:.2f}× (target ≤ 0.6×)")
        turns = results.get("forward_turns", {})
        for method in FORWARD_TARGETS:
            if method in turns:
                ratio = turns[method]["median_ms"] / turns["content"]["median_ms"]
                lines.append(f"* {method} fused fwd ÷ fused content fwd: {ratio:.2f}× "
                             f"(target ≤ 1.2×; the fused forwards timed in turns)")
    for method, row in results["causal"].items():
        for direction in ("fwd", "fwd+bwd"):
            ratio = row[direction]["median_ms"] / row["full"][direction]["median_ms"]
            lines.append(f"* {method} causal ÷ non-causal {direction}: {ratio:.2f}× "
                         f"(target ≤ 0.6×; the two timed in turns)")
    lines += ["", "Peak memory of forward+backward (VmHWM above the inputs, a process per case; "
              "the results are out and the gradients of q, k, v and the parameters, which every "
              "implementation returns; the workspace is the peak above them):", "",
              "| case | n | peak MiB | ÷ (B, H, n, m) float32 logits | results MiB | workspace MiB "
              "| workspace ÷ logits |", "|---|---|---|---|---|---|---|"]
    for name, entry in results["memory"].items():
        logits = shape["B"] * shape["H"] * entry["n"] ** 2 * 4
        if "peak_bytes" in entry:
            line = (f"| {name} | {entry['n']} | {entry['peak_bytes'] / 2**20:.0f} | "
                    f"{entry['peak_bytes'] / logits:.1%} |")
            if "result_bytes" in entry:
                workspace = max(entry["peak_bytes"] - entry["result_bytes"], 0)
                line += (f" {entry['result_bytes'] / 2**20:.0f} | {workspace / 2**20:.0f} | "
                         f"{workspace / logits:.1%} |")
            lines.append(line + (" | | |" if "result_bytes" not in entry else ""))
        else:
            lines.append(f"| {name} | {entry['n']} | {entry.get('error', '?')} | | | | |")
    lines += ["", "Scaling, B=1 H=12, forward+backward:", "",
              "| n | method | variant | ms (min–max) | peak MiB |", "|---|---|---|---|---|"]
    for e in results["scaling"]:
        peak = f"{e['peak_bytes'] / 2**20:.0f}" if "peak_bytes" in e else e.get("error", "?")
        lines.append(f"| {e['n']} | {e['method']} | {e['variant']} | {e['median_ms']:.1f} "
                     f"({e['min_ms']:.1f}–{e['max_ms']:.1f}) | {peak} |")
    return "\n".join(lines) + "\n"


def chart(results: dict, path: str) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for method in ("content", "t5"):
        for variant, style in (("fused", "-o"), ("sdpa", "--s")):
            rows = [e for e in results["scaling"] if e["method"] == method and e["variant"] == variant]
            if not rows:
                continue
            label = f"{method} {'posenc fused' if variant == 'fused' else 'torch SDPA (no bias)'}"
            left.plot([e["n"] for e in rows], [e["median_ms"] for e in rows], style, label=label)
            right.plot([e["n"] for e in rows], [e.get("peak_bytes", np.nan) / 2**20 for e in rows],
                       style, label=label)
    for axis, title in ((left, "forward+backward time (ms)"), (right, "peak memory (MiB)")):
        axis.set_xscale("log", base=2)
        axis.set_yscale("log")
        axis.set_xlabel("n = m (B=1, H=12, d=64)")
        axis.set_title(title)
        axis.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny shapes: checks that it runs")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--methods", nargs="+", default=None)
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(_peak_worker(json.loads(args.worker))))
        return 0
    sys.path.insert(0, ROOT)
    import posenc
    args.methods = args.methods or list(posenc.METHODS)
    results = run(args)
    text = markdown(results)
    from posenc_bench.report import save_run   # benchmarks/ is on sys.path (_inputs, above)
    stem = save_run(args.out, "attention-" + datetime.date.today().isoformat()
                    + ("-quick" if args.quick else ""), results, text)
    drawn = chart(results, stem + ".png")
    print(text)
    print(f"wrote {stem}.json, .md" + (", .png" if drawn else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
