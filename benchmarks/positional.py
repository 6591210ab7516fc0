#!/usr/bin/env python
"""The encodings people train today on the fused kernels: RoPE, ALiBi, KERPLE, any
bias of the offset and FoX's data-dependent decay (the engine's first term
module), against fused content and against what a user has without posenc.

    python benchmarks/positional.py [--quick] [--threads 2] [--out DIR]

At B=8, H=12, n=m=512, d=dv=64, one process, the peers measured in the same run,
every comparison timed in turns (measure_interleaved: a slow stretch of the
machine hits all of a comparison's calls alike), float32 and bfloat16:

* fused forward and forward+backward (q, k, v and the parameters requiring grad:
  ALiBi's slopes, KERPLE's r1 and r2, relative_bias's table, FoX's gates (both
  directions: the attention is not causal); RoPE's tables are constants) of
  content, rope, alibi, kerple, relative_bias, fox, relative_bias_2d, cope (its
  table 64 x d, as posenc_bench.cases gives it): each ÷ content's;
* rope with per-token tables (spec §3.16: one (1, H, n, r) table per head requiring
  grad, as RoPE-Mixed's learned frequencies give them), "rope/token", ÷ content's;
* rope against HuggingFace's path: transformers' Llama apply_rotary_pos_emb on
  q and k, then torch SDPA; the same with the per-token tables (requiring grad);
* alibi, kerple, fox, relative_bias_2d and cope with learnable parameters against
  torch SDPA with the bias materialised from them (torch-native, requiring grad:
  SDPA's math kernel; for fox the differences of the gates' prefix sums, as
  x-transformers' DataDependentAlibi forms them; for cope x-transformers' CoPE module
  on the content logits, its table (64, d) shared by the heads);
* the peak memory of forward+backward at n = 4096 (a process per case, VmHWM
  above the inputs; benchmarks/attention.py's worker), each ÷ content's.

Every time is also given as a fraction of the machine's FMA peak of its dtype
(posenc._machine, measured in the run), counting the attention's
4 B H n m d multiply-add FLOPs forward and 14 B H n m d forward+backward (the
backward recomputes q.kᵀ: 2 more products for dV, dP, dq, dk and the logits,
counted once each; the positional terms and the softmax are not counted).
Results: <out>/positional-<date>.json and .md.
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import attention as A  # noqa: E402  (its inputs, turns and peak-memory worker)
from posenc_bench.machine import (cpu_family, cpu_model, dtype_peaks, peaks_text,  # noqa: E402
                                  remeasure_peaks)
from posenc_bench.report import script_main  # noqa: E402

HEADLINE = dict(B=8, H=12, n=512, d=64)
METHODS = ("content", "rope", "alibi", "kerple", "relative_bias", "fox", "relative_bias_2d",
           "cope")
BIASED = ("alibi", "kerple", "fox", "relative_bias_2d", "cope")   # against SDPA + the bias
DTYPES = ("float32", "bfloat16")
FLOPS = {"fwd": 4, "fwd+bwd": 14}        # x B H n m d


def _inputs(torch, method, shape, dtype):
    """(tensors, keywords, v, d_out) of one fused call in `dtype`, leaves requiring grad
    where the method has a gradient."""
    import posenc

    args, kwargs, v, d_out = A._inputs(torch, method, shape["B"], shape["H"], shape["n"],
                                       shape["d"])
    constant = posenc.REGISTRY[method].constant

    def cast(name, x):
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            return x
        return x.detach().to(dtype).requires_grad_(name not in constant)

    names = posenc.REGISTRY[method].tensors
    args = [cast(name, a) for name, a in zip(names, args)]
    kwargs = {name: cast(name, x) for name, x in kwargs.items()}
    return args, kwargs, cast("v", v), d_out.to(dtype)


def _fused(torch, method, args, kwargs, v):
    import posenc.torch as pt
    return lambda: getattr(pt, method + "_attention")(args[0], args[1], v, *args[2:],
                                                     **kwargs).out


TOKEN = "rope/token"      # rope with per-token tables


def _token_inputs(torch, rope_inputs):
    """rope's call with per-token tables: the (P, r) tables' rows per head (1, H, n, r),
    requiring grad (learned angles), the keys' the same rows."""
    args, kwargs, v, d_out = rope_inputs
    q, k, cos, sin = args
    H, n = q.shape[1], q.shape[2]
    per_token = lambda t: t.detach()[:n][None, None].expand(1, H, n, -1).contiguous()
    tables = [per_token(t).requires_grad_() for t in (cos, sin, cos, sin)]
    return [q, k, tables[0], tables[1]], dict(kwargs, cos_k=tables[2], sin_k=tables[3]), v, d_out


def _hf_rope(torch, args, v):
    """HF Llama's rotation (apply_rotary_pos_emb with the full-width cos, sin) + SDPA."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    q, k, cos, sin = args
    if cos.dim() == 4:     # per-token tables (requiring grad): concatenated inside the call
        def call():
            cos_full, sin_full = (torch.cat([t, t], dim=-1)[0] for t in (cos, sin))  # (H, n, 2r)
            q_rot, k_rot = apply_rotary_pos_emb(q, k, cos_full, sin_full, unsqueeze_dim=0)
            return torch.nn.functional.scaled_dot_product_attention(q_rot, k_rot, v)
        return call
    cos_full, sin_full = (torch.cat([t, t], dim=-1)[:q.shape[2]][None] for t in (cos, sin))

    def call():
        q_rot, k_rot = apply_rotary_pos_emb(q, k, cos_full, sin_full)
        return torch.nn.functional.scaled_dot_product_attention(q_rot, k_rot, v)
    return call


def _sdpa_bias(torch, method, args, kwargs, v):
    """SDPA with the method's bias materialised by its torch-native formula, from the
    parameters requiring grad (what a user writes: SDPA's math kernel then); CoPE's by
    x-transformers' CoPE module where it is installed."""
    import posenc.torch as pt

    q, k = args[0], args[1]
    scale = q.shape[-1] ** -0.5
    if method == "cope":
        try:
            from x_transformers.x_transformers import CoPE
        except ImportError:
            pass
        else:
            table = args[2]
            module = CoPE(dim=q.shape[-1], heads=q.shape[1], max_pos=table.shape[0]).to(q.dtype)
            module.pos_emb = torch.nn.Parameter(table)

            def x_transformers():
                sim = torch.matmul(q, k.transpose(-1, -2)) * scale
                return torch.nn.functional.scaled_dot_product_attention(
                    q, k, v, attn_mask=module(q, sim), scale=scale)
            return x_transformers

    def call():
        with pt.use_native():
            bias = getattr(pt, method)(q, k, *args[2:], **kwargs) - torch.matmul(
                q, k.transpose(-1, -2)) * scale
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias,
                                                               scale=scale)
    return call


def _turns(torch, calls, d_out, repeats, max_seconds):
    return {direction: A._time_turns(torch, calls, d_out, direction == "fwd+bwd", repeats,
                                     max_seconds)
            for direction in ("fwd", "fwd+bwd")}


def run(args) -> dict:
    import torch
    import posenc

    torch.set_num_threads(args.threads)
    posenc.set_num_threads(args.threads)
    shape = dict(HEADLINE, B=2, H=4, n=128) if args.quick else HEADLINE
    repeats, max_seconds = (3, 0.3) if args.quick else (9, 3.0)
    results = {"machine": {"cpu": cpu_model(), "cpu_family": cpu_family(),
                           "torch": torch.__version__,
                           "posenc": posenc.__version__, "isa": posenc.get_isa(),
                           "threads": args.threads},
               "shape": shape, **dtype_peaks(args.threads, 0.2 if args.quick else 1.0),
               "fused": {}, "hf_rope": {}, "sdpa_bias": {}, "memory": {}}
    for name in DTYPES:
        dtype = getattr(torch, name)
        inputs = {m: _inputs(torch, m, shape, dtype) for m in METHODS}
        inputs[TOKEN] = _token_inputs(torch, inputs["rope"])
        d_out = inputs["content"][3]
        calls = {m: _fused(torch, m.split("/")[0], *inputs[m][:3]) for m in inputs}
        results["fused"][name] = _turns(torch, calls, d_out, repeats, max_seconds)
        print(f"{name} fused fwd / fwd+bwd ms: " + ", ".join(
            f"{m} {results['fused'][name]['fwd'][m]['median_ms']:.1f}/"
            f"{results['fused'][name]['fwd+bwd'][m]['median_ms']:.1f}" for m in calls),
            flush=True)
        for label in ("rope", TOKEN):
            try:
                hf = _hf_rope(torch, inputs[label][0], inputs[label][2])
            except ImportError as error:
                results["hf_rope"][f"{name} {label}"] = {"error": str(error)}
            else:
                results["hf_rope"][f"{name} {label}"] = _turns(
                    torch, {"posenc": calls[label], "hf+sdpa": hf}, d_out, repeats, max_seconds)
        for method in BIASED:
            args_, kwargs_, v, _ = inputs[method]
            results["sdpa_bias"].setdefault(name, {})[method] = _turns(
                torch, {"posenc": calls[method],
                        "sdpa+bias": _sdpa_bias(torch, method, args_, kwargs_, v)},
                d_out, max(3, repeats // 3), max_seconds)
        del inputs, calls
    memory_n = 512 if args.quick else 4096
    for method in METHODS:
        spec = dict(method=method, variant="fused", threads=args.threads, n=memory_n,
                    d=shape["d"], B=shape["B"], H=shape["H"])
        results["memory"][method] = dict(A._peak(spec), n=memory_n)
        print(f"peak at n={memory_n}: {method} "
              f"{results['memory'][method].get('peak_bytes', 0) / 2**20:.0f} MiB", flush=True)
    remeasure_peaks(results, args.threads, 0.2 if args.quick else 1.0)
    return results


def _fraction(results, dtype, direction, ms) -> str:
    shape = results["shape"]
    peak = results["peaks"].get(dtype)
    if not peak:
        return "—"
    flops = FLOPS[direction] * shape["B"] * shape["H"] * shape["n"] ** 2 * shape["d"]
    return f"{flops / (ms * 1e-3) / peak:.0%}"


def _cell(r) -> str:
    return f"{r['median_ms']:.1f} ({r['min_ms']:.1f}–{r['max_ms']:.1f})"


def _versus(results, first: list, dtype, direction, r, peer: str) -> str:
    """A table row: the first cells, the direction, posenc's time and its fraction of the
    peak, the peer's time, the speed-up."""
    ours, theirs = r["posenc"]["median_ms"], r[peer]["median_ms"]
    return "| " + " | ".join(first + [direction, _cell(r["posenc"]),
                                      _fraction(results, dtype, direction, ours),
                                      _cell(r[peer]), f"{theirs / ours:.2f}×"]) + " |"


def markdown(results: dict) -> str:
    shape, machine = results["shape"], results["machine"]
    lines = [f"# Fused RoPE, ALiBi, KERPLE, relative biases, FoX, CoPE: B={shape['B']} H={shape['H']} "
             f"n=m={shape['n']} d=dv={shape['d']}, {machine['threads']} threads",
             "", f"CPU {machine['cpu']} ({machine.get('cpu_family', '?')}); posenc "
             f"{machine['posenc']} ({machine['isa']}), torch "
             f"{machine['torch']}. Measured FMA peaks: {peaks_text(results)}. Median ms (min–max); "
             "each table's calls timed in turns; % = of the dtype's FMA peak "
             "(4 B H n m d FLOPs forward, 14 forward+backward).", ""]
    for dtype, turns in results["fused"].items():
        lines += [f"## Fused attention, {dtype}", "",
                  "| method | fwd ms | % peak | ÷ content | fwd+bwd ms | % peak | ÷ content |",
                  "|---|---|---|---|---|---|---|"]
        for method in turns["fwd"]:
            row = [method]
            for direction in ("fwd", "fwd+bwd"):
                r = turns[direction][method]
                row += [_cell(r), _fraction(results, dtype, direction, r["median_ms"]),
                        f"{r['median_ms'] / turns[direction]['content']['median_ms']:.2f}×"]
            lines.append("| " + " | ".join(row) + " |")
        lines += ["", "Target: every method within 1.1× of content, forward and forward+backward "
                  "(per-token rope 1.15×; cope 1.6× forward, 2× forward+backward).", ""]
    lines += ["## rope against HuggingFace's rotation + torch SDPA", "",
              "| dtype | direction | posenc rope ms | % peak | HF apply_rotary_pos_emb + SDPA ms | "
              "speed-up |", "|---|---|---|---|---|---|"]
    for case, turns in results["hf_rope"].items():
        dtype = case.split()[0]
        if "error" in turns:
            lines.append(f"| {dtype} | — | {turns['error']} | | | |")
            continue
        lines += [_versus(results, [case], dtype, direction, r, "hf+sdpa")
                  for direction, r in turns.items()]
    lines += ["", "Target: faster forward+backward than HF's path.", "",
              "## alibi, kerple, fox, relative_bias_2d, cope with learnable parameters against "
              "SDPA with the bias materialised (requiring grad; cope's by x-transformers' CoPE)",
              "",
              "| dtype | method | direction | posenc ms | % peak | SDPA + bias ms | speed-up |",
              "|---|---|---|---|---|---|---|"]
    for dtype, methods in results["sdpa_bias"].items():
        for method, turns in methods.items():
            lines += [_versus(results, [dtype, method], dtype, direction, r, "sdpa+bias")
                      for direction, r in turns.items()]
    lines += ["", "Target: forward+backward ≥ 4× faster.", "",
              "## Peak memory of forward+backward, float32", "",
              "| method | n | peak MiB above the inputs | ÷ content |", "|---|---|---|---|"]
    content = results["memory"].get("content", {}).get("peak_bytes")
    for method, entry in results["memory"].items():
        if "peak_bytes" not in entry:
            lines.append(f"| {method} | {entry['n']} | {entry.get('error', '?')} | |")
            continue
        ratio = f"{entry['peak_bytes'] / content:.3f}×" if content else "—"
        lines.append(f"| {method} | {entry['n']} | {entry['peak_bytes'] / 2**20:.0f} | {ratio} |")
    lines += ["", "Target: as content's."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    return script_main(argv, doc=__doc__, prefix="positional", run=run, markdown=markdown,
                       out=os.path.join(HERE, "results"))


if __name__ == "__main__":
    sys.exit(main())
