"""What a call costs beyond its arithmetic, at sizes where little else is left,
on one thread (`torch.set_num_threads(1)`, `posenc.set_num_threads(1)`):

(a) `posenc.torch.t5` forward+backward (`A = t5(q, k, bias); A.backward(G)`,
    q, k and bias requiring grad) against `posenc.torch.native.t5` the same,
    at B=32, H=4, n=m=24, d=8, float32: the ratio of their times;
(b) `posenc.t5(q, k, bias)` at B=H=n=m=d=1 (bias (1, 32)): microseconds per
    call, beside NumPy's own small-array call (`np.add` of two 1-element
    arrays) for scale;
(c) a decoding step through `posenc.torch.t5_attention` (B=1, H=8, one query
    at query_offset = m - 1 of m = 512 keys, d=64, causal, float32, no tensor
    requiring grad)
    against the same step through the NumPy call `posenc.t5_attention` on
    the tensors' arrays: what `posenc.torch` adds, in microseconds.

Rounds alternate the callables, so a burst of interference hits both; each
round times a run of calls in a row.  Medians and the quartiles over rounds;
the ratio of (a) is the median of the rounds' ratios.
"""

from __future__ import annotations

import gc
import statistics
import time

import numpy as np

import posenc

TORCH_SHAPE = (32, 4, 24, 24, 8)        # B, H, n, m, d
TINY_SHAPE = (1, 1, 1, 1, 1)
DECODE_SHAPE = (1, 8, 1, 512, 64)       # B, H, n, m, d: one query, query_offset m - 1
TARGETS = {"torch_ratio": 0.6, "tiny_us": 4.0, "decode_overhead_us": 15.0}
FULL = {"rounds": 21, "torch_calls": 40, "decode_calls": 400, "tiny_calls": 2000}
QUICK = {"rounds": 5, "torch_calls": 5, "decode_calls": 20, "tiny_calls": 200}


def _in_turns(calls: dict, rounds: int, per_round: int) -> dict:
    """name -> seconds per call in each round; the callables take turns, each
    called `per_round` times in a row per round, after one warm-up round."""
    per_call = {name: [] for name in calls}
    enabled = gc.isenabled()
    gc.disable()
    try:
        for round_ in range(rounds + 1):
            for name, call in calls.items():
                start = time.perf_counter()
                for _ in range(per_round):
                    call()
                if round_:
                    per_call[name].append((time.perf_counter() - start) / per_round)
    finally:
        if enabled:
            gc.enable()
    return per_call


def _spread(times: list) -> dict:
    quartiles = statistics.quantiles(times, n=4) if len(times) > 1 else times * 3
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times),
            "q1_s": quartiles[0], "q3_s": quartiles[2], "times_s": times}


def _torch_calls(torch):
    from posenc import torch as posenc_torch
    from posenc.torch import native

    B, H, n, m, d = TORCH_SHAPE
    generator = torch.Generator().manual_seed(0)
    q, k = (torch.randn(B, H, size, d, generator=generator) for size in (n, m))
    bias = torch.randn(H, 32, generator=generator)
    leaves = [t.requires_grad_(True) for t in (q, k, bias)]
    G = torch.randn(B, H, n, m, generator=generator)

    def forward_backward(function):
        def call():
            function(q, k, bias).backward(G)
            for leaf in leaves:
                leaf.grad = None
        return call

    return {"posenc.torch.t5": forward_backward(posenc_torch.t5),
            "posenc.torch.native.t5": forward_backward(native.t5)}


def _decode_calls(torch):
    from posenc import torch as posenc_torch

    B, H, n, m, d = DECODE_SHAPE
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, n, d, generator=generator)
    k, v = (torch.randn(B, H, m, d, generator=generator) for _ in range(2))
    bias = torch.randn(H, 32, generator=generator)
    arrays = [t.numpy() for t in (q, k, v, bias)]
    options = {"causal": True, "query_offset": m - n}

    # no tensor requires grad: the step a generation loop runs (under one no_grad of its
    # own, entered once, not per call)
    return {"posenc.torch.t5_attention": lambda: posenc_torch.t5_attention(q, k, v, bias,
                                                                          **options),
            "posenc.t5_attention": lambda: posenc.t5_attention(*arrays, **options)}


def _tiny_calls():
    rng = np.random.default_rng(0)
    q, k = (rng.standard_normal(TINY_SHAPE[:4], dtype=np.float32) for _ in range(2))
    bias = rng.standard_normal((1, 32), dtype=np.float32)
    a, b = np.ones(1), np.ones(1)
    return {"posenc.t5": lambda: posenc.t5(q, k, bias), "np.add": lambda: np.add(a, b)}


def _row(what: str, measured: str, required: str, passed: bool, detail: str) -> dict:
    return {"what": what, "measured": measured, "required": required,
            "verdict": "PASS" if passed else "SHORT", "detail": detail}


def _verdicts(result: dict) -> list:
    """Rows (what, measured, required, verdict, detail) for the report."""
    rows = []
    torch_part = result.get("torch")
    if torch_part:
        ours, peer = torch_part["posenc.torch.t5"], torch_part["posenc.torch.native.t5"]
        # paired by round: a burst of interference inflates one round of both
        ratios = _spread([a / b for a, b in zip(ours["times_s"], peer["times_s"])])
        ratio = ratios["median_s"]
        B, H, n, m, d = TORCH_SHAPE
        rows.append(_row(
            f"posenc.torch.t5 fwd+bwd ÷ posenc.torch.native.t5, B={B} H={H} n={n} m={m} d={d} "
            "float32", f"{ratio:.2f}×", f"<= {TARGETS['torch_ratio']}×",
            ratio <= TARGETS["torch_ratio"],
            f"median of the ratios of {result['rounds']} rounds of {result['torch_calls']} calls "
            f"each, quartiles {ratios['q1_s']:.2f}–{ratios['q3_s']:.2f}; median "
            f"{ours['median_s'] * 1e6:.0f} vs {peer['median_s'] * 1e6:.0f} µs per call"))
    decode = result.get("decode")
    if decode:
        ours, numpy_call = decode["posenc.torch.t5_attention"], decode["posenc.t5_attention"]
        # paired by round, as (a)
        extra = _spread([a - b for a, b in zip(ours["times_s"], numpy_call["times_s"])])
        us = extra["median_s"] * 1e6
        B, H, n, m, d = DECODE_SHAPE
        rows.append(_row(
            f"posenc.torch.t5_attention decoding step − posenc.t5_attention, B={B} H={H} n={n} "
            f"m={m} d={d} float32", f"{us:.1f} µs", f"<= {TARGETS['decode_overhead_us']:g} µs",
            us <= TARGETS["decode_overhead_us"],
            f"median of the differences of {result['rounds']} rounds of {result['decode_calls']} "
            f"calls each, quartiles {extra['q1_s'] * 1e6:.1f}–{extra['q3_s'] * 1e6:.1f} µs; median "
            f"{ours['median_s'] * 1e6:.1f} vs {numpy_call['median_s'] * 1e6:.1f} µs per call"))
    tiny, numpy_add = result["tiny"]["posenc.t5"], result["tiny"]["np.add"]
    us = tiny["median_s"] * 1e6
    rows.append(_row(
        "posenc.t5 per call, B=H=n=m=d=1, bias (1, 32)", f"{us:.2f} µs",
        f"<= {TARGETS['tiny_us']:g} µs", us <= TARGETS["tiny_us"],
        f"quartiles {tiny['q1_s'] * 1e6:.2f}–{tiny['q3_s'] * 1e6:.2f} µs over {result['rounds']} "
        f"rounds of {result['tiny_calls']} calls; NumPy's np.add of two 1-element arrays "
        f"{numpy_add['median_s'] * 1e6:.2f} µs ({tiny['median_s'] / numpy_add['median_s']:.0f}× "
        "that)"))
    return rows


def measure_overhead(torch=None, quick: bool = False) -> dict:
    """Both measurements at one thread; (a) only with torch.  JSON-ready."""
    plan = QUICK if quick else FULL
    previous = posenc.get_num_threads(), torch.get_num_threads() if torch else None
    posenc.set_num_threads(1)
    if torch:
        torch.set_num_threads(1)
    try:
        result = {"threads": 1, "targets": TARGETS, **plan}
        if torch:
            result["torch"] = {name: _spread(times) for name, times in _in_turns(
                _torch_calls(torch), plan["rounds"], plan["torch_calls"]).items()}
            result["decode"] = {name: _spread(times) for name, times in _in_turns(
                _decode_calls(torch), plan["rounds"], plan["decode_calls"]).items()}
        result["tiny"] = {name: _spread(times) for name, times in _in_turns(
            _tiny_calls(), plan["rounds"], plan["tiny_calls"]).items()}
    finally:
        posenc.set_num_threads(previous[0])
        if torch:
            torch.set_num_threads(previous[1])
    result["rows"] = _verdicts(result)
    return result


def text(result: dict) -> str:
    return "\n".join(f"{r['verdict']:5s} {r['what']}: {r['measured']} (target "
                     f"{r['required']}); {r['detail']}" for r in result["rows"])
