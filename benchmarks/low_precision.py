#!/usr/bin/env python
"""bfloat16 and float16 through posenc's C kernels against float32 (issue 16).

    python benchmarks/low_precision.py [--quick] [--out DIR] [--methods ...] [--threads 2]

At the headline shape B=8, H=12, n=m=512, d=dv=64, one process, the peers
measured in the same run:

* the machine's peaks (posenc_bench.machine.dtype_peaks): float32 FMA on the
  widest vector ISA, bfloat16 dot products (VDPBF16PS) where the CPU has
  AVX512-BF16 (elsewhere posenc's bfloat16 runs float32 FMAs, whose peak is
  then bfloat16's);
* content logits: posenc float32 / bfloat16 / float16 (into a preallocated
  out=), torch.matmul(q, kᵀ) in float32 and bfloat16 (out=), as GFLOP/s
  (2·B·H·n·m·d / time) and as a fraction of the peak of their dtype;
* every method: logits forward and backward, fused attention forward and
  forward+backward, float32 against bfloat16 and float16 (time ratio), the
  float32 and bfloat16 times as fractions of their dtype's peak (content's
  FLOPs, DIRECTION_FLOPS: what every method does beyond them counts as cost).

Timings: median and spread (min, max) of repeated calls after a warm-up;
a method's dtypes are timed in turns, call by call, so that a slow stretch
of the machine hits them alike.
Results: <out>/low-precision-<date>.json and .md.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from posenc_bench.machine import (cpu_family, cpu_model, dtype_peaks, peaks_text,  # noqa: E402
                                  remeasure_peaks)
from posenc_bench.report import save_run  # noqa: E402
HEADLINE = dict(B=8, H=12, n=512, d=64)
LOW = ("bfloat16", "float16")


def _dtype(name):
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _cast(x, dtype):
    return x.astype(dtype) if isinstance(x, np.ndarray) and x.dtype.kind == "f" else x


def _stats(m):
    return {"median_s": m["median_s"], "min_s": m["min_s"], "max_s": max(m["times_s"]),
            "repeats": m["repeats"]}


def measure_content(torch, shape, threads, timing):
    """GFLOP/s of the content logits: posenc per dtype, torch.matmul per dtype."""
    import posenc
    from posenc_bench.cases import case_inputs
    from posenc_bench.measure import measure, _timed

    B, H, n, d = shape["B"], shape["H"], shape["n"], shape["d"]
    flops = 2.0 * B * H * n * n * d
    (q, k), kwargs = case_inputs("content", B, H, n, n, d)
    posenc.set_num_threads(threads)
    rows = []
    for name in ("float32",) + LOW:
        dt = _dtype(name)
        qd, kd = q.astype(dt), k.astype(dt)
        out = np.empty((B, H, n, n), dtype=dt)
        m = measure(_timed(lambda: posenc.content(qd, kd, out=out, **kwargs)), **timing)
        rows.append({"impl": "posenc", "dtype": name, **_stats(m), "gflops": flops / m["median_s"] / 1e9})
    if torch is not None:
        torch.set_num_threads(threads)
        for name, tdt in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
            qt = torch.from_numpy(q).to(tdt)
            kt = torch.from_numpy(k).to(tdt).transpose(-1, -2)
            out = torch.empty((B, H, n, n), dtype=tdt)
            with torch.no_grad():
                m = measure(_timed(lambda: torch.matmul(qt, kt, out=out)), **timing)
            rows.append({"impl": "torch.matmul", "dtype": name, **_stats(m),
                         "gflops": flops / m["median_s"] / 1e9})
    return rows


def measure_method(method, shape, threads, timing):
    """Seconds of each direction, per dtype, for one method (NumPy API); the
    dtypes of a direction taken in turns (measure_interleaved), so that their
    ratios see the same machine."""
    import posenc
    from posenc_bench.cases import case_inputs, upstream_gradient
    from posenc_bench.measure import measure_interleaved, _timed

    B, H, n, d = shape["B"], shape["H"], shape["n"], shape["d"]
    args, kwargs = case_inputs(method, B, H, n, n, d)
    rng = np.random.default_rng(7)
    v = rng.standard_normal((B, H, n, d), dtype=np.float32)
    d_out = rng.standard_normal((B, H, n, d), dtype=np.float32)
    G = upstream_gradient(B, H, n, n)
    posenc.set_num_threads(threads)
    logits = getattr(posenc, method)
    backward = getattr(posenc, method + "_backward")
    attention = getattr(posenc, method + "_attention")
    attention_backward = getattr(posenc, method + "_attention_backward")

    def calls(dt):
        """direction -> the call of one dtype."""
        a = [_cast(x, dt) for x in args]
        kw = {key: _cast(x, dt) for key, x in kwargs.items()}
        vd, dod, Gd = v.astype(dt), d_out.astype(dt), G.astype(dt)
        out = np.empty((B, H, n, n), dtype=dt)
        q, k, rest = a[0], a[1], a[2:]

        def attention_step():
            o, lse = attention(q, k, vd, *rest, **kw)
            return attention_backward(dod, q, k, vd, *rest, o, lse, **kw)

        return {"logits_fwd": lambda: logits(*a, out=out, **kw),
                "logits_bwd": lambda: backward(Gd, *a, **kw),
                "attention_fwd": lambda: attention(q, k, vd, *rest, **kw),
                "attention_fwd_bwd": attention_step}

    by_dtype = {name: calls(_dtype(name)) for name in ("float32",) + LOW}
    result = {name: {} for name in by_dtype}
    for direction in DIRECTIONS:
        taken = measure_interleaved({name: _timed(c[direction]) for name, c in by_dtype.items()},
                                    **timing)
        for name, m in taken.items():
            result[name][direction] = _stats(m)
    return result


DIRECTIONS = ("logits_fwd", "logits_bwd", "attention_fwd", "attention_fwd_bwd")
# x B H n m d: the logits' product (2), its backward's dq and dk (4); the attention's two
# products (4), its backward's recomputed logits, dV, dP, dq and dk (10 more)
DIRECTION_FLOPS = {"logits_fwd": 2, "logits_bwd": 4, "attention_fwd": 4, "attention_fwd_bwd": 14}


def _ms(s):
    return f"{s * 1e3:.1f}"


def _spread(r):
    return f"{_ms(r['median_s'])} ({_ms(r['min_s'])}–{_ms(r['max_s'])})"


def render(data) -> str:
    shape = data["shape"]
    peaks = data["peaks"]
    lines = [f"# bfloat16 / float16 through posenc ({data['date']})", "",
             f"{data['machine']}; {data['threads']} threads; B={shape['B']}, H={shape['H']}, "
             f"n=m={shape['n']}, d=dv={shape['d']}; median (min–max) ms of repeated calls.", ""]
    lines += [f"Measured peaks ({data['threads']} threads): {peaks_text(data)}.", "",
              "## Content logits", "",
              "| implementation | dtype | ms | GFLOP/s | of its dtype's peak |", "|---|---|---|---|---|"]
    for r in data["content"]:
        peak = peaks.get("bfloat16" if r["dtype"] == "bfloat16" else "float32")
        frac = f"{r['gflops'] * 1e9 / peak:.0%}" if peak and r["dtype"] != "float16" else "—"
        lines.append(f"| {r['impl']} | {r['dtype']} | {_spread(r)} | {r['gflops']:.0f} | {frac} |")
    by = {(r["impl"], r["dtype"]): r["gflops"] for r in data["content"]}
    if ("posenc", "bfloat16") in by:
        lines += ["", f"posenc bf16 ÷ posenc float32 throughput: "
                  f"{by[('posenc', 'bfloat16')] / by[('posenc', 'float32')]:.2f}× (target ≥ 1.6×)"]
        if ("torch.matmul", "bfloat16") in by:
            lines.append(f"posenc bf16 ÷ torch bf16 matmul: "
                         f"{by[('posenc', 'bfloat16')] / by[('torch.matmul', 'bfloat16')]:.2f}× (target ≥ 2×)")
    flops = shape["B"] * shape["H"] * shape["n"] ** 2 * shape["d"]

    def of_peak(dtype, direction, r):
        peak = peaks.get(dtype)
        return f"{DIRECTION_FLOPS[direction] * flops / r['median_s'] / peak:.0%}" if peak else "—"

    lines += ["", "## Every method: float32 time ÷ low-precision time (target ≥ 1.5×)", "",
              "% peak: content's FLOPs (DIRECTION_FLOPS x B H n m d) over the median time, as a "
              "fraction of the dtype's peak.", "",
              "| method | direction | float32 ms | % peak | bfloat16 ms | % peak | f32 ÷ bf16 | "
              "float16 ms | f32 ÷ f16 |", "|---|---|---|---|---|---|---|---|---|"]
    for method, res in data["methods"].items():
        for direction in DIRECTIONS:
            f32, bf, fp = (res[k][direction] for k in ("float32",) + LOW)
            lines.append(f"| {method} | {direction} | {_spread(f32)} | "
                         f"{of_peak('float32', direction, f32)} | {_spread(bf)} | "
                         f"{of_peak('bfloat16', direction, bf)} | "
                         f"{f32['median_s'] / bf['median_s']:.2f} | {_spread(fp)} | "
                         f"{f32['median_s'] / fp['median_s']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    import posenc
    from posenc._registry import METHODS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="B=2, fewer calls (a smoke run)")
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    parser.add_argument("--methods", nargs="*", default=list(METHODS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-torch", action="store_true")
    args = parser.parse_args(argv)
    shape = dict(HEADLINE, B=2) if args.quick else dict(HEADLINE)
    # 25 calls: a ratio of medians of 9 moved by 0.1 between runs on this VM
    timing = dict(repeats=3, max_seconds=1.0) if args.quick else dict(repeats=25, max_seconds=8.0)
    torch = None
    if not args.no_torch:
        try:
            import torch
        except ImportError:
            print("torch is not installed: torch.matmul not measured")
    print("peaks ...", flush=True)
    data = {"date": datetime.date.today().isoformat(), "threads": args.threads, "shape": shape,
            "machine": f"CPU {cpu_model()} ({cpu_family()}), posenc ISA {posenc.get_isa()}",
            **dtype_peaks(args.threads, 0.2 if args.quick else 1.0)}
    print("content logits ...", flush=True)
    data["content"] = measure_content(torch, shape, args.threads, timing)
    data["methods"] = {}
    for method in args.methods:
        print(f"{method} ...", flush=True)
        data["methods"][method] = measure_method(method, shape, args.threads, timing)
    remeasure_peaks(data, args.threads, 0.2 if args.quick else 1.0)
    text = render(data)
    print(text)
    base = save_run(args.out, f"low-precision-{data['date']}{'-quick' if args.quick else ''}",
                    data, text)
    print(f"wrote {base}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
