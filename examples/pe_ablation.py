"""The survey's comparison on a laptop: one small Hugging Face model, trained once
per positional encoding, swapped in with one call.

    python examples/pe_ablation.py                      # Llama-shaped, 300 steps per encoding
    python examples/pe_ablation.py --model bert         # a BERT (bidirectional, masked copy)
    python examples/pe_ablation.py --quick              # a smoke run: a few steps each

A tiny model is built from a config with random weights; for each encoding
`posenc.torch.hf.swap_positional_encoding(model, method)` replaces the model's
own (Llama's rotary embedding, BERT's absolute position embeddings) and the
model trains on a task that needs positions: copy.  A row is k random tokens,
a separator, and the same k tokens again; the loss is on the copy, whose token
t is the one k + 1 places back.  The Llama-shaped model predicts the next token
(causal); the BERT sees the copy masked and fills it in (bidirectional: there,
content attention alone -- "nope" -- has no way to tell positions apart and
stays near log(vocab)).  The script prints a table of the losses and draws
the curves (`--plot`, default pe_ablation.png; needs matplotlib).
"""

from __future__ import annotations

import argparse
import math
import time

import torch

from posenc.torch.nn import encoding_classes

VOCAB, K = 32, 8                 # tokens 0, 1 are [SEP] and [MASK]
SEP, MASK = 0, 1
METHODS = tuple(encoding_classes())     # every encoding of posenc.torch.nn, in its order
LABELS = {"content": "nope"}


def build(kind: str, seed: int = 0):
    """A tiny random Llama-shaped (GQA) causal LM or BERT masked LM, float32."""
    import transformers

    torch.manual_seed(seed)
    if kind == "llama":
        config = transformers.LlamaConfig(
            vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
        return transformers.LlamaForCausalLM(config)
    config = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=64, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0)
    return transformers.BertForMaskedLM(config)


def batch(kind: str, size: int, generator: torch.Generator) -> dict:
    """Copy rows: x (k tokens), [SEP], x again; labels on the copy only (-100 elsewhere)."""
    x = torch.randint(2, VOCAB, (size, K), generator=generator)
    row = torch.cat([x, torch.full((size, 1), SEP), x], dim=1)
    labels = torch.full_like(row, -100)
    if kind == "llama":
        labels[:, K + 1:] = row[:, K + 1:]          # HF shifts: position p predicts p + 1
        return dict(input_ids=row, labels=labels)
    labels[:, K + 1:] = x
    masked = row.clone()
    masked[:, K + 1:] = MASK
    return dict(input_ids=masked, labels=labels)


def train(kind: str, method: str, steps: int, *, seed: int = 0, batch_size: int = 32,
          lr: float = 3e-3) -> dict:
    """Swap `method` into a fresh model and train it; the losses, the step time and
    the encoding's parameter count."""
    from posenc.torch.hf import swap_positional_encoding

    model = swap_positional_encoding(build(kind, seed), method)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(seed + 1)
    losses = []
    start = time.perf_counter()
    for _ in range(steps):
        loss = model(**batch(kind, batch_size, generator)).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    seconds = time.perf_counter() - start
    return dict(losses=losses, step_ms=1e3 * seconds / max(steps, 1),
                parameters=sum(p.numel() for p in model.posenc_encodings.parameters()))


def _final(losses, window: int = 20) -> float:
    tail = losses[-window:]
    return sum(tail) / len(tail)


def table(results: dict) -> str:
    rows = [f"{'encoding':<14} {'params':>7} {'loss start':>10} {'loss end':>9} {'ms/step':>8}",
            "-" * 52]
    for method, result in results.items():
        rows.append(f"{LABELS.get(method, method):<14} {result['parameters']:>7} "
                    f"{result['losses'][0]:>10.3f} {_final(result['losses']):>9.3f} "
                    f"{result['step_ms']:>8.1f}")
    rows.append(f"(chance: log({VOCAB - 2}) = {math.log(VOCAB - 2):.3f}; loss end = mean of the last 20 steps)")
    return "\n".join(rows)


def plot(results: dict, kind: str, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(8, 5))
    for method, result in sorted(results.items(), key=lambda item: _final(item[1]["losses"])):
        axis.plot(result["losses"], label=f"{LABELS.get(method, method)} ({_final(result['losses']):.2f})",
                  linewidth=1.2)
    axis.axhline(math.log(VOCAB - 2), color="grey", linestyle=":", linewidth=1, label="chance")
    axis.set(xlabel="step", ylabel="loss on the copy", yscale="log",
             title=f"copy task, tiny {kind}: one positional encoding per run (posenc)")
    axis.legend(fontsize=8, ncol=2)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("llama", "bert"), default="llama")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--quick", action="store_true", help="10 steps each (a smoke run)")
    parser.add_argument("--plot", default="pe_ablation.png", help="where to draw the curves ('' for none)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    steps = 10 if args.quick else args.steps
    results = {}
    for method in args.methods:
        results[method] = train(args.model, method, steps, seed=args.seed)
        print(f"{LABELS.get(method, method):<14} loss {results[method]['losses'][0]:.3f} -> "
              f"{_final(results[method]['losses']):.3f}", flush=True)
    print()
    print(table(results))
    if args.plot:
        try:
            plot(results, args.model, args.plot)
            print(f"curves: {args.plot}")
        except ImportError:
            print("matplotlib is not installed: no plot (pip install matplotlib)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
