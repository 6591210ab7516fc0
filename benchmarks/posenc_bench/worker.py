"""Measurements that need a process of their own, run by the suite (measure.run_worker):

* ``memory``: peak resident memory of forward+backward above a baseline taken
  once the inputs and G are allocated and touched (VmHWM; the peak is reset
  through /proc/self/clear_refs where Linux allows, so several methods share
  one process);
* ``numpy_matmul``: the NumPy peer ``np.matmul(q, k.swapaxes(-1, -2)) * s``
  and its backward, under the environment the parent chose (OPENBLAS_CORETYPE,
  OPENBLAS_NUM_THREADS), which OpenBLAS reads only when it loads.

Usage: PYTHONPATH=benchmarks python -m posenc_bench.worker '<json spec>'; prints one JSON
line.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import sys
import time

import numpy as np

from . import cases
from .machine import openblas_core, steering_env
from .measure import measure, torch_inputs


def _maxrss_bytes() -> int:
    """The peak resident set: VmHWM where Linux has it (the mark clear_refs
    resets; getrusage's ru_maxrss may keep an older peak), else ru_maxrss."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024


def _current_rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return None


def _reset_peak() -> bool:
    """Reset the peak RSS (Linux >= 4.0: writing 5 to clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _run_posenc(method, args, kwargs, G):
    import posenc

    logits = getattr(posenc, method)(*args, **kwargs)          # kept alive, as training does
    grads = getattr(posenc, method + "_backward")(G, *args, **kwargs)
    return logits, grads


def _run_eager(method, args, kwargs, G):
    import torch

    from posenc.torch import native

    targs, tkwargs, leaves = torch_inputs(torch, args, kwargs, requires_grad=True)
    logits = getattr(native, method)(*targs, **tkwargs)
    torch.autograd.backward(logits, torch.from_numpy(G))
    return logits, [leaf.grad for leaf in leaves]


def memory(spec: dict) -> dict:
    impl, threads = spec["impl"], spec["threads"]
    B, H, n, m, d = spec["shape"]
    if impl == "posenc":
        import posenc
        posenc.set_num_threads(threads)
        run = _run_posenc
    else:
        import torch
        torch.set_num_threads(threads)
        import posenc.torch.native  # imported before the baseline
        run = _run_eager
    results, remaining = [], list(spec["methods"])
    while remaining:
        method = remaining.pop(0)
        # warm-up at a tiny size: libraries load their code and thread pools, while
        # nothing of the measured size can be left cached below the baseline
        tiny_args, tiny_kwargs = cases.case_inputs(method, 1, 1, 16, 16, d)
        run(method, tiny_args, tiny_kwargs, cases.upstream_gradient(1, 1, 16, 16))
        del tiny_args, tiny_kwargs
        args, kwargs = cases.case_inputs(method, B, H, n, m, d)
        G = cases.upstream_gradient(B, H, n, m)
        gc.collect()
        reset = _reset_peak()
        baseline = _maxrss_bytes()
        current = _current_rss_bytes()
        out = run(method, args, kwargs, G)
        peak = _maxrss_bytes()
        del out
        results.append({"method": method, "impl": impl, "threads": threads,
                        "shape": [B, H, n, m, d],
                        "peak_above_baseline": peak - baseline, "baseline_maxrss": baseline,
                        "baseline_rss": current, "peak_reset": reset,
                        "logits_bytes": cases.logits_bytes(B, H, n, m)})
        del args, kwargs, G
        gc.collect()
        if not reset:     # the next method needs a fresh process for an honest peak
            break
    return {"results": results, "remaining": remaining}


def _numpy_content(q, k, G, scale):
    """Timers of the NumPy content peer: forward and its hand-written backward."""
    def forward():
        start = time.perf_counter()
        logits = np.matmul(q, k.swapaxes(-1, -2)) * scale
        elapsed = time.perf_counter() - start
        del logits
        return elapsed

    def backward():
        start = time.perf_counter()
        grad_q = np.matmul(G, k) * scale
        grad_k = np.matmul(G.swapaxes(-1, -2), q) * scale
        elapsed = time.perf_counter() - start
        del grad_q, grad_k
        return elapsed

    return {"fwd": forward, "bwd": backward}


def numpy_matmul(spec: dict) -> dict:
    timing = spec["timing"]
    records = []
    for B, H, n, m, d in spec["shapes"]:
        (q, k), _ = cases.case_inputs("content", B, H, n, m, d)
        G = cases.upstream_gradient(B, H, n, m)
        for direction, run_once in _numpy_content(q, k, G, np.float32(d ** -0.5)).items():
            records.append({"shape": [B, H, n, m, d], "direction": direction,
                            **measure(run_once, **timing)})
        del q, k, G
        gc.collect()
    return {"records": records, "openblas_core": openblas_core(), "env": steering_env()}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    spec = json.loads(argv[0])
    answer = {"memory": memory, "numpy_matmul": numpy_matmul}[spec["kind"]](spec)
    sys.stdout.write(json.dumps(answer) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
