"""Train a tiny 2-layer Transformer with every positional encoding of posenc.torch.nn.

The task needs position and nothing else: a sequence starts with a [CLS]
token followed by random tokens, and the target at position i is the token
at position i - SHIFT.  Content attention alone cannot tell which key is
SHIFT places back (its loss stays at log(vocab)); every positional encoding
can.  For each encoding the script trains the same model on CPU with the C
kernels (posenc.torch's custom ops), prints the loss at the start and the
end, then times training steps with the C kernels and with the torch-native
formulas (posenc.torch.use_native) on the same model: each step on its own,
the two alternating, the median step of each (with one thread, by the CPU
time of the process, which other processes on shared cores do not inflate).

    python examples/train_tiny.py            # all encodings: about 63 s of CPU time in all
    python examples/train_tiny.py --quick    # smoke run: a few steps each
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time

import torch
from torch import nn

import posenc
import posenc.torch as pt
from posenc.torch import nn as pnn

VOCAB = 16          # token 0 is [CLS]
SHIFT = 3
D_MODEL, HEADS = 32, 4
HEAD_DIM = D_MODEL // HEADS


class TinyModel(nn.Module):
    """Token embedding (no position at the input) → 2 pre-LN blocks → logits."""

    def __init__(self, make_encoding, seq_len: int, *, shared: bool, layers: int = 2):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        # layer-wise sharing: one encoding module for all layers (T5, TUPE, DIET-ABS)
        self.shared = make_encoding(seq_len) if shared else None
        self.attention = nn.ModuleList(
            pnn.PositionalSelfAttention(D_MODEL, HEADS, self.shared if shared else
                                        make_encoding(seq_len)) for _ in range(layers))
        self.mlp = nn.ModuleList(
            nn.Sequential(nn.Linear(D_MODEL, 4 * D_MODEL), nn.GELU(), nn.Linear(4 * D_MODEL, D_MODEL))
            for _ in range(layers))
        self.norms = nn.ModuleList(nn.LayerNorm(D_MODEL) for _ in range(2 * layers + 1))
        self.head = nn.Linear(D_MODEL, VOCAB)

    def forward(self, tokens):
        x = self.embed(tokens)
        n = tokens.shape[1]
        # TUPE / DIET-ABS: the positional correlation once per forward, reused by every layer
        state = self.shared.positional(n, n) if self.shared is not None else None
        for index, (attention, mlp) in enumerate(zip(self.attention, self.mlp)):
            x = x + attention(self.norms[2 * index](x), state=state)
            x = x + mlp(self.norms[2 * index + 1](x))
        return self.head(self.norms[-1](x))


def encodings(seq_len: int):
    """name → (factory(seq_len), shared between layers)."""
    span = seq_len // 2
    return {
        "content (baseline, no position)": (lambda n: None, False),
        "t5": (lambda n: pnn.T5RelativeBias(HEADS, num_buckets=16, max_distance=n), True),
        "shaw": (lambda n: pnn.ShawRelative(HEADS, HEAD_DIM, span), False),
        "m2": (lambda n: pnn.M2Relative(HEADS, span, per_head=True), False),
        "m4": (lambda n: pnn.M4Relative(HEADS, HEAD_DIM, span), False),
        "m4m": (lambda n: pnn.M4MRelative(HEADS, HEAD_DIM, span), False),
        "deberta": (lambda n: pnn.DebertaRelative(D_MODEL, HEADS, max_relative_positions=span), False),
        "tupe (TUPE-R)": (lambda n: pnn.TUPE(D_MODEL, HEADS, n, relative=True, num_buckets=16,
                                             max_distance=n), True),
        "diet_abs": (lambda n: pnn.DIETAbs(HEADS, n, HEAD_DIM), True),
        "diet_rel": (lambda n: pnn.DIETRel(HEADS, span), False),
    }


def batch(generator, size: int, seq_len: int):
    tokens = torch.randint(1, VOCAB, (size, seq_len), generator=generator)
    tokens[:, 0] = 0                                   # [CLS]
    targets = torch.full_like(tokens, -100)            # ignored
    targets[:, SHIFT + 1:] = tokens[:, 1:seq_len - SHIFT]
    return tokens, targets


def trainer(model, batch_size: int, seq_len: int, seed: int):
    """A function that runs one training step (a fresh batch, Adam) and returns its loss."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    loss_fn = nn.CrossEntropyLoss(ignore_index=-100)

    def step() -> float:
        tokens, targets = batch(generator, batch_size, seq_len)
        loss = loss_fn(model(tokens).reshape(-1, VOCAB), targets.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.item()

    return step


def train(model, steps: int, batch_size: int, seq_len: int, seed: int):
    step = trainer(model, batch_size, seq_len, seed)
    return [step() for _ in range(steps)]


def step_clock():
    """The clock of a step: with one torch and one posenc thread, the process's
    CPU time (what the step costs; on cores shared with other processes the
    wall clock would also count the time they ran), else the wall clock."""
    if torch.get_num_threads() == 1 and posenc.get_num_threads() == 1:
        return time.process_time
    return time.perf_counter


def seconds_per_step(model, steps: int, batch_size: int, seq_len: int, repeats: int = 10):
    """Seconds per training step with the C ops and with the native formulas:
    every step timed on its own (step_clock), the two backends alternating
    every `steps` steps, `repeats` times; the median step of each."""
    clock = step_clock()
    step = trainer(model, batch_size, seq_len, seed=1)
    times = {False: [], True: []}                             # native: no, yes
    for native in times:                                      # warm-up
        with pt.use_native(native):
            for _ in range(2):
                step()
    for _ in range(repeats):
        for native, spent in times.items():
            with pt.use_native(native):
                for _ in range(steps):
                    start = clock()
                    step()
                    spent.append(clock() - start)
    return statistics.median(times[False]), statistics.median(times[True])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few steps per encoding (smoke test)")
    parser.add_argument("--steps", type=int, default=None, help="training steps per encoding")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch and posenc threads; 0 keeps their defaults.  The model is "
                             "tiny: each op is microseconds of work, which threads only slow down "
                             "(and on shared cores, an OpenMP barrier waits for descheduled threads)")
    args = parser.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
        posenc.set_num_threads(args.threads)
    steps = args.steps or (4 if args.quick else 300)
    timing_steps, timing_repeats = (2, 1) if args.quick else (10, 10)
    batch_size, seq_len = (4, 8) if args.quick else (32, 24)

    print(f"task: copy the token {SHIFT} places back; vocab {VOCAB} (chance loss "
          f"{math.log(VOCAB - 1):.2f}), length {seq_len}, batch {batch_size}, {steps} steps, "
          f"2 layers, d_model {D_MODEL}, {HEADS} heads; torch {torch.__version__}, "
          f"{torch.get_num_threads()} torch / {posenc.get_num_threads()} posenc threads")
    print(f"{'encoding':34s} {'loss start':>10s} {'loss end':>9s}  "
          f"{'s/step C ops':>12s} {'s/step native':>13s} {'native/C':>8s}")
    failed = []
    for name, (factory, shared) in encodings(seq_len).items():
        torch.manual_seed(0)
        model = TinyModel(factory, seq_len, shared=shared)
        losses = train(model, steps, batch_size, seq_len, seed=0)
        window = max(1, min(5, steps // 4))            # mean of the first / last few steps
        start = sum(losses[:window]) / window
        end = sum(losses[-window:]) / window
        c_time, native_time = seconds_per_step(model, timing_steps, batch_size, seq_len,
                                               repeats=timing_repeats)
        print(f"{name:34s} {start:10.3f} {end:9.3f}  {c_time:12.4f} {native_time:13.4f} "
              f"{native_time / c_time:8.2f}", flush=True)
        if not name.startswith("content") and end > 0.25 * start:
            failed.append(name)
    clock = "CPU time of the process" if step_clock() is time.process_time else "wall clock"
    print("s/step: one training step (forward, backward, Adam) of the whole model, the encoding's "
          "logits by the posenc C ops\nor by the torch-native formulas (posenc.torch.use_native); "
          f"the median of {timing_repeats * timing_steps} steps each ({clock}), the two "
          f"alternating every {timing_steps} steps.")
    if failed and not args.quick:
        print(f"did not learn the task: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
