#!/usr/bin/env python
"""The attention shapes of today's models on the fused kernels (issue 28, SPEC §7):
grouped-query heads, a sliding window, packed documents, soft-capping and sinks,
each against the same attention without the shape and against torch SDPA.

    python benchmarks/shapes.py [--quick] [--threads 2] [--cases gqa window ...] [--out DIR]

One process, float32, every comparison's calls timed in turns
(measure_interleaved: a slow stretch of the machine hits all of a comparison's
calls alike), forward and forward+backward (gradients of q, k, v and the sinks):

* GQA, Llama-3's shape: B=1, H=32, H_kv=8, d=128, n=m=2048, causal, rope:
  posenc with k, v of 8 heads | posenc with k, v repeated to 32 heads first |
  HF's rotation (apply_rotary_pos_emb) + SDPA(enable_gqa=True); and the peak
  memory of forward+backward of each (a process per case, VmHWM above the
  inputs), beside the size of one (B, H, m, d) copy;
* a sliding window of 512 keys (HF sliding_window=512: window=(511, 0)) at
  B=1, H=4, d=64, n=m=8192, causal, content: ÷ full causal attention, and
  SDPA with the window materialised as an (n, m) bool mask;
* 8 documents of 512 packed in n=4096 (document ids; B=1, H=8, d=64, causal,
  content): ÷ the unpacked attention over 4096, ÷ 8 separate calls of 512;
* softcap=30 and sinks (learnable, one per head) at B=8, H=12, n=m=512, d=64,
  content: each ÷ plain fused attention;
* a GQA decoding step (n=1 at query_offset m-1, H=32, H_kv=8, d=128, m=4096,
  rope): ÷ an MHA step with 8 heads, and SDPA(enable_gqa=True), forward.

Times also as a fraction of the machine's float32 FMA peak (posenc._machine,
measured in the run) for the pairs a call computes: 4 d multiply-adds per
visible (query, key) pair forward, 14 forward+backward (as positional.py counts).
Results: <out>/shapes-<date>.json and .md.
"""

from __future__ import annotations

import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import attention as A  # noqa: E402  (its turns and VmHWM reader)
from posenc_bench.machine import cpu_family, cpu_model, dtype_peaks, peaks_text  # noqa: E402
from posenc_bench.report import script_main  # noqa: E402

FLOPS = {"fwd": 4, "fwd+bwd": 14}        # x d per visible (query, key) pair

SHAPES = {
    "gqa": dict(B=1, H=32, H_kv=8, d=128, n=2048),
    "window": dict(B=1, H=4, d=64, n=8192, window=512),
    "documents": dict(B=1, H=8, d=64, n=4096, documents=8),
    "softcap_sinks": dict(B=8, H=12, d=64, n=512, softcap=30.0),
    "decode": dict(B=1, H=32, H_kv=8, d=128, m=4096),
}
# --quick: every size an eighth (d a quarter, B at most 2), the counts and the cap kept
QUICK = {case: {key: (value if key in ("documents", "softcap") else
                      max(1, value // 4) if key == "d" else min(value, 2) if key == "B" else
                      max(1, value // 8))
                for key, value in shape.items()} for case, shape in SHAPES.items()}


def _tensor(torch, rng, *shape, grad=True):
    return torch.from_numpy(rng.standard_normal(shape, dtype=np.float32)).requires_grad_(grad)


def _rope(torch, n, d):
    import posenc
    cos, sin = posenc.rope_tables(n, d)
    return torch.from_numpy(cos), torch.from_numpy(sin)


def _gqa_calls(torch, s, rng):
    """(calls, d_out, visible pairs per (b, h)) of the GQA comparison."""
    import posenc.torch as pt
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    B, H, G, n, d = s["B"], s["H"], s["H_kv"], s["n"], s["d"]
    q, k, v = _tensor(torch, rng, B, H, n, d), _tensor(torch, rng, B, G, n, d), \
        _tensor(torch, rng, B, G, n, d)
    cos, sin = _rope(torch, n, d)
    cos_full, sin_full = (torch.cat([t, t], dim=-1)[None] for t in (cos, sin))

    def repeated():
        return pt.rope_attention(q, k.repeat_interleave(H // G, 1), v.repeat_interleave(H // G, 1),
                                 cos, sin, causal=True).out

    def sdpa():
        q_rot, k_rot = apply_rotary_pos_emb(q, k, cos_full, sin_full)
        return torch.nn.functional.scaled_dot_product_attention(q_rot, k_rot, v, is_causal=True,
                                                               enable_gqa=True)
    calls = {"posenc GQA": lambda: pt.rope_attention(q, k, v, cos, sin, causal=True).out,
             "posenc, k, v repeated": repeated, "HF rotation + SDPA(enable_gqa)": sdpa}
    return calls, _tensor(torch, rng, B, H, n, d, grad=False), n * (n + 1) / 2


def _window_calls(torch, s, rng):
    import posenc.torch as pt

    B, H, n, d, w = s["B"], s["H"], s["n"], s["d"], s["window"]
    q, k, v = (_tensor(torch, rng, B, H, n, d) for _ in range(3))
    rows = torch.arange(n)[:, None]
    allowed = (torch.arange(n)[None, :] <= rows) & (torch.arange(n)[None, :] > rows - w)
    calls = {"posenc window": lambda: pt.content_attention(q, k, v, causal=True,
                                                           window=(w - 1, 0)).out,
             "posenc full causal": lambda: pt.content_attention(q, k, v, causal=True).out,
             "SDPA + window mask": lambda: torch.nn.functional.scaled_dot_product_attention(
                 q, k, v, attn_mask=allowed)}
    pairs = sum(min(i + 1, w) for i in range(n))
    return calls, _tensor(torch, rng, B, H, n, d, grad=False), pairs


def _documents_calls(torch, s, rng):
    import posenc.torch as pt

    B, H, n, d, count = s["B"], s["H"], s["n"], s["d"], s["documents"]
    length = n // count
    q, k, v = (_tensor(torch, rng, B, H, n, d) for _ in range(3))
    ids = torch.arange(n).div(length, rounding_mode="floor")[None].expand(B, n).contiguous()

    def separate():
        return torch.cat([pt.content_attention(q[:, :, t:t + length], k[:, :, t:t + length],
                                               v[:, :, t:t + length], causal=True).out
                          for t in range(0, n, length)], dim=2)
    calls = {"posenc packed": lambda: pt.content_attention(q, k, v, causal=True, document_q=ids,
                                                           document_k=ids).out,
             "posenc unpacked over n": lambda: pt.content_attention(q, k, v, causal=True).out,
             f"posenc, {count} calls": separate}
    return calls, _tensor(torch, rng, B, H, n, d, grad=False), count * length * (length + 1) / 2


def _softcap_sinks_calls(torch, s, rng):
    import posenc.torch as pt

    B, H, n, d = s["B"], s["H"], s["n"], s["d"]
    q, k, v = (_tensor(torch, rng, B, H, n, d) for _ in range(3))
    sinks = _tensor(torch, rng, H)
    calls = {"plain": lambda: pt.content_attention(q, k, v).out,
             "softcap": lambda: pt.content_attention(q, k, v, softcap=s["softcap"]).out,
             "sinks": lambda: pt.content_attention(q, k, v, sinks=sinks).out}
    return calls, _tensor(torch, rng, B, H, n, d, grad=False), n * n


def _decode_calls(torch, s, rng):
    import posenc.torch as pt

    B, H, G, m, d = s["B"], s["H"], s["H_kv"], s["m"], s["d"]
    q = _tensor(torch, rng, B, H, 1, d, grad=False)
    k, v = (_tensor(torch, rng, B, G, m, d, grad=False) for _ in range(2))
    q_mha = _tensor(torch, rng, B, G, 1, d, grad=False)
    cos, sin = _rope(torch, m, d)
    step = dict(causal=True, query_offset=m - 1)
    calls = {"posenc GQA step": lambda: pt.rope_attention(q, k, v, cos, sin, **step).out,
             f"posenc MHA step, {G} heads": lambda: pt.rope_attention(q_mha, k, v, cos, sin,
                                                                      **step).out,
             "SDPA(enable_gqa) step": lambda: torch.nn.functional.scaled_dot_product_attention(
                 q, k, v, enable_gqa=True)}
    return calls, None, m


CASES = {"gqa": _gqa_calls, "window": _window_calls, "documents": _documents_calls,
         "softcap_sinks": _softcap_sinks_calls, "decode": _decode_calls}


# ------------------------------------------------------------------ peak memory (GQA)

def _peak_worker(spec: dict) -> dict:
    """In a subprocess: the peak RSS of one forward+backward of a GQA call above its inputs."""
    import torch
    torch.set_num_threads(spec["threads"])
    import posenc
    posenc.set_num_threads(spec["threads"])
    rng = np.random.default_rng(0)
    small = dict(spec["shape"], n=16)
    calls, d_out, _ = _gqa_calls(torch, small, rng)          # libraries and autograd warm
    calls[spec["name"]]().backward(d_out)
    calls, d_out, _ = _gqa_calls(torch, spec["shape"], rng)
    base = A._vm_hwm()
    calls[spec["name"]]().backward(d_out)
    return {"peak_bytes": (A._vm_hwm() - base) * 1024}


# ------------------------------------------------------------------ run and report

def run(args) -> dict:
    import torch
    import posenc

    torch.set_num_threads(args.threads)
    posenc.set_num_threads(args.threads)
    shapes = QUICK if args.quick else SHAPES
    repeats, max_seconds = (3, 0.3) if args.quick else (args.repeats or 7, 6.0)
    results = {"machine": {"cpu": cpu_model(), "cpu_family": cpu_family(),
                           "torch": torch.__version__, "posenc": posenc.__version__,
                           "isa": posenc.get_isa(), "threads": args.threads},
               "shapes": shapes, **dtype_peaks(args.threads, 0.2 if args.quick else 1.0),
               "cases": {}, "memory": {}}
    rng = np.random.default_rng(0)
    for case in args.cases:
        make = CASES[case]
        calls, d_out, pairs = make(torch, shapes[case], rng)
        directions = ("fwd",) if d_out is None else ("fwd", "fwd+bwd")
        results["cases"][case] = {"pairs": pairs, "times": {
            direction: A._time_turns(torch, calls, d_out, direction == "fwd+bwd", repeats,
                                     max_seconds) for direction in directions}}
        print(f"{case}: " + "; ".join(
            f"{direction} " + ", ".join(f"{name} {r['median_ms']:.2f}" for name, r in turns.items())
            for direction, turns in results["cases"][case]["times"].items()) + " ms", flush=True)
        del calls
    gqa = shapes["gqa"]
    for name in () if "gqa" not in args.cases else ("posenc GQA", "posenc, k, v repeated", "HF rotation + SDPA(enable_gqa)"):
        results["memory"][name] = A._peak(dict(name=name, shape=gqa, threads=args.threads),
                                          script=__file__)
        print(f"peak: {name} {results['memory'][name]}", flush=True)
    if "gqa" in args.cases:
        results["memory"]["copy_bytes"] = gqa["B"] * gqa["H"] * gqa["n"] * gqa["d"] * 4
    return results


def _cell(r) -> str:
    return f"{r['median_ms']:.2f} ({r['min_ms']:.2f}–{r['max_ms']:.2f})"


def _fraction(results, case, direction, ms, name) -> str:
    s = results["shapes"][case]
    peak = results["peaks"].get("float32")
    pairs = results["cases"][case]["pairs"]
    if not peak or "SDPA" in name or "unpacked" in name or "full" in name or "MHA" in name:
        return "—"
    heads = s["H"] * s["B"]
    return f"{FLOPS[direction] * s['d'] * pairs * heads / (ms * 1e-3) / peak:.0%}"


TARGETS = {
    "gqa": ("posenc, k, v repeated", "≤ 1.05× the repeated call; faster than SDPA(enable_gqa)"),
    "window": ("posenc full causal", "forward+backward ≤ 0.2× full causal; faster than SDPA + mask"),
    "documents": ("posenc unpacked over n", "≤ 0.2× unpacked; ≤ 1.3× the separate calls"),
    "softcap_sinks": ("plain", "each ≤ 1.1× plain"),
    "decode": (None, "≤ 1.3× an MHA step of H_kv heads; faster than SDPA(enable_gqa)"),
}


def markdown(results: dict) -> str:
    machine = results["machine"]
    lines = ["# Attention shapes (SPEC §7): GQA, sliding window, packed documents, softcap, "
             f"sinks; float32, {machine['threads']} threads", "",
             f"CPU {machine['cpu']} ({machine.get('cpu_family', '?')}); posenc "
             f"{machine['posenc']} ({machine['isa']}), torch {machine['torch']}. Measured FMA "
             f"peaks: {peaks_text(results)}. Median ms (min–max); each table's calls timed in turns; "
             "% = of the float32 FMA peak for the (query, key) pairs the call sees "
             "(4 d multiply-adds each forward, 14 forward+backward).", ""]
    for case, entry in results["cases"].items():
        s = results["shapes"][case]
        base, target = TARGETS[case]
        lines += [f"## {case}: " + ", ".join(f"{k}={v}" for k, v in s.items()), "",
                  "| call | direction | ms | % peak | ÷ first | ÷ " + (base or "—") + " |",
                  "|---|---|---|---|---|---|"]
        for direction, turns in entry["times"].items():
            first = next(iter(turns.values()))["median_ms"]
            for name, r in turns.items():
                against = (f"{r['median_ms'] / turns[base]['median_ms']:.3f}×"
                           if base in turns else "—")
                lines.append(f"| {name} | {direction} | {_cell(r)} | "
                             f"{_fraction(results, case, direction, r['median_ms'], name)} | "
                             f"{r['median_ms'] / first:.3f}× | {against} |")
        lines += ["", f"Target: {target}.", ""]
    memory = results["memory"]
    if not memory:
        return "\n".join(lines) + "\n"
    lines += ["## Peak memory of a GQA forward+backward (the gqa shape)", "",
              f"One (B, H, m, d) float32 copy of k or v: {memory['copy_bytes'] / 2**20:.0f} MiB.",
              "", "| call | peak MiB above the inputs |", "|---|---|"]
    for name, entry in memory.items():
        if name != "copy_bytes":
            value = (f"{entry['peak_bytes'] / 2**20:.0f}" if "peak_bytes" in entry
                     else entry.get("error", "?"))
            lines.append(f"| {name} | {value} |")
    return "\n".join(lines) + "\n"


def _arguments(parser):
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument("--repeats", type=int, help="timed turns per comparison (default 7)")


def main(argv=None) -> int:
    return script_main(argv, doc=__doc__, prefix="shapes", run=run, markdown=markdown,
                       out=os.path.join(HERE, "results"), add_arguments=_arguments,
                       worker=_peak_worker)


if __name__ == "__main__":
    sys.exit(main())
