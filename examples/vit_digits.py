"""A small ViT on scikit-learn's digits, once per 2-D positional encoding.

    python examples/vit_digits.py                 # 400 steps per encoding, a table
    python examples/vit_digits.py --steps 100     # shorter
    python examples/vit_digits.py --quick         # a smoke run

The 8 x 8 digit images (1,797 of them, bundled with scikit-learn) are cut into
2 x 2 patches: a 4 x 4 grid of 16 tokens after a [CLS] token, classified from
[CLS] by a two-layer ViT of `posenc.torch.nn.PositionalSelfAttention` layers.
Each run swaps the attention's positional encoding, everything else (weights'
seed, data order, optimiser) the same:

* ``none``: content attention alone (the grid is invisible);
* ``relative_bias_2d``: Swin's / BEiT's learned table of 2-D offsets, [CLS]
  global (`RelativeBias2D`);
* ``axial_rope``: Pixtral's 2-D axial RoPE (`AxialRoPE2D`), [CLS] unrotated;
* ``rope_mixed``: RoPE-Mixed's learned per-head frequencies (`RoPEMixed`);
* ``rope_1d``: RoPE of the raster order (`RotaryEmbedding`): a 1-D encoding
  of a 2-D image.

Accuracy on a held-out quarter is printed as a table (mean of the last
evaluations) with the time per step; every encoding runs on the fused kernels
forward and backward.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from torch import nn

from posenc.torch import nn as pnn

GRID, PATCH = (4, 4), 2
ENCODINGS = ("none", "relative_bias_2d", "axial_rope", "rope_mixed", "rope_1d")


def encoding(name: str, heads: int, head_dim: int):
    """The positional encoding `name` of a [CLS] + 4 x 4 patch sequence."""
    if name == "none":
        return None
    if name == "relative_bias_2d":
        return pnn.RelativeBias2D(heads, grid=GRID, cls_token=True)
    if name == "axial_rope":
        return pnn.AxialRoPE2D(heads, head_dim, GRID, prefix_tokens=1)
    if name == "rope_mixed":
        return pnn.RoPEMixed(heads, head_dim, GRID, prefix_tokens=1)
    if name == "rope_1d":
        return pnn.RotaryEmbedding(heads, head_dim)
    raise ValueError(f"unknown encoding {name!r}; choose one of {', '.join(ENCODINGS)}")


class ViT(nn.Module):
    """Patch embedding, [CLS], `depth` pre-norm blocks of posenc attention + MLP."""

    def __init__(self, name: str, d_model: int = 64, heads: int = 4, depth: int = 2,
                 classes: int = 10):
        super().__init__()
        self.patch = nn.Linear(PATCH * PATCH, d_model)
        self.cls = nn.Parameter(torch.zeros(1, 1, d_model))
        self.blocks = nn.ModuleList()
        for _ in range(depth):
            self.blocks.append(nn.ModuleDict(dict(
                norm1=nn.LayerNorm(d_model), norm2=nn.LayerNorm(d_model),
                attention=pnn.PositionalSelfAttention(
                    d_model, heads, encoding(name, heads, d_model // heads)),
                mlp=nn.Sequential(nn.Linear(d_model, 2 * d_model), nn.GELU(),
                                  nn.Linear(2 * d_model, d_model)))))
        self.head = nn.Linear(d_model, classes)

    def forward(self, images):                      # (B, 8, 8)
        B = images.shape[0]
        patches = images.reshape(B, 4, PATCH, 4, PATCH).permute(0, 1, 3, 2, 4).reshape(B, 16, -1)
        x = torch.cat([self.cls.expand(B, -1, -1), self.patch(patches)], 1)
        for block in self.blocks:
            x = x + block["attention"](block["norm1"](x))
            x = x + block["mlp"](block["norm2"](x))
        return self.head(x[:, 0])


def digits(seed: int = 0):
    """(train images, labels, test images, labels): float32 in [0, 1], a held-out quarter."""
    from sklearn.datasets import load_digits

    data = load_digits()
    images = torch.tensor(data.images / 16.0, dtype=torch.float32)
    labels = torch.tensor(data.target)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    cut = len(labels) * 3 // 4
    return images[order[:cut]], labels[order[:cut]], images[order[cut:]], labels[order[cut:]]


def train(name: str, steps: int, data, *, seed: int = 0, batch: int = 64, evals: int = 4) -> dict:
    """One run: the accuracy on the held-out images at the last `evals` evaluations (every
    steps // 10), their mean, and the time per step."""
    x_train, y_train, x_test, y_test = data
    torch.manual_seed(seed)
    model = ViT(name)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    rng = torch.Generator().manual_seed(seed)
    accuracies, started = [], time.perf_counter()
    every = max(1, steps // 10)
    for step in range(1, steps + 1):
        idx = torch.randint(0, len(y_train), (batch,), generator=rng)
        loss = nn.functional.cross_entropy(model(x_train[idx]), y_train[idx])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % every == 0 or step == steps:
            with torch.no_grad():
                accuracies.append(float((model(x_test).argmax(-1) == y_test).float().mean()))
    seconds = (time.perf_counter() - started) / steps
    last = accuracies[-evals:]
    return dict(encoding=name, accuracy=float(np.mean(last)), last=last,
                final_loss=float(loss.detach()), ms_per_step=1e3 * seconds)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--encodings", nargs="+", choices=ENCODINGS, default=list(ENCODINGS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="a few steps each (a smoke run)")
    args = parser.parse_args(argv)
    steps = 10 if args.quick else args.steps
    data = digits(args.seed)
    print(f"digits: {len(data[1])} train, {len(data[3])} test images; [CLS] + 4 x 4 patches of "
          f"2 x 2; {steps} steps of 64 per encoding")
    print("| encoding | test accuracy (mean of the last 4 evaluations) | final loss | ms / step |")
    print("|---|---|---|---|")
    for name in args.encodings:
        r = train(name, steps, data, seed=args.seed)
        print(f"| {name} | {r['accuracy']:.3f} | {r['final_loss']:.3f} | {r['ms_per_step']:.1f} |",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
