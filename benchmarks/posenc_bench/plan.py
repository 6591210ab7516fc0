"""What a run will do: the sizes (full and quick), every timing grouped by
(shape, method) so inputs are built once, the peers shrunk or skipped by the
memory budget, and a rough cost model for the progress bar and --plan."""

from __future__ import annotations

from collections import OrderedDict

from . import cases
from .cases import shape_text

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
                skip({"what": f"{impl} {method} at {shape_text(shape)}",
                      "reason": f"needs ~{cases.gib(need)}, and ~{cases.gib(least)} even at "
                                f"B=H=1: over the budget of {cases.gib(budget)}, skipped"})
                return
            run_shape = (fit[0], fit[1], n, m, d)
            if run_shape != tuple(shape):
                skip({"what": f"{impl} {method} at {shape_text(shape)}",
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

    def all_tasks(self):
        for tasks in self.groups.values():
            yield from tasks.values()


def _scaling_shape(headline, n, work):
    B, H, _, _, d = headline
    if B * H * n * n <= work:
        return (B, H, n, n, d)
    for b, h in cases.shrink_ladder(B, H):
        if b * h * n * n <= work:
            return (b, h, n, n, d)
    return (1, 1, n, n, d)



def estimate_seconds(task, timing):
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



def print_plan(plan, total):
    for (shape, method), tasks in plan.groups.items():
        kinds = OrderedDict()
        for task in tasks.values():
            _, impl, direction, thr, _ = task["key"]
            kinds.setdefault(f"{impl} {direction}", []).append(str(thr or "-"))
        print(f"  {shape_text(shape)} {method}: " +
              "; ".join(f"{k} at {','.join(v)}t" for k, v in kinds.items()) +
              f"  (~{sum(t['weight'] for t in tasks.values()):.0f} s)")
    for item in plan.skipped:
        print(f"  {item['what']}: {item['reason']}")
    print(f"rough total {total / 60:.1f} min (a cost model, not a measurement)")
