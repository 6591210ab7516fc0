"""The positional-encoding lab: the field's train-short-test-long comparison in one command.

    python -m posenc lab extrapolate                 # every causal encoding, the default preset
    python -m posenc lab tasks                       # copy, reverse, recall, sort: short -> long
    python -m posenc lab plot RESULT.json [...]      # re-plot / compare saved runs

`extrapolate` trains one small decoder-only Transformer per encoding (built from
`posenc.torch.nn`: token embedding without positions, pre-LN blocks of
`PositionalSelfAttention` with the encoding, a GELU MLP; no transformers needed)
on bytes of real text at a training length L, and measures its perplexity per
byte at 1, 2, 4, 8 and 16 L: non-overlapping windows (each window's tokens
predicted from the window's own prefix) and a sliding window (windows of the
evaluation length every half window, each scoring its second half, so that every
scored token sees at least half a window of context).  The text is the Python
standard library's own source files, read as bytes -- every machine with Python
has them -- split by file into training and validation (a file's CRC-32 decides,
so the split is the same everywhere), or text files the user names (--data).
`tasks` trains the same model on synthetic tasks that need positions and tests
it on longer instances.  `--hf` runs the same on a tiny Hugging Face Llama
through `posenc.torch.hf.swap_positional_encoding`.

Results are a table on the terminal, a JSON file and a plot (PNG and SVG).  The
kernels are deterministic for any thread count; torch's own CPU ops are for a
fixed thread count: the same seed on the same machine and thread count gives the
same JSON (the wall times are printed, not stored).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import sys
import sysconfig
import time
import zlib
from dataclasses import asdict, dataclass, replace

import numpy as np

# ------------------------------------------------------------------ presets


@dataclass(frozen=True)
class Preset:
    """A run's sizes: the model (d_model, layers, heads), the training (length,
    batch, steps, learning rate), the evaluation (lengths as multiples of the
    training length, bytes evaluated per length)."""
    d_model: int
    layers: int
    heads: int
    train_length: int
    batch: int
    steps: int
    lr: float
    multiples: tuple
    eval_bytes: int
    train_bytes: int          # the training text's size cap (bytes); 0: all of it


PRESETS = {
    "smoke": Preset(d_model=16, layers=1, heads=2, train_length=16, batch=4, steps=3, lr=3e-3,
                    multiples=(1, 2), eval_bytes=256, train_bytes=1 << 16),
    "default": Preset(d_model=64, layers=2, heads=4, train_length=64, batch=32, steps=400,
                      lr=2e-3, multiples=(1, 2, 4, 8, 16), eval_bytes=1 << 14,
                      train_bytes=1 << 22),
    "large": Preset(d_model=128, layers=4, heads=8, train_length=128, batch=32, steps=3000,
                    lr=1e-3, multiples=(1, 2, 4, 8, 16), eval_bytes=1 << 17, train_bytes=0),
}

# the encodings that run causally (a decoder): name -> (posenc method, keyword arguments
# beyond the model's shape).  Relative tables clip at the training length; T5's log
# buckets reach twice as far (its 32 unidirectional buckets are exact up to 16).
ENCODINGS = {
    "nope": ("content", {}),
    "rope": ("rope", {}),
    "rope_dynamic": ("rope", {"rope_parameters": {"rope_type": "dynamic", "rope_theta": 10000.0,
                                                  "factor": 1.0}}),
    "alibi": ("alibi", {}),
    "kerple": ("kerple", {}),
    "relative_bias": ("relative_bias", {}),
    "t5": ("t5", {"max_distance": "2L"}),
    "shaw": ("shaw", {}),
    "m2": ("m2", {}),
    "m4": ("m4", {}),
    "m4m": ("m4m", {}),
    "diet_rel": ("diet_rel", {}),
    "deberta": ("deberta", {}),
    "fox": ("fox", {}),
}

# ------------------------------------------------------------------ data


def stdlib_files() -> list:
    """The standard library's .py files (site-packages left out), sorted by path."""
    root = sysconfig.get_paths()["stdlib"]
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in ("site-packages", "dist-packages",
                                                        "__pycache__"))
        found += [os.path.join(folder, name) for name in sorted(files) if name.endswith(".py")]
    return sorted(found, key=lambda path: os.path.relpath(path, root))


def split_corpus(paths: list, root: str | None = None, validation_every: int = 10) -> tuple:
    """(training bytes, validation bytes, description): every file whose relative
    path's CRC-32 is 0 modulo `validation_every` goes to validation, the others to
    training, each file's bytes followed by a blank line, in path order."""
    train, valid = [], []
    for path in paths:
        name = os.path.relpath(path, root) if root else os.path.basename(path)
        with open(path, "rb") as f:
            data = f.read() + b"\n\n"
        (valid if zlib.crc32(name.encode()) % validation_every == 0 else train).append(data)
    if not train or not valid:
        raise ValueError(f"{len(paths)} file(s) give no training or no validation text: the "
                         f"split sends every {validation_every}th file (by name) to validation; "
                         f"give more files")
    train, valid = b"".join(train), b"".join(valid)
    return (np.frombuffer(train, dtype=np.uint8), np.frombuffer(valid, dtype=np.uint8),
            {"files": len(paths), "train_bytes": len(train), "validation_bytes": len(valid),
             "sha256": hashlib.sha256(train + b"\0" + valid).hexdigest()[:16]})


def corpus(data: list | None) -> tuple:
    """split_corpus of the standard library (data None) or of the user's files and
    folders (every file under a folder)."""
    if not data:
        paths = stdlib_files()
        train, valid, info = split_corpus(paths, sysconfig.get_paths()["stdlib"])
        return train, valid, dict(info, source="python stdlib " + platform.python_version())
    paths = []
    for item in data:
        if os.path.isdir(item):
            paths += sorted(os.path.join(folder, name) for folder, _, files in os.walk(item)
                            for name in files)
        elif os.path.isfile(item):
            paths.append(item)
        else:
            raise FileNotFoundError(f"--data {item!r}: no such file or folder")
    train, valid, info = split_corpus(sorted(paths))
    return train, valid, dict(info, source=", ".join(data))


# ------------------------------------------------------------------ the model


def _torch():
    try:
        import torch
    except ImportError:
        raise ImportError("posenc lab needs PyTorch: pip install torch (on a CPU-only "
                          "machine the CPU build; then pip install 'posenc[lab]')") from None
    return torch


def make_encoding(name: str, preset: Preset):
    """The `posenc.torch.nn` encoding `name` for a causal model of `preset`'s shape."""
    from posenc.torch.nn import build_encoding

    method, params = ENCODINGS[name]
    head_dim = preset.d_model // preset.heads
    return build_encoding(method, dict(
        num_heads=preset.heads, head_dim=head_dim, d_model=preset.d_model,
        max_len=preset.train_length, max_position_embeddings=preset.train_length,
        max_distance=preset.train_length, rank=head_dim, bidirectional=False,
        reset_cls=False, att_span=preset.train_length // 2), _lengths(params, preset))


def build_model(name: str, preset: Preset, vocab: int):
    """A decoder-only Transformer with encoding `name` (None: plain content), pre-LN."""
    torch = _torch()
    from torch import nn

    from posenc.torch.nn import PositionalSelfAttention

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            d = preset.d_model
            self.embed = nn.Embedding(vocab, d)
            self.encodings = nn.ModuleList(make_encoding(name, preset)
                                           for _ in range(preset.layers))
            self.attention = nn.ModuleList(
                PositionalSelfAttention(d, preset.heads, encoding, causal=True)
                for encoding in self.encodings)
            self.mlp = nn.ModuleList(nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(),
                                                   nn.Linear(4 * d, d))
                                     for _ in range(preset.layers))
            self.norms = nn.ModuleList(nn.LayerNorm(d) for _ in range(2 * preset.layers + 1))
            self.head = nn.Linear(d, vocab)

        def forward(self, tokens):
            x = self.embed(tokens)
            for index, (attention, mlp) in enumerate(zip(self.attention, self.mlp)):
                x = x + attention(self.norms[2 * index](x))
                x = x + mlp(self.norms[2 * index + 1](x))
            return self.head(self.norms[-1](x))

    return Decoder()


def build_hf_model(name: str, preset: Preset, vocab: int):
    """A tiny Hugging Face Llama of `preset`'s shape with encoding `name` swapped in."""
    torch = _torch()
    try:
        import transformers
    except ImportError:
        raise ImportError("posenc lab --hf needs transformers: pip install 'posenc[hf]'") from None
    from posenc.torch.hf import swap_positional_encoding

    config = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=preset.d_model, intermediate_size=4 * preset.d_model,
        num_hidden_layers=preset.layers, num_attention_heads=preset.heads,
        num_key_value_heads=preset.heads, max_position_embeddings=preset.train_length)
    model = transformers.LlamaForCausalLM(config)
    method, params = ENCODINGS[name]
    swap_positional_encoding(model, method, share=False, **_json_params(method, params, preset))

    class Logits(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, tokens):
            return self.model(input_ids=tokens).logits

    return Logits()


def _lengths(params: dict, preset: Preset) -> dict:
    """An encoding's arguments with "2L" (twice the training length) resolved."""
    return {name: 2 * preset.train_length if value == "2L" else value
            for name, value in params.items()}


def _json_params(method: str, params: dict, preset: Preset) -> dict:
    """The lab's encoding arguments as the swap takes them (the swap fills the shape;
    the lab's clipping distance where the class has one)."""
    import inspect

    from posenc.torch.nn import encoding_classes

    accepted = inspect.signature(encoding_classes()[method].__init__).parameters
    clip = {"max_distance": preset.train_length} if "max_distance" in accepted else {}
    return dict(clip, **_lengths(params, preset))


# ------------------------------------------------------------------ training and evaluation


def _progress(total: int, description: str, quiet: bool):
    """A tqdm progress bar (None when quiet or tqdm is missing)."""
    if quiet:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=description, leave=False, dynamic_ncols=True)


def train(model, batches, steps: int, lr: float, description: str = "", quiet: bool = True,
          record_every: int = 10) -> list:
    """AdamW with a cosine schedule over `steps` steps of `batches()` ((tokens,
    targets), targets -100 where not scored); the mean loss of every `record_every`
    steps."""
    torch = _torch()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / max(1, steps // 20))
        * 0.5 * (1 + math.cos(math.pi * step / steps)))
    losses, window = [], []
    bar = _progress(steps, description, quiet)
    model.train()
    for _ in range(steps):
        tokens, targets = batches()
        logits = model(tokens)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 targets.reshape(-1), ignore_index=-100)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        window.append(loss.item())
        if len(window) == record_every:
            losses.append(round(float(np.mean(window)), 6))
            window = []
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{window[-1] if window else losses[-1]:.3f}")
    if window:
        losses.append(round(float(np.mean(window)), 6))
    if bar is not None:
        bar.close()
    model.eval()
    return losses


def text_batches(train_bytes: np.ndarray, length: int, batch: int, seed: int):
    """Random windows of length + 1 bytes: (tokens, next-byte targets)."""
    torch = _torch()
    generator = np.random.default_rng(seed)
    data = torch.from_numpy(train_bytes.astype(np.int64))

    def draw():
        starts = generator.integers(0, len(train_bytes) - length - 1, size=batch)
        rows = torch.stack([data[s:s + length + 1] for s in starts])
        return rows[:, :-1], rows[:, 1:]

    return draw


def perplexity(model, valid: np.ndarray, length: int, tokens: int, stride: int | None = None,
               batch: int = 8) -> float:
    """exp(mean NLL per byte) of the validation bytes' first windows covering
    `tokens` bytes: non-overlapping windows of `length` (stride None: every byte
    after a window's first is scored, from the window's own prefix) or windows of
    `length` every `stride` bytes, each scoring its last `stride` bytes (the first
    window scores all of its own)."""
    torch = _torch()
    total, count = 0.0, 0
    step = length if stride is None else stride
    need = max(tokens, length + 1)
    if len(valid) < need + 1:
        raise ValueError(f"the validation text has {len(valid)} bytes, fewer than the "
                         f"{need + 1} that length {length} needs")
    starts = list(range(0, need - length + 1, step))
    data = torch.from_numpy(valid[:need + 1].astype(np.int64))
    with torch.no_grad():
        for at in range(0, len(starts), batch):
            group = starts[at:at + batch]
            rows = torch.stack([data[s:s + length + 1] for s in group])
            logits = model(rows[:, :-1]).double()
            nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), rows[:, 1:],
                                                    reduction="none")
            for row, start in zip(nll, group):
                scored = row if stride is None or start == 0 else row[length - stride:]
                total += float(scored.sum())
                count += scored.numel()
    return math.exp(total / count)


# ------------------------------------------------------------------ extrapolate


def extrapolate(encodings=None, preset: str | Preset = "default", data=None, seed: int = 0,
                hf: bool = False, quiet: bool = False, log=print) -> dict:
    """Train every encoding at the preset's length, evaluate at its multiples; the
    result as a JSON-ready dict (see the module's text)."""
    torch = _torch()
    chosen = PRESETS[preset] if isinstance(preset, str) else preset
    names = list(encodings or ENCODINGS)
    unknown = [name for name in names if name not in ENCODINGS]
    if unknown:
        raise ValueError(f"unknown encoding(s) {unknown}; the lab runs {', '.join(ENCODINGS)}")
    train_bytes, valid, info = corpus(data)
    if chosen.train_bytes and len(train_bytes) > chosen.train_bytes:
        train_bytes = train_bytes[:chosen.train_bytes]
    lengths = [chosen.train_length * k for k in chosen.multiples]
    results = {}
    for name in names:
        started = time.perf_counter()
        torch.manual_seed(seed)
        model = (build_hf_model if hf else build_model)(name, chosen, 256)
        losses = train(model, text_batches(train_bytes, chosen.train_length, chosen.batch, seed),
                       chosen.steps, chosen.lr, f"{name:>13}", quiet)
        flat = {str(n): round(perplexity(model, valid, n, chosen.eval_bytes), 6) for n in lengths}
        sliding = {str(n): round(perplexity(model, valid, n, chosen.eval_bytes, stride=n // 2), 6)
                   for n in lengths}
        results[name] = {"method": ENCODINGS[name][0], "train_loss": losses,
                         "nonoverlapping": flat, "sliding": sliding}
        log(f"{name:>13}: " + "  ".join(f"{n}: {flat[str(n)]:.3f}" for n in lengths)
            + f"   ({time.perf_counter() - started:.0f} s)")
    return {"kind": "extrapolate", "preset": asdict(chosen), "seed": seed, "hf": hf,
            "data": info, "lengths": lengths, "environment": _environment(), "results": results}


# ------------------------------------------------------------------ synthetic tasks

TASKS = ("copy", "reverse", "recall", "sort")
# the tasks' default encodings: one of each family (--encodings for every one)
TASK_ENCODINGS = ("nope", "rope", "alibi", "kerple", "t5", "relative_bias")
SEP, PAD = 0, 1                      # task tokens; items are 2 .. vocab - 1


def task_batch(task: str, items: int, batch: int, vocab: int, generator) -> tuple:
    """(tokens, targets) of one task: `items` random items, [SEP], the answer
    (copy: the items; reverse: reversed; sort: sorted; recall: items are key-value
    pairs, the answer is the value of a queried key, given after [SEP]); targets
    -100 except on the answer."""
    torch = _torch()
    x = torch.from_numpy(generator.integers(2, vocab, size=(batch, items)))
    sep = torch.full((batch, 1), SEP)
    if task == "recall":
        keys = torch.from_numpy(np.stack([generator.permutation(np.arange(2, vocab))[:items // 2]
                                          for _ in range(batch)]))
        pairs = torch.stack([keys, x[:, :items // 2]], 2).reshape(batch, -1)
        pick = torch.from_numpy(generator.integers(0, items // 2, size=batch))
        query = keys.gather(1, pick[:, None])
        answer = x[:, :items // 2].gather(1, pick[:, None])
        row = torch.cat([pairs, sep, query, answer], 1)
        answer_from = row.shape[1] - 1
    else:
        answer = {"copy": x, "reverse": x.flip(1), "sort": x.sort(1).values}[task]
        row = torch.cat([x, sep, answer], 1)
        answer_from = items + 1
    tokens, targets = row[:, :-1], row[:, 1:].clone()
    targets[:, :answer_from - 1] = -100
    return tokens, targets


def task_accuracy(model, task: str, items: int, vocab: int, seed: int, rows: int = 256) -> dict:
    """Token and sequence accuracy of greedy answers (teacher-forced) on `rows` instances."""
    torch = _torch()
    generator = np.random.default_rng(seed)
    right = total = whole = 0
    with torch.no_grad():
        for _ in range(0, rows, 64):
            tokens, targets = task_batch(task, items, 64, vocab, generator)
            guess = model(tokens).argmax(-1)
            scored = targets != -100
            hit = (guess == targets) & scored
            right += int(hit.sum())
            total += int(scored.sum())
            whole += int((hit.sum(1) == scored.sum(1)).sum())
    return {"token": round(right / total, 6), "sequence": round(whole / rows, 6)}


def tasks(encodings=None, task_names=None, preset: str | Preset = "default", seed: int = 0,
          hf: bool = False, quiet: bool = False, log=print) -> dict:
    """Train each encoding (default TASK_ENCODINGS) on each task at the preset's
    length (items = train_length // 4), test at its multiples up to 4x; the result
    as a dict."""
    torch = _torch()
    chosen = PRESETS[preset] if isinstance(preset, str) else preset
    names, task_names = list(encodings or TASK_ENCODINGS), list(task_names or TASKS)
    vocab = 64
    items = max(4, chosen.train_length // 4)
    sizes = [items * k for k in chosen.multiples if k <= 4]
    task_preset = replace(chosen, train_length=4 * items)      # positions the tasks reach
    results = {}
    for task in task_names:
        results[task] = {}
        for name in names:
            torch.manual_seed(seed)
            model = (build_hf_model if hf else build_model)(name, task_preset, vocab)
            generator = np.random.default_rng(seed)
            losses = train(model, lambda: task_batch(task, items, chosen.batch, vocab, generator),
                           chosen.steps, chosen.lr, f"{task}/{name}", quiet)
            accuracy = {str(size): task_accuracy(model, task, size, vocab, seed + 1)
                        for size in sizes}
            results[task][name] = {"train_loss": losses, "accuracy": accuracy}
            log(f"{task:>8} {name:>13}: " + "  ".join(
                f"{size}: {accuracy[str(size)]['token']:.2f}" for size in sizes))
    return {"kind": "tasks", "preset": asdict(chosen), "seed": seed, "hf": hf, "items": sizes,
            "environment": _environment(), "results": results}


def _environment() -> dict:
    import posenc

    torch = _torch()
    return {"python": platform.python_version(), "torch": torch.__version__,
            "posenc": posenc.__version__, "machine": platform.machine(),
            "threads": torch.get_num_threads()}


# ------------------------------------------------------------------ tables and plots


def table(result: dict, column: str = "nonoverlapping") -> str:
    """A markdown table of a result: perplexity per byte per length (extrapolate,
    `column` nonoverlapping or sliding) or token accuracy per size (tasks)."""
    if result["kind"] == "extrapolate":
        lengths = result["lengths"]
        train_length = result["preset"]["train_length"]
        lines = ["| encoding | " + " | ".join(f"{n}" + (" (train)" if n == train_length else "")
                                             for n in lengths) + " |",
                 "|---|" + "---|" * len(lengths)]
        for name, row in result["results"].items():
            lines.append(f"| {name} | " + " | ".join(f"{row[column][str(n)]:.3f}" for n in lengths)
                         + " |")
        return "\n".join(lines)
    sizes = result["items"]
    lines = ["| task | encoding | " + " | ".join(f"{n} items" for n in sizes) + " |",
             "|---|---|" + "---|" * len(sizes)]
    for task, rows in result["results"].items():
        for name, row in rows.items():
            lines.append(f"| {task} | {name} | " + " | ".join(
                f"{row['accuracy'][str(n)]['token']:.2f}" for n in sizes) + " |")
    return "\n".join(lines)


def plot(results: list, path: str, labels: list | None = None) -> list:
    """Perplexity against evaluation length (extrapolate; both evaluations side by
    side) or accuracy against size (tasks), one line per encoding (and per run when
    several are compared); written as `path` with .png and .svg.  Returns the files."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        raise ImportError("the lab's plots need matplotlib: pip install 'posenc[plot]'") from None
    labels = labels or [str(i) for i in range(len(results))]
    kind = results[0]["kind"]
    if any(result["kind"] != kind for result in results):
        raise ValueError("compare results of one kind (extrapolate or tasks)")
    if kind == "extrapolate":
        panels = ["nonoverlapping", "sliding"]
    else:
        panels = list(results[0]["results"])
    figure, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels) + 2.2, 4.2),
                                squeeze=False)
    names = list(dict.fromkeys(name for result in results for rows in (
        [result["results"]] if kind == "extrapolate" else result["results"].values())
        for name in rows))
    colors = {name: plt.get_cmap("tab20")(i % 20) for i, name in enumerate(names)}
    styles = ["-", "--", ":", "-."]
    for axis, panel in zip(axes[0], panels):
        for run, (result, label) in enumerate(zip(results, labels)):
            suffix = f" [{label}]" if len(results) > 1 else ""
            style = dict(marker="o", markersize=3.5, linestyle=styles[run % len(styles)])
            if kind == "extrapolate":
                x = result["lengths"]
                for name, row in result["results"].items():
                    axis.plot(x, [row[panel][str(n)] for n in x], color=colors[name],
                              label=name + suffix, **style)
                axis.axvline(result["preset"]["train_length"], color="0.6", linestyle=":")
                axis.set_xscale("log", base=2)
                axis.set_yscale("log")
                axis.set_xticks(x, [str(n) for n in x])
                axis.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
                axis.yaxis.set_minor_formatter(matplotlib.ticker.ScalarFormatter())
                axis.set_xlabel("evaluation length (bytes); dotted: training length")
                axis.set_ylabel("perplexity per byte")
                axis.set_title(f"{panel} windows")
            else:
                x = result["items"]
                for name, row in result["results"][panel].items():
                    axis.plot(x, [row["accuracy"][str(n)]["token"] for n in x],
                              color=colors[name], label=name + suffix, **style)
                axis.axvline(x[0], color="0.6", linestyle=":")
                axis.set_xticks(x, [str(n) for n in x])
                axis.set_xlabel("items (dotted: trained)")
                axis.set_ylabel("token accuracy")
                axis.set_ylim(0, 1.02)
                axis.set_title(panel)
            axis.grid(True, which="major", alpha=0.3)
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    figure.tight_layout()
    stem = os.path.splitext(path)[0]
    written = []
    for extension in (".png", ".svg"):
        figure.savefig(stem + extension, dpi=120)
        written.append(stem + extension)
    plt.close(figure)
    return written


# ------------------------------------------------------------------ the command line


def _save(result: dict, out: str, quiet: bool) -> None:
    stem = os.path.splitext(out)[0]
    with open(stem + ".json", "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
        f.write("\n")
    written = [stem + ".json"]
    try:
        written += plot([result], stem)
    except ImportError as error:
        print(f"posenc lab: {error}; wrote the JSON only", file=sys.stderr)
    if not quiet:
        print("wrote " + ", ".join(written))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m posenc lab",
        description="The positional-encoding lab: train each encoding short, test it long.")
    sub = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--encodings", nargs="+", metavar="NAME", choices=list(ENCODINGS),
                        help=f"encodings to run (default all: {', '.join(ENCODINGS)})")
    common.add_argument("--preset", choices=list(PRESETS), default="default",
                        help="sizes: smoke (seconds), default (under 10 minutes on 2 cores), "
                             "large (hours)")
    common.add_argument("--steps", type=int, help="training steps (default: the preset's)")
    common.add_argument("--seed", type=int, default=0, help="the run's seed (default 0)")
    common.add_argument("--hf", action="store_true",
                        help="a tiny Hugging Face Llama with the encoding swapped in "
                             "(needs transformers) instead of posenc.torch.nn's decoder")
    common.add_argument("--quiet", action="store_true", help="no progress bars")
    extrapolate_ = sub.add_parser("extrapolate", parents=[common],
                                  help="perplexity on real text at 1-16x the training length")
    extrapolate_.add_argument("--data", nargs="+", metavar="PATH",
                              help="text files or folders (default: the Python standard "
                                   "library's source)")
    extrapolate_.add_argument("--out", default="lab-extrapolate",
                              help="where the JSON and the plot go (stem; default "
                                   "lab-extrapolate.json/.png/.svg)")
    tasks_ = sub.add_parser("tasks", parents=[common],
                            help="copy, reverse, recall, sort: trained short, tested long")
    tasks_.add_argument("--tasks", nargs="+", choices=TASKS, help="tasks (default all)")
    tasks_.add_argument("--out", default="lab-tasks", help="stem of the JSON and the plot")
    plot_ = sub.add_parser("plot", help="table and plot of saved results (several: compared)")
    plot_.add_argument("results", nargs="+", help="JSON files of lab runs")
    plot_.add_argument("--out", default="lab-plot", help="stem of the plot (png and svg)")
    args = parser.parse_args(argv)
    if args.command == "plot":
        loaded = []
        for path in args.results:
            with open(path) as f:
                loaded.append(json.load(f))
        for path, result in zip(args.results, loaded):
            print(f"{path}:\n{table(result)}\n")
        print("wrote " + ", ".join(plot(loaded, args.out, [os.path.basename(p) for p in
                                                           args.results])))
        return 0
    chosen = PRESETS[args.preset]
    if args.steps is not None:
        chosen = replace(chosen, steps=args.steps)
    started = time.perf_counter()
    if args.command == "extrapolate":
        result = extrapolate(args.encodings, chosen, args.data, args.seed, args.hf, args.quiet)
    else:
        result = tasks(args.encodings, args.tasks, chosen, args.seed, args.hf, args.quiet)
    print()
    print(table(result))
    if result["kind"] == "extrapolate":
        print("\nsliding windows:\n" + table(result, "sliding"))
    print(f"\n{time.perf_counter() - started:.0f} s in all")
    _save(result, args.out, args.quiet)
    return 0
