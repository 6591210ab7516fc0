"""The benchmark's Markdown page and the lines a run prints, from the run's data
(report.assemble, or a run's JSON) alone."""

from __future__ import annotations

import os

from .cases import shape_text as _shape
from .report import (
    IMPL_NAMES,
    PAPER_CAPTION,
    PAPER_NAMES,
    find,
    matched,
    ms_text,
    pct_text,
    ratio_text,
)


def header_text(info, timing, no_torch_reason) -> str:
    """The lines a run prints before it starts."""
    nb, tb = info["numpy_blas"], info["torch_blas"]
    lines = [
        f"posenc {info['posenc']} benchmark on {info['host']}",
        f"cpu         {info['cpu']} ({info['machine']}), {info['cores']} usable cores",
        f"posenc ISA  {info['posenc_isa']} (usable: {', '.join(info['posenc_isas'])}); "
        f"threads {', '.join(map(str, info['threads']))}",
        f"numpy       {nb.get('numpy')} with {nb.get('name')} {nb.get('version')} "
        f"(run-time core {nb.get('openblas_core_at_run_time')})",
        "torch       " + (f"{tb['torch']} with {tb.get('blas')}, CPU capability "
                           f"{tb.get('cpu_capability')}" if tb.get("torch") else
                           f"not used: {no_torch_reason}"),
        "environment " + ", ".join(f"{k}={v}" for k, v in info["env"].items()),
        f"timing      1 warm-up + up to {timing['repeats']} repeats (fewer past "
        f"{timing['max_seconds']:g} s, never under 2); median and min",
    ]
    return "\n".join(lines)


def _table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def headline_rows(data):
    results = data["results"]
    conf = data["configuration"]
    shape, threads = conf["headline_shape"], conf["threads"]
    T = max(threads)
    rows = []
    for method in conf["methods"]:
        cells = [method]
        for direction in ("fwd", "bwd"):
            ours = {t: find(results, method, "posenc", direction, t, shape) for t in threads}
            peer, mine = matched(results, method, "eager", direction, T, shape)
            comp, _ = matched(results, method, "compile", direction, T, shape)
            cells += ["/".join(ms_text(ours[t]["median_s"]) if ours[t] else "—" for t in threads),
                      ms_text(peer["median_s"]) if peer else "—",
                      ms_text(comp["median_s"]) if comp else "—",
                      ratio_text(peer["median_s"] / mine["median_s"]) if peer and mine else "—",
                      pct_text(ours[T]["fraction_of_peak"]) if ours[T] else "—"]
        f = find(results, method, "posenc", "fwd", T, shape)
        cells.append(pct_text(f["fraction_of_store_floor"]) if f else "—")
        rows.append(cells)
    t = "/".join(f"{x}t" for x in threads)
    header = ["method", f"posenc fwd ms ({t})", f"eager fwd ms ({T}t)", f"compile fwd ms ({T}t)",
              "fwd speed-up", "fwd % FMA peak", f"posenc bwd ms ({t})", f"eager bwd ms ({T}t)",
              f"compile bwd ms ({T}t)", "bwd speed-up", "bwd % FMA peak",
              "fwd % of store floor"]
    return header, rows


def target_table(data):
    rows = []
    for t in data["targets"]:
        measured = "—" if t["measured"] is None else ratio_text(t["measured"])
        rows.append([t["target"], t["method"], measured, t["required"], t["verdict"], t["detail"]])
    return _table(["target", "method", "measured", "required", "verdict", "detail"], rows)


def table1_markdown(data):
    rows = []
    for r in data["table1"]:
        paper = r["paper"] or {}
        name = PAPER_NAMES.get(r["method"], r["method"])
        rows.append([name, IMPL_NAMES[r["impl"]],
                     "—" if r["inference"] is None else f"{r['inference'] * 100:+.0f}%",
                     "—" if r["training"] is None else f"{r['training'] * 100:+.0f}%",
                     paper.get("BERT_BASE inference", "—"),
                     paper.get("BERT_BASE training", "—"),
                     paper.get("BERT_SMALL inference", "—"),
                     paper.get("BERT_SMALL training", "—")])
    return _table(["method", "implementation", "this CPU: forward", "this CPU: forward+backward",
                   "paper BASE inference", "paper BASE training", "paper SMALL inference",
                   "paper SMALL training"], rows)


def summary_text(data) -> str:
    header, rows = headline_rows(data)
    B, H, n, m, d = data["configuration"]["headline_shape"]
    overhead = _overhead(data)
    return "\n".join([
        f"\nHeadline: B={B} H={H} n={n} m={m} d={d}, float32, median ms "
        "(speed-up = eager / posenc at the same thread count)",
        _table(header, rows),
        "\nTargets:", target_table(data),
        "\nDIET Table 1 on this CPU (time relative to content, same implementation):",
        table1_markdown(data),
        *(["\nPer-call overhead at small sizes, 1 thread:", overhead[-1]] if overhead else [])])


def _machine(data):
    info = data["machine"]
    nb, tb = info["numpy_blas"], info["torch_blas"]
    build = info["posenc_build"]
    rows = [
        ["CPU", f"{info['cpu']} ({info['machine']}), {info['cores']} usable cores"],
        ["posenc", f"{info['posenc']}, ISA `{info['posenc_isa']}` (usable: "
                   f"{', '.join(info['posenc_isas'])}), {build.get('compiler')}, OpenMP "
                   f"{build.get('openmp')}"],
        ["threads", ", ".join(map(str, info["threads"]))],
        ["Python", info["python"]],
        ["NumPy BLAS", f"NumPy {nb.get('numpy')}: {nb.get('name')} {nb.get('version')} "
                       f"(`{nb.get('configuration')}`); OpenBLAS core chosen at run time in "
                       f"this process: **{nb.get('openblas_core_at_run_time')}**"],
        ["PyTorch", "not used: " + data["configuration"]["torch"] if not tb.get("torch") else
         f"{tb['torch']}, BLAS {tb.get('blas')}, ATen CPU capability "
         f"{tb.get('cpu_capability')}"],
        ["environment", "<br>".join(f"`{k}={v}`" for k, v in info["env"].items())],
    ]
    text = _table(["", ""], rows)
    if tb.get("torch"):
        text += ("\n\n<details><summary>torch.__config__.show()</summary>\n\n```\n"
                 f"{tb['config']}\n\n{tb['parallel']}\n```\n</details>")
    return text


def _limits(data):
    lim = data["limits"]
    fma = _table(["ISA", "threads", "FMA GFLOP/s (float32)"],
                 [[r["isa"], r["threads"], f"{r['flops'] / 1e9:.0f}"] for r in lim["fma"]])
    store = _table(["ISA", "threads", "stores", "buffer", "GB/s"],
                   [[r["isa"], r["threads"], "streaming" if r["nontemporal"] else "plain",
                     f"{r['bytes'] >> 20} MiB", f"{r['bytes_per_s'] / 1e9:.1f}"]
                    for r in lim["store"]])
    peak = ", ".join(f"{T} threads {v / 1e9:.0f} GFLOP/s" for T, v in lim["peak_flops"].items())
    bandwidth = ", ".join(f"{T} threads {v / 1e9:.1f} GB/s"
                          for T, v in lim["store_bandwidth"].items())
    return (fma + "\n\n" + store + "\n\nFraction of peak = useful FLOP/s ÷ the FMA peak "
            f"({peak}); store floor = bytes of the logits ÷ the store bandwidth ({bandwidth}): "
            "the least time any forward can take to write its result; fraction of the floor = "
            "floor ÷ measured time. Each limit is the best of every ISA and every thread count "
            "up to the one it applies to (a lower figure at more threads is another process "
            "on the cores, not the machine).")


def _what_was_run(data):
    conf = data["configuration"]
    timing = conf["timing"]
    lines = [
        f"* Command: `{' '.join(data['machine']['argv'])}`" + (" (quick: tiny sizes)" if
                                                               data["quick"] else ""),
        f"* Timing: 1 warm-up call, then up to {timing['repeats']} timed calls, stopping "
        f"early once {timing['max_seconds']:g} s are spent (never under 2 timed calls); "
        "the median is reported (min in the full tables). Garbage collection off while timing.",
        "* Forward: one call returning the logits (PyTorch under `no_grad`). Backward: posenc "
        "`*_backward(G, ...)`; PyTorch: `torch.autograd.backward(logits, G)` after an untimed "
        "forward, timing only the backward pass. float32 throughout.",
        "* posenc runs at each thread count (`posenc.set_num_threads`); PyTorch with "
        "`torch.set_num_threads` at the same count. PyTorch eager = `posenc.torch.native.<method>`"
        " (matmul + gathered bias; HF T5 `compute_bias`; DeBERTa c2p/p2c with `gather`; Shaw/M4"
        " with the materialised (n, m, d) relative tensor). torch.compile = "
        "`torch.compile(native.<method>, dynamic=False)` at the largest thread count, compile "
        "time (first call) reported apart, not in the timings; compiled for: "
        f"{', '.join(conf['compile_methods']) or 'nothing'}.",
        f"* Headline shape: {_shape(conf['headline_shape'])}. Grid: "
        + "; ".join(_shape(s) for s in conf["grid_shapes"]) + ". Scaling in n: "
        + ", ".join(map(str, conf["scaling_n"])) + " for content, t5, shaw at the largest thread "
        f"count, B·H shrunk once B·H·n² passes {conf['scaling_work_cap']:,}.",
        "* posenc.reference (NumPy, float64 inside) at the smallest grid shape only.",
        f"* Memory budget {conf['memory_budget_bytes'] / 2**30:.0f} GiB: a peer whose estimated "
        "need exceeds it runs at a smaller B·H (posenc measured there too, so ratios compare "
        "equal shapes) or is skipped; see the list at the end.",
        "* The PyTorch peers run at every thread count at the headline shape and where the "
        "logits are at most 16 MiB; elsewhere at the largest count only, to keep the run "
        "under 25 minutes (`--peer-threads-all` runs them at every count everywhere).",
    ]
    params = _table(["method", "parameters"], [[m, conf["parameters"][m]] for m in conf["methods"]])
    formulas = _table(["method", "forward FLOPs", "backward FLOPs"],
                      [[m, *conf["flop_formulas"][m]] for m in conf["methods"]])
    return "\n".join(lines) + "\n\n" + params + "\n\n" + conf["flop_legend"] + "\n\n" + formulas


def _memory(data):
    rows = []
    for m in data["memory"]:
        if "error" in m:
            rows.append([", ".join(m["methods"]), IMPL_NAMES.get(m["impl"]),
                         "—", "—", "—", "—", m["error"]])
            continue
        rows.append([m["method"], IMPL_NAMES.get(m["impl"], m["impl"]),
                     f"{m['peak_above_baseline'] / 2**20:.0f}",
                     f"{m['logits_bytes'] / 2**20:.0f}",
                     ratio_text(m["peak_above_baseline"] / m["logits_bytes"]),
                     f"{m['estimate_bytes'] / 2**20:.0f}",
                     "" if m["peak_reset"] else "peak not resettable: lower bound"])
    if not rows:
        return "Not measured."
    shape = data["configuration"]["headline_shape"]
    return (f"forward + backward at {_shape(shape)}, {max(data['configuration']['threads'])} "
            "threads, each in a subprocess: ru_maxrss after the run minus ru_maxrss once the "
            "inputs and G are allocated and touched (peak reset through /proc/self/clear_refs; "
            "a tiny warm-up call first loads the libraries). The logits stay alive during the "
            "backward, as in training.\n\n" +
            _table(["method", "implementation", "peak above baseline MiB", "logits MiB",
                    "ratio", "estimate MiB (used to shrink)", "note"], rows))


def _overhead(data):
    """The per-call overhead section (overhead.py), or nothing for a run without it."""
    result = data.get("overhead")
    if not result:
        return []
    rows = [[r["what"], r["measured"], r["required"], r["verdict"], r["detail"]]
            for r in result["rows"]]
    return ["## Per-call overhead at small sizes",
            "One thread (`posenc.set_num_threads(1)`, `torch.set_num_threads(1)`); the calls "
            f"being compared take turns over {result['rounds']} rounds, each round a run of "
            "calls; medians, and the spread over the rounds."
            + ("" if "torch" in result else " posenc.torch against native not measured: "
               "torch not used."),
            _table(["what", "measured", "target", "verdict", "detail"], rows)]


def _numpy_matmul(data):
    variants = []
    for r in data["numpy_matmul"]:
        if r["variant"] not in variants:
            variants.append(r["variant"])
    table, errors, cores = {}, [], {}
    for r in data["numpy_matmul"]:
        if "error" in r:
            errors.append(f"* {r['variant']}, {r['threads']} threads: {r['error']}")
            continue
        cores[r["variant"]] = r["openblas_core"]
        key = (tuple(r["shape"]), r["direction"], r["threads"])
        table.setdefault(key, {})[r["variant"]] = r["median_s"]
    if not table and not errors:
        return "Not measured."
    here = {r["variant"] for r in data["numpy_matmul"] if r.get("as_in_this_process")}
    names = [f"{v}{' (as here)' if v in here else ''}: OpenBLAS core {cores.get(v)}, ms"
             for v in variants]
    rows = []
    for (shape, direction, threads), times in table.items():
        ours = find(data["results"], "content", "posenc", direction, threads, shape)
        cells = [ms_text(times.get(v)) for v in variants]
        first, second = (times.get(v) for v in (variants + [None, None])[:2])
        rows.append([_shape(shape), direction, threads, *cells,
                     ratio_text(first / second) if first and second else "—",
                     ms_text(ours["median_s"]) if ours else "—"])
    ratio_name = f"{variants[0]} ÷ {variants[1]}" if len(variants) > 1 else "ratio"
    return ("`np.matmul(q, k.swapaxes(-1, -2)) * s` and its backward (`G @ k * s`, "
            "`Gᵀ @ q * s`), medians, each environment in its own subprocess (OpenBLAS reads "
            "OPENBLAS_CORETYPE and OPENBLAS_NUM_THREADS only when it loads); posenc content "
            "at the same shape and threads alongside.\n\n" +
            _table(["shape", "dir", "threads", *names, ratio_name, "posenc content ms"], rows)
            + ("\n\n" + "\n".join(errors) if errors else ""))


def _all_timings(data):
    blocks = []
    shapes = []
    for r in data["results"]:
        if tuple(r["shape"]) not in shapes:
            shapes.append(tuple(r["shape"]))
    for shape in shapes:
        rows = []
        for r in (r for r in data["results"] if tuple(r["shape"]) == shape):
            if "median_s" not in r:
                rows.append([r["method"], IMPL_NAMES.get(r["impl"]), r["direction"],
                             r["threads"] or "—", "—", "—", "—", "—", "—", "—",
                             r.get("error", "")])
                continue
            note = f"compile {r['compile_s']:.1f} s" if "compile_s" in r else ""
            if r.get("requested_shape"):
                note += f" (for {_shape(r['requested_shape'])}: memory)"
            rows.append([r["method"], IMPL_NAMES.get(r["impl"]), r["direction"],
                         r["threads"] or "—", ms_text(r["median_s"]), ms_text(r["min_s"]), r["repeats"],
                         f"{r['gflops_per_s']:.1f}", pct_text(r["fraction_of_peak"]),
                         pct_text(r.get("fraction_of_store_floor")), note])
        blocks.append(f"### {_shape(shape)}\n\n" + _table(
            ["method", "implementation", "dir", "threads", "median ms", "min ms", "repeats",
             "GFLOP/s", "% FMA peak", "% store floor", "note"], rows))
    return "\n\n".join(blocks)


def _scaling(data):
    rows = []
    T = max(data["configuration"]["threads"])
    for r in data["results"]:
        if "scaling" in r["sections"] and "median_s" in r and r["threads"] == T:
            B, H = r["shape"][:2]
            rows.append([r["method"], IMPL_NAMES.get(r["impl"]), r["direction"], r["shape"][2],
                         f"{B}·{H}", ms_text(r["median_s"]),
                         f"{r['median_s'] / (B * H) * 1e3:.3g}", pct_text(r["fraction_of_peak"])])
    rows.sort(key=lambda x: (x[0], x[1], x[2], x[3]))
    return _table(["method", "implementation", "dir", "n = m", "B·H", "median ms",
                   "ms per head", "% FMA peak"], rows) if rows else "Not measured."


def _skipped(data):
    items = [f"* {s['what']}: {s['reason']}" for s in data["skipped"]]
    items += [f"* {r['method']} {r['direction']} {IMPL_NAMES.get(r['impl'])} at "
              f"{_shape(r['shape'])}: {r['error']}" for r in data["results"] if "error" in r]
    return "\n".join(items) if items else "Nothing."


def render(data) -> str:
    conf = data["configuration"]
    header, rows = headline_rows(data)
    charts = data.get("files", {}).get("charts", [])
    parts = [
        f"# posenc benchmark: {data['machine']['host']}, {data['date'][:16]}",
        "Every number below was measured by this run (`python -m posenc bench`); none is "
        f"typed in except the DIET paper's Table 1, quoted. Run time {data['duration_s'] / 60:.1f} "
        "min." + (" **Quick run: tiny sizes, for the smoke test; the figures mean "
                  "nothing.**" if data["quick"] else ""),
        "## Machine", _machine(data),
        "## Machine limits (measured here)", _limits(data),
        "## What was run", _what_was_run(data),
        f"## Headline: {_shape(conf['headline_shape'])}, float32",
        "Median ms; speed-up = PyTorch eager ÷ posenc at the same thread count "
        f"({max(conf['threads'])}); % FMA peak of posenc at {max(conf['threads'])} threads; "
        "fraction of the store floor of posenc's forward.",
        _table(header, rows),
        "## Targets",
        f"At {_shape(conf['headline_shape'])}, {max(conf['threads'])} threads, medians. "
        "`info` rows are shown for comparison and carry no target.",
        target_table(data),
        "## DIET Table 1 on this CPU",
        f"Each method's time relative to `content` in the same implementation at "
        f"{_shape(conf['headline_shape'])}, {max(conf['threads'])} threads: forward "
        "(the paper's inference) and forward+backward (its training). The paper's figures are "
        "whole-model BERT step times on TPU v2, ours the attention logits alone, so ours bound "
        f"the model-level overhead from above. Paper, quoted: *{PAPER_CAPTION}*",
        table1_markdown(data),
        "## Peak memory", _memory(data),
        *_overhead(data),
        "## NumPy matmul peer, with and without OPENBLAS_CORETYPE", _numpy_matmul(data),
        "## Scaling in n", _scaling(data),
        "## All timings", _all_timings(data),
        "## Skipped, shrunk or failed", _skipped(data),
        "## Charts",
        "\n".join(f"![{os.path.basename(p)}]({os.path.basename(p)})" for p in charts)
        or "Not drawn (matplotlib missing or nothing to draw).",
    ]
    return "\n\n".join(parts) + "\n"
