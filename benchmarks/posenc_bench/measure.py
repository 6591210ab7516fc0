"""How the benchmark times things: warm-up + repeats, a progress bar on stderr,
one timer per implementation (posenc, PyTorch eager, torch.compile, the NumPy
reference), and the subprocesses that measure memory and the NumPy matmul peer
under another environment.

torch is imported lazily: the NumPy-only paths run without it.
"""

from __future__ import annotations

import gc
import json
import math
import os
import statistics
import subprocess
import sys
import time

import posenc
from posenc._paths import package_home

perf_counter = time.perf_counter


# ------------------------------------------------------------------ progress

def _clock(seconds: float) -> str:
    seconds = round(seconds)
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class Progress:
    """A plain-text progress bar on stderr, weighted by each task's estimated seconds.

    On a terminal it redraws one line; elsewhere (CI logs, pytest) it prints a
    line every 5 %."""

    def __init__(self, total: float, stream=None, width: int = 28):
        self.total = max(total, 1e-9)
        self.finished = 0.0
        self.began = perf_counter()
        self.stream = stream or sys.stderr
        self.width = width
        self.label = ""
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.last_step = -1

    def start(self, label: str) -> None:
        self.label = label
        self._draw(force=self.tty)

    def done(self, weight: float) -> None:
        self.finished += weight
        self._draw(force=self.tty)

    def note(self, text: str) -> None:
        """A message on its own line (a skipped peer, a failed compile)."""
        if self.tty:
            self.stream.write("\r\033[K")
        self.stream.write(text + "\n")
        self._draw(force=self.tty)

    def _line(self) -> str:
        fraction = min(1.0, self.finished / self.total)
        filled = int(fraction * self.width)
        elapsed = perf_counter() - self.began
        eta = elapsed * (1 - fraction) / fraction if fraction > 0.02 else float("nan")
        eta_text = "?" if math.isnan(eta) else _clock(eta)
        return (f"[{'#' * filled}{'.' * (self.width - filled)}] {fraction * 100:5.1f}% "
                f"{_clock(elapsed)} elapsed, ~{eta_text} left | {self.label}")

    def _draw(self, force: bool) -> None:
        step = int(min(1.0, self.finished / self.total) * 20)
        if self.tty and force:
            self.stream.write("\r\033[K" + self._line()[:200])
        elif step != self.last_step:
            self.stream.write(self._line() + "\n")
        self.last_step = step
        self.stream.flush()

    def close(self) -> None:
        self.finished = self.total
        self.label = "done"
        self._draw(force=True)
        if self.tty:
            self.stream.write("\n")
        self.stream.flush()


# ------------------------------------------------------------------ timing

def measure(run_once, repeats: int, max_seconds: float, warmup: int = 1) -> dict:
    """Time `run_once()` (it returns the seconds of its timed part) after `warmup` calls.

    Stops after `repeats` timed calls, or earlier once `max_seconds` have been
    spent and at least two were timed (the cap that keeps n = 4096 affordable)."""
    gc_enabled = gc.isenabled()
    gc.disable()    # the caller collects between groups: one collection costs ~0.2 s with torch
    try:
        for _ in range(warmup):
            run_once()
        times = []
        began = perf_counter()
        while len(times) < repeats:
            times.append(run_once())
            if len(times) >= min(2, repeats) and perf_counter() - began >= max_seconds:
                break
    finally:
        if gc_enabled:
            gc.enable()
    return {"times_s": times, "median_s": statistics.median(times), "min_s": min(times),
            "repeats": len(times), "warmup": warmup}


def measure_interleaved(run_onces: dict, repeats: int, max_seconds: float,
                        warmup: int = 1) -> dict:
    """measure() of several calls taken in turns (run_onces: name -> run_once):
    each round times every call once, so a slow stretch of the machine or a
    burst of interference hits them alike and their ratios hold; round r
    starts at call r mod k (k calls), so that each call follows each other
    equally often (what ran just before -- another runtime's threads still
    spinning, a slow single-threaded call after which a team wakes -- costs
    short calls alike).  Stops after `repeats` rounds, or once `max_seconds`
    per call have been spent and at least two rounds were timed.  name ->
    measure()'s dict."""
    gc_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(warmup):
            for run_once in run_onces.values():
                run_once()
        times = {name: [] for name in run_onces}
        began, rounds = perf_counter(), 0
        order = list(run_onces.items())
        while rounds < repeats:
            shift = rounds % len(order)
            for name, run_once in order[shift:] + order[:shift]:
                times[name].append(run_once())
            rounds += 1
            if rounds >= min(2, repeats) and perf_counter() - began >= max_seconds * len(run_onces):
                break
    finally:
        if gc_enabled:
            gc.enable()
    return {name: {"times_s": t, "median_s": statistics.median(t), "min_s": min(t),
                   "repeats": len(t), "warmup": warmup} for name, t in times.items()}


def _timed(call):
    def run_once():
        start = perf_counter()
        result = call()
        elapsed = perf_counter() - start
        del result                      # freeing the output is not part of the call
        return elapsed
    return run_once


def time_posenc(method, direction, args, kwargs, G, threads, timing, out=None):
    posenc.set_num_threads(threads)
    if direction == "fwd":
        function = getattr(posenc, method)
        if out is not None:
            return measure(_timed(lambda: function(*args, out=out, **kwargs)), **timing)
        return measure(_timed(lambda: function(*args, **kwargs)), **timing)
    backward = getattr(posenc, method + "_backward")
    return measure(_timed(lambda: backward(G, *args, **kwargs)), **timing)


def interleaved_forward(cases: dict, threads: int, rounds: int = 15) -> dict:
    """Forward times of several posenc methods taken in turns, `rounds` times
    each, into one preallocated out= per method (measure_interleaved): a burst
    of interference then hits every method alike, and the minimum (which
    interference can only raise) compares kernels.  cases: method -> (args, kwargs)."""
    previous = posenc.get_num_threads()
    posenc.set_num_threads(threads)
    try:
        calls = {}
        for method, (args, kwargs) in cases.items():
            fn = getattr(posenc, method)
            out = fn(*args, **kwargs)                                   # warm-up, and the out=
            calls[method] = _timed(lambda fn=fn, args=args, kwargs=kwargs, out=out:
                                   fn(*args, out=out, **kwargs))
        times = measure_interleaved(calls, rounds, float("inf"), warmup=0)
    finally:
        posenc.set_num_threads(previous)
    return {method: {"min_s": t["min_s"], "median_s": t["median_s"], "rounds": rounds}
            for method, t in times.items()}


def time_reference(method, direction, args, kwargs, G, timing):
    from posenc import reference

    if direction == "fwd":
        function = getattr(reference, method)
        return measure(_timed(lambda: function(*args, **kwargs)), **timing)
    backward = getattr(reference, method + "_backward")
    return measure(_timed(lambda: backward(G, *args, **kwargs)), **timing)


def torch_inputs(torch, args, kwargs, requires_grad: bool):
    """Tensors sharing memory with the NumPy inputs; float ones as autograd leaves."""
    leaves = []

    def convert(value):
        if not hasattr(value, "dtype") or not hasattr(value, "shape"):
            return value
        tensor = torch.from_numpy(value)
        if requires_grad and tensor.is_floating_point():
            tensor = tensor.detach().requires_grad_(True)
            leaves.append(tensor)
        return tensor

    return ([convert(a) for a in args], {key: convert(v) for key, v in kwargs.items()}, leaves)


def time_torch(torch, function, direction, args, kwargs, G, threads, timing):
    """Forward: inference under no_grad. Backward: autograd of `function` with upstream
    gradient G, timing only the backward pass (the forward runs untimed before each)."""
    torch.set_num_threads(threads)
    if direction == "fwd":
        targs, tkwargs, _ = torch_inputs(torch, args, kwargs, requires_grad=False)
        with torch.no_grad():
            return measure(_timed(lambda: function(*targs, **tkwargs)), **timing)
    targs, tkwargs, leaves = torch_inputs(torch, args, kwargs, requires_grad=True)
    tG = torch.from_numpy(G)

    def run_once():
        out = function(*targs, **tkwargs)
        start = perf_counter()
        torch.autograd.backward(out, tG)
        elapsed = perf_counter() - start
        for leaf in leaves:
            leaf.grad = None
        return elapsed

    return measure(run_once, **timing)


def compile_first_call(torch, compiled, direction, args, kwargs, G, threads) -> float:
    """Seconds of the first call (forward, or forward+backward): the compile time."""
    torch.set_num_threads(threads)
    requires_grad = direction == "bwd"
    targs, tkwargs, _ = torch_inputs(torch, args, kwargs, requires_grad=requires_grad)
    start = perf_counter()
    if requires_grad:
        out = compiled(*targs, **tkwargs)
        torch.autograd.backward(out, torch.from_numpy(G))
    else:
        with torch.no_grad():
            out = compiled(*targs, **tkwargs)
    elapsed = perf_counter() - start
    del out
    return elapsed


def torch_matmul_content(torch, d):
    """The literal content peer: torch.matmul(q, k.transpose(-1, -2)) * s."""
    scale = d ** -0.5

    def content(q, k):
        return torch.matmul(q, k.transpose(-1, -2)) * scale
    return content


# ------------------------------------------------------------------ subprocesses

SUITE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # benchmarks/


def run_worker(spec: dict, env_changes: dict | None = None, timeout: float = 1800) -> dict:
    """Run posenc_bench.worker in a fresh interpreter; env_changes maps a variable to a
    value, or to None to remove it. Returns its JSON answer, or {'error': ...}.

    The child imports the suite by path (benchmarks/ on PYTHONPATH) and the
    posenc this process imported (its parent directory after it); it runs in
    benchmarks/, since `-m` puts the working directory first on the path (in an
    unpacked sdist that would be the unbuilt sources' posenc)."""
    env = dict(os.environ)
    for name, value in (env_changes or {}).items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = str(value)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SUITE_ROOT, package_home(),
                                                    env.get("PYTHONPATH")) if p)
    try:
        done = subprocess.run([sys.executable, "-m", "posenc_bench.worker", json.dumps(spec)],
                              env=env, cwd=SUITE_ROOT, capture_output=True, text=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return {"error": f"exit {done.returncode}: " + " | ".join(tail)}
    return json.loads(lines[-1])
