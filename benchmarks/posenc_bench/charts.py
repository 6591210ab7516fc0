"""The benchmark's PNG charts, from the run's data (report.assemble, or a run's
JSON) alone: time against n, speed-up over PyTorch, fraction of the peak."""

from __future__ import annotations

from .cases import shape_text as _shape
from .report import IMPL_NAMES, find, matched


def draw(data, base) -> list:
    """Write <base>-time-vs-n.png, -speedup.png, -peak.png; the paths written
    (none without matplotlib, or with nothing to draw)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    written = []
    for name, chart in (("time-vs-n", _chart_scaling), ("speedup", _chart_speedup),
                        ("peak", _chart_peak)):
        figure = chart(plt, data)
        if figure is None:
            continue
        path = f"{base}-{name}.png"
        figure.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(figure)
        written.append(path)
    return written


def _chart_scaling(plt, data):
    T = max(data["configuration"]["threads"])
    series = {}
    for r in data["results"]:
        if "scaling" in r["sections"] and "median_s" in r and r["threads"] == T:
            B, H = r["shape"][:2]
            series.setdefault(r["method"], {}).setdefault((r["impl"], r["direction"]), []).append(
                (r["shape"][2], r["median_s"] / (B * H) * 1e3))
    if not series:
        return None
    figure, axes = plt.subplots(1, len(series), figsize=(4.2 * len(series), 3.6), squeeze=False)
    for ax, (method, lines) in zip(axes[0], series.items()):
        for (impl, direction), points in sorted(lines.items()):
            points.sort()
            ax.loglog([p[0] for p in points], [p[1] for p in points],
                      "-" if direction == "fwd" else "--", marker="o",
                      label=f"{IMPL_NAMES.get(impl, impl)} {direction}")
        ns = sorted({p[0] for points in lines.values() for p in points})
        ax.set_xscale("log", base=2)
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.minorticks_off()
        ax.set_title(method)
        ax.set_xlabel("n = m")
        ax.set_ylabel("ms per (batch, head)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    figure.suptitle(f"time vs n, {T} threads, d={data['configuration']['headline_shape'][4]} "
                    "(B·H shrinks at large n: time per (batch, head) shown)")
    figure.tight_layout()
    return figure


def _headline(data):
    conf = data["configuration"]
    return conf["headline_shape"], max(conf["threads"]), conf["methods"]


def _chart_speedup(plt, data):
    shape, T, methods = _headline(data)
    bars = {}
    for impl in ("eager", "compile"):
        for direction in ("fwd", "bwd"):
            values = []
            for method in methods:
                peer, ours = matched(data["results"], method, impl, direction, T, shape)
                values.append(peer["median_s"] / ours["median_s"] if peer and ours else 0)
            if any(values):
                bars[f"vs {IMPL_NAMES[impl]} {direction}"] = values
    if not bars:
        return None
    figure, ax = plt.subplots(figsize=(10, 4))
    width = 0.8 / len(bars)
    for i, (label, values) in enumerate(bars.items()):
        ax.bar([x + i * width for x in range(len(methods))], values, width, label=label)
    for level in (1, 1.5, 3):
        ax.axhline(level, color="grey", lw=0.8, ls=":")
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(methods))], methods, rotation=30)
    ax.set_yscale("log")
    ax.set_ylabel("speed-up of posenc (×)")
    ax.set_title(f"posenc speed-up over PyTorch, {_shape(shape)}, {T} threads")
    ax.legend(fontsize=8)
    return figure


def _chart_peak(plt, data):
    shape, T, methods = _headline(data)
    series = {}
    for impl in ("posenc", "eager", "compile"):
        for direction in ("fwd", "bwd"):
            values = [(find(data["results"], m, impl, direction, T, shape) or {}).get(
                "fraction_of_peak", 0) * 100 for m in methods]
            if any(values):
                series[f"{IMPL_NAMES[impl]} {direction}"] = values
    store = [(find(data["results"], m, "posenc", "fwd", T, shape) or {}).get(
        "fraction_of_store_floor", 0) * 100 for m in methods]
    if not series:
        return None
    figure, (ax, ax2) = plt.subplots(1, 2, figsize=(13, 4))
    width = 0.8 / len(series)
    for i, (label, values) in enumerate(series.items()):
        ax.bar([x + i * width for x in range(len(methods))], values, width, label=label)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(methods))], methods, rotation=30)
    ax.set_ylabel("% of measured FMA peak")
    ax.set_title(f"fraction of FMA peak, {_shape(shape)}, {T} threads")
    ax.legend(fontsize=8)
    ax2.bar(range(len(methods)), store, color="tab:green")
    ax2.set_xticks(range(len(methods)), methods, rotation=30)
    ax2.set_ylabel("store floor ÷ time (%)")
    ax2.set_title("posenc forward: fraction of the store-bandwidth floor")
    return figure
