#!/usr/bin/env python
"""The floor of benchmarks/hf.py's T5 training step: the same step with an attention that costs nothing.

    python benchmarks/hf_floor.py [--quick] [--repeats 2] [--cases posenc floor floor-o sdpa eager]
                                  [--profile] [--threads 2] [--note TEXT] [--out DIR]

Issue 15 asks that the T5-small training step of benchmarks/hf.py (batch 8,
encoder 512, decoder 512 tokens, float32, 2 threads), patched by
posenc.torch.hf, run >= 2x faster than HF's fastest implementation with a
peak <= 0.5x HF's lowest.  The patch replaces the attention modules only;
this measures what the rest of the step costs, by running it with stand-ins
for the 18 attention modules (the model, inputs, step and peak measure of
benchmarks/hf.py, each case in a process of its own, the cases taking turns
step by step):

* posenc: HF's model patched by posenc.torch.hf.patch (as benchmarks/hf.py);
* floor: T5's q, k, v and o projections and the head reshapes kept, the
  attention itself replaced by q + mean over keys of k + mean over keys of v
  (O(n d) per head; the backward runs through every projection, and through
  the relative bias table, added times 0): the step of an attention that
  costs nothing beyond its projections;
* floor-o: the module's output is o(hidden_states): no q, k, v projection,
  no attention: nothing left of the modules but a matmul per module;
* sdpa, eager: HF's own attention (as benchmarks/hf.py).

If the floor's time is above HF sdpa's / 2 (or its peak above HF eager's
/ 2), no attention, however fast or small, meets the target.

--profile (after the timed rounds, in this process): torch.profiler over one
patched training step (after a warm-up step), its time split into posenc's C
attention (forward, backward), the rest of the patched modules' forward (the
mask check, the q, k, v, o projections, copies, reshapes), the rest of the
fused attention's backward (copies, gradient assembly), the projections'
backward matmuls (aten::mm whose shapes are only d_model and batch x tokens),
and everything else.  Results: <out>/hf-floor-<date>.json and .md (--quick:
tiny shapes; out defaults to benchmarks/results/tmp).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hf  # noqa: E402  (benchmarks/hf.py: the model, inputs, step, peak measure and workers)

CASES = ("posenc", "floor", "floor-o", "sdpa", "eager")
FLOORS = ("floor", "floor-o")


# ------------------------------------------------------------------ the stand-ins

def _floor_forward(self, hidden_states, mask=None, key_value_states=None, position_bias=None,
                   past_key_values=None, **kwargs):
    """T5Attention.forward's (out, position_bias, weights) with the attention
    replaced by q + mean_keys(k) + mean_keys(v) (plus 0 x the relative bias
    table, so that its gradient is computed); the cache is not used."""
    batch, n = hidden_states.shape[:2]
    heads, dk = self.n_heads, self.key_value_proj_dim
    source = hidden_states if key_value_states is None else key_value_states
    heads_of = lambda x: x.view(batch, x.shape[1], heads, dk).transpose(1, 2)
    query, key, value = heads_of(self.q(hidden_states)), heads_of(self.k(source)), heads_of(self.v(source))
    out = query + key.mean(dim=2, keepdim=True) + value.mean(dim=2, keepdim=True)
    if self.has_relative_attention_bias:
        out = out + 0.0 * self.relative_attention_bias.weight.sum()
    return self.o(out.transpose(1, 2).reshape(batch, n, heads * dk)), None, None


def _floor_o_forward(self, hidden_states, mask=None, key_value_states=None, position_bias=None,
                     past_key_values=None, **kwargs):
    """o(hidden_states): no q, k, v projection and no attention."""
    return self.o(hidden_states), None, None


def _build(name, shape, case):
    """benchmarks/hf.py's model for `case`; the floors: the patched model with
    each patched attention module's class swapped for a stand-in subclass of
    HF's class (the same parameters)."""
    model = hf._build(name, shape, "posenc" if case in FLOORS else case)
    if case in FLOORS:
        forward = _floor_forward if case == "floor" else _floor_o_forward
        classes = {}
        for module in model.modules():
            original = getattr(type(module), "_posenc_original_class", None)
            if original is not None:
                if original not in classes:
                    classes[original] = type("Floor" + original.__name__, (original,), {"forward": forward})
                module.__class__ = classes[original]
    return model


class FloorCase(hf.Case):
    script = os.path.abspath(__file__)


# ------------------------------------------------------------------ the profile

def _profile(args, log) -> dict:
    """One patched training step under torch.profiler: {part: seconds}, the
    step's seconds, and the top operators."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    import posenc
    import posenc._methods as methods
    from posenc.torch import _fused_ops
    from posenc.torch import hf as phf

    torch.set_num_threads(args.threads)
    posenc.set_num_threads(args.threads)
    shape = (hf.QUICK_SHAPES if args.quick else hf.SHAPES)["t5"]
    model = hf._build("t5", shape, "posenc")
    batch = hf._inputs("t5", shape, shape["batch"], shape["encoder"], shape["decoder"])

    def labelled(label, function):
        def wrapper(*a, **k):
            with record_function(label):
                return function(*a, **k)
        return wrapper

    wrapped = [(phf, "_t5_family_attention", "posenc.hf module forward"),
               (phf, "_split_mask", "posenc.hf mask check"),
               (methods, "attention_forward", "posenc C attention forward"),
               (methods, "attention_backward", "posenc C attention backward")]
    saved = [(owner, attr, getattr(owner, attr)) for owner, attr, _ in wrapped]
    backward = _fused_ops._FusedAttention.backward
    try:
        for owner, attr, label in wrapped:
            setattr(owner, attr, labelled(label, getattr(owner, attr)))
        _fused_ops._FusedAttention.backward = staticmethod(labelled("posenc fused backward", backward))
        hf._train_step(model, hf._inputs("t5", shape, 2, 16, 4))
        hf._train_step(model, batch)                                    # warm-up at full size
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            step = hf._train_step(model, batch)
    finally:
        for owner, attr, function in saved:
            setattr(owner, attr, function)
        _fused_ops._FusedAttention.backward = staticmethod(backward)

    totals = {}
    for event in prof.key_averages():
        if event.key.startswith("posenc"):
            totals[event.key] = event.cpu_time_total / 1e6
    d_model, tokens = shape["config"]["d_model"], shape["batch"] * shape["encoder"]
    projection_mm = 0.0
    # the projections' backward matmuls: aten::mm whose operands have only d_model and batch x tokens
    # as sizes (the FFN's have d_ff, the LM head's the vocabulary); the forward's run inside the modules
    for event in prof.key_averages(group_by_input_shape=True):
        dims = [s for shapes in event.input_shapes for s in shapes]
        if event.key == "aten::mm" and dims and set(dims) <= {d_model, tokens} \
                and len(event.input_shapes) == 2:
            projection_mm += event.self_cpu_time_total / 1e6
    module_forward = totals.get("posenc.hf module forward", 0.0)
    c_forward = totals.get("posenc C attention forward", 0.0)
    c_backward = totals.get("posenc C attention backward", 0.0)
    fused_backward = totals.get("posenc fused backward", 0.0)
    # the projections' backward mm ran outside the module forward; forward mm inside it
    forward_mm = _forward_projection_mm(prof, d_model, tokens)
    parts = {
        "posenc C attention forward": c_forward,
        "posenc C attention backward": c_backward,
        "patched modules' forward, rest (projections, mask check, copies, reshapes)": module_forward - c_forward,
        "  of which the mask check": totals.get("posenc.hf mask check", 0.0),
        "  of which the q, k, v, o projections' matmuls": forward_mm,
        "fused attention backward, rest (d_out copy, gradient assembly)": fused_backward - c_backward,
        "q, k, v, o projections' backward matmuls": projection_mm - forward_mm,
    }
    counted = (module_forward + fused_backward + projection_mm - forward_mm)
    profiled = sum(e.self_cpu_time_total for e in prof.key_averages()) / 1e6
    parts["everything else (HF's FFN, norms, dropout, LM head, loss, ...)"] = profiled - counted
    top = [(e.key, e.self_cpu_time_total / 1e6, e.count) for e in
           sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:15]]
    log(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
    return {"step_s": step, "profiled_s": profiled, "parts_s": parts, "top_ops": top}


def _forward_projection_mm(prof, d_model, tokens) -> float:
    """Self time of the forward projections' matmuls: aten::mm of a (tokens,
    d_model) input by a (d_model, d_model) weight, as run inside the modules'
    forward; these carry the same shapes as the grad-input mm of the backward,
    so they are told apart by the forward's event tree."""
    seconds = 0.0
    for event in prof.events():
        if event.name != "aten::mm" or not _inside(event, "posenc.hf module forward"):
            continue
        dims = [s for shapes in event.input_shapes for s in shapes]
        if dims and set(dims) <= {d_model, tokens}:
            seconds += event.self_cpu_time_total / 1e6
    return seconds


def _inside(event, name) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name == name:
            return True
        parent = parent.cpu_parent
    return False


# ------------------------------------------------------------------ the parent

def run(args, log) -> dict:
    shape = (hf.QUICK_SHAPES if args.quick else hf.SHAPES)["t5"]
    cases = [FloorCase("t5", case, args.quick, args.threads, shape["batch"]) for case in args.cases]
    result = {"shape": {k: v for k, v in shape.items() if k != "config"}, "repeats": args.repeats, "cases": {}}
    try:
        for case in cases:
            case.ready = case.read()
        replies, errors = hf._rounds(cases, "train", args.repeats, log)
    finally:
        for case in cases:
            case.close()
    for name, error in errors.items():
        result["cases"][name] = {"error": error}
    for name, got in replies.items():
        entry = hf._summary([r["s"] for r in got])
        entry["peak_bytes"] = max(r["peak_bytes"] for r in got)
        entry["step_peaks_bytes"] = [r["peak_bytes"] for r in got]
        result["cases"][name] = entry
    return result


def markdown(results: dict) -> str:
    machine = results["machine"]
    cases = {k: v for k, v in results["cases"].items() if "median_s" in v}
    lines = hf.preamble(results, "The floor of the T5-small training step: an attention that costs nothing, "
                                 f"float32, {machine['threads']} threads",
                        " `python benchmarks/hf_floor.py " + " ".join(results["argv"]) + "`.")
    lines += ["benchmarks/hf.py's T5-small training step (batch 8, encoder 512, decoder 512, float32); "
              "cases: posenc (patched), floor (q, k, v, o projections kept, the attention replaced by "
              "q + mean_keys(k) + mean_keys(v)), floor-o (the module is o(hidden_states)), HF sdpa and eager. "
              f"Seconds: median (min–max) of {results['repeats']} timed steps after a warm-up, the cases taking "
              "turns; peak: the largest VmHWM above the step's starting RSS, as benchmarks/hf.py.", "",
              "| case | s (min–max) | peak MiB | HF sdpa s ÷ this | this peak ÷ HF eager's |",
              "|---|---|---|---|---|"]
    sdpa, eager = cases.get("sdpa"), cases.get("eager")
    for name, entry in cases.items():
        speed = f"{sdpa['median_s'] / entry['median_s']:.2f}×" if sdpa else "—"
        memory = f"{entry['peak_bytes'] / eager['peak_bytes']:.2f}×" if eager else "—"
        lines.append(f"| {name} | {entry['median_s']:.2f} ({entry['min_s']:.2f}–{entry['max_s']:.2f}) | "
                     f"{entry['peak_bytes'] / 2**20:.0f} | {speed} | {memory} |")
    for name, entry in results["cases"].items():
        if "error" in entry:
            lines += ["", f"* {name} failed: {entry['error']}"]
    if "profile" in results:
        profile_ = results["profile"]
        lines += ["", f"## Where the patched step's time goes (torch.profiler, one step: {profile_['step_s']:.2f} s "
                  f"with the profiler, {profile_['profiled_s']:.2f} s of operators)", "",
                  "| part | s | share |", "|---|---|---|"]
        for part, seconds in profile_["parts_s"].items():
            lines.append(f"| {part} | {seconds:.2f} | {seconds / profile_['profiled_s']:.1%} |")
        lines += ["", "Top operators by self time: " + "; ".join(
            f"{key} {seconds:.2f} s ({count})" for key, seconds, count in profile_["top_ops"]) + "."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    hf.common_options(parser)
    parser.add_argument("--repeats", type=int, default=2, help="timed training steps per case (after a warm-up)")
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--profile", action="store_true", help="also profile one patched step")
    args = parser.parse_args(argv)
    if args.worker:
        hf.worker(json.loads(args.worker), build=_build)
        return 0
    sys.path.insert(0, os.path.dirname(HERE))
    import torch
    import transformers

    import posenc

    log = lambda text: print(text, flush=True)
    began = time.perf_counter()
    results = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
               "quick": args.quick, "note": args.note, "argv": sys.argv[1:] if argv is None else list(argv),
               "machine": {"torch": torch.__version__, "transformers": transformers.__version__,
                           "posenc": posenc.__version__, "isa": posenc.get_isa(), "threads": args.threads,
                           "cores": os.cpu_count(), "cpu": hf._cpu_name()},
               "load_before": [round(x, 2) for x in os.getloadavg()]}
    results.update(run(args, log))
    if args.profile:
        results["profile"] = _profile(args, log)
    results["load_after"] = [round(x, 2) for x in os.getloadavg()]
    results["minutes"] = (time.perf_counter() - began) / 60
    hf.save(results, markdown(results), args.out, "hf-floor", args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
