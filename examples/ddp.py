"""Data-parallel training of a Hugging Face model patched onto posenc:
torch.distributed (gloo, CPU) + DistributedDataParallel.

Each of `--world-size` processes (1 torch thread and 1 posenc thread each)
builds the same tiny model from a config (random weights, no model hub),
patches it with `posenc.torch.hf.patch`, wraps it in DDP and trains on its
shard of every global batch; DDP averages the gradients across the ranks.
At the end the ranks compare their parameters (all_gather: they must be
bitwise identical), and rank 0 trains the same model for the same steps in
one process on the concatenated global batches and prints the largest
parameter difference to it (float32 rounding: the two sum the gradient in a
different order).

For the two to agree the loss is a mean over *examples* (a T5 sequence's
loss is the mean over its own tokens, then the mean over sequences), the
shards are equal, and dropout is off: the mean of the ranks' shard means is
then the mean over the global batch.

    python examples/ddp.py [--model t5|deberta|both] [--steps 5] [--world-size 2]
    torchrun --nproc-per-node 2 examples/ddp.py [--model t5|deberta] [--steps 5]

The script starts its processes itself (torch.multiprocessing, spawn, gloo
on 127.0.0.1 and a free port); under torchrun it uses torchrun's.
`--sync sum` (gradients summed, not averaged) and `--sync none` (no DDP,
each rank on its own shard) show what the comparison catches.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import time
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from transformers import (DebertaV2Config, DebertaV2ForSequenceClassification, T5Config,
                          T5ForConditionalGeneration)

import posenc
from posenc.torch import hf

VOCAB, PAD, EOS = 24, 0, 1
SYNCS = ("mean", "sum", "none")


def build_model(name: str, seed: int = 0):
    """The tiny model, patched, in train() mode with dropout off; the same
    weights in every process (DDP also broadcasts rank 0's at wrapping)."""
    torch.manual_seed(seed)
    if name == "t5":
        config = T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                          relative_attention_num_buckets=8, relative_attention_max_distance=16,
                          dropout_rate=0.0, decoder_start_token_id=PAD, pad_token_id=PAD, eos_token_id=EOS)
        model = T5ForConditionalGeneration(config)
    elif name == "deberta":
        config = DebertaV2Config(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                 intermediate_size=64, max_position_embeddings=64, relative_attention=True,
                                 pos_att_type=["p2c", "c2p"], share_att_key=True, position_buckets=8,
                                 max_relative_positions=16, norm_rel_ebd="layer_norm", num_labels=3,
                                 hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                 pad_token_id=PAD)
        model = DebertaV2ForSequenceClassification(config)
    else:
        raise ValueError(f"unknown model {name!r}: t5 or deberta")
    return hf.patch(model).train()


def global_batches(name: str, steps: int, size: int, seed: int = 1):
    """`steps` global batches of `size` padded sequences, the same in every
    process.  t5: reverse the sequence, then EOS; deberta: which of three
    tokens is the most frequent."""
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        length = 10
        ids = torch.randint(2, VOCAB, (size, length), generator=generator)
        kept = torch.randint(5, length + 1, (size,), generator=generator)
        mask = torch.arange(length)[None, :] < kept[:, None]
        if name == "deberta":
            ids = torch.randint(2, 5, (size, length), generator=generator).masked_fill(~mask, PAD)
            counts = torch.stack([(ids == token).sum(1) for token in (2, 3, 4)], dim=1)
            yield dict(input_ids=ids, attention_mask=mask.long(), labels=counts.argmax(1))
            continue
        ids = ids.masked_fill(~mask, PAD)
        target = torch.full((size, length + 1), -100)
        for row in range(size):
            target[row, :kept[row]] = ids[row, :kept[row]].flip(0)
            target[row, kept[row]] = EOS
        yield dict(input_ids=ids, attention_mask=mask.long(), labels=target)


def shard(batch: dict, rank: int, world: int) -> dict:
    """Rank `rank`'s contiguous slice: the shards concatenated are the batch."""
    size = next(iter(batch.values())).shape[0] // world
    return {key: value[rank * size:(rank + 1) * size] for key, value in batch.items()}


def example_mean_loss(model, batch: dict) -> torch.Tensor:
    """The mean over examples of each example's loss (a T5 sequence: the mean
    over its scored tokens), so that equal shards' means average to the
    global batch's mean.  HF's T5 loss is a mean over all the batch's tokens,
    which DDP's average would weigh differently on shards of unequal length."""
    out = model(**batch)
    labels = batch["labels"]
    if labels.dim() == 1:                                  # classifier: HF's loss is per example already
        return out.loss
    tokens = F.cross_entropy(out.logits.transpose(1, 2), labels, ignore_index=-100, reduction="none")
    scored = (labels != -100).to(tokens.dtype)
    return ((tokens * scored).sum(1) / scored.sum(1)).mean()


def fused_attention_nodes(loss: torch.Tensor) -> int:
    """How many of posenc's fused-attention autograd nodes the loss's graph
    holds: the patched layers ran posenc forward and will run its backward."""
    seen, stack, count = set(), [loss.grad_fn], 0
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        count += type(node).__name__ == "_FusedAttentionBackward"
        stack.extend(next_node for next_node, _ in node.next_functions)
    return count


def flat_parameters(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _sum_gradients(_state, bucket):
    """A DDP communication hook that sums the ranks' gradients without
    dividing by the world size: the wrong sync that --sync sum shows."""
    work = dist.all_reduce(bucket.buffer(), async_op=True)
    return work.get_future().then(lambda future: future.value()[0])


def train(args, name: str, rank: int = 0, world: int = 1, sync: str = "mean") -> dict:
    """Train model `name` for args.steps steps on shard `rank` of `world`;
    world == 1 is the single-process run on whole global batches."""
    model = build_model(name)
    wrapped = model
    if world > 1 and sync != "none":
        wrapped = DistributedDataParallel(model)
        if sync == "sum":
            wrapped.register_comm_hook(None, _sum_gradients)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    losses, nodes = [], 0
    for batch in global_batches(name, args.steps, args.batch):
        loss = example_mean_loss(wrapped, shard(batch, rank, world))
        nodes = nodes or fused_attention_nodes(loss)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        reported = loss.detach().clone()
        if world > 1:                                      # the global batch's loss, for printing
            dist.all_reduce(reported)
            reported /= world
        losses.append(reported.item())
    return dict(parameters=flat_parameters(model), losses=losses, fused_nodes=nodes,
                patched=hf.is_patched(model))


def worker(rank: int, world: int, args, init_method: str = "env://") -> None:
    torch.set_num_threads(1)
    posenc.set_num_threads(1)
    warnings.filterwarnings("error", message="posenc.torch.hf")   # a fallback to HF's code is an error here
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    reports, apart = {}, []
    try:
        for name in args.models:
            report = _train_and_compare(args, name, rank, world)
            if "mean" in report["runs"] and not report["runs"]["mean"]["ranks_identical"]:
                apart.append(name)
            if rank == 0:
                _compare_to_single_process(args, report)
                reports[name] = report
        if rank == 0 and args.report:
            with open(args.report, "w", encoding="utf-8") as handle:
                json.dump(reports, handle, indent=1)
    finally:
        dist.destroy_process_group()
    if apart:                                              # every rank knows (all_gather), every rank fails
        raise RuntimeError(f"DDP ranks ended with different parameters: {apart}")


def _train_and_compare(args, name: str, rank: int, world: int) -> dict:
    """Every --sync run of model `name`, the ranks' parameters compared."""
    report = {"model": name, "steps": args.steps, "world_size": world, "batch": args.batch, "runs": {}}
    for sync in args.sync:
        start = time.perf_counter()
        run = train(args, name, rank, world, sync)
        seconds = time.perf_counter() - start
        gathered = [torch.empty_like(run["parameters"]) for _ in range(world)]
        dist.all_gather(gathered, run["parameters"])
        report["runs"][sync] = dict(
            losses=run["losses"], seconds=seconds, fused_nodes=run["fused_nodes"], patched=run["patched"],
            ranks_identical=all(torch.equal(p, gathered[0]) for p in gathered),
            max_rank_difference=max((p - gathered[0]).abs().max().item() for p in gathered),
            parameters=run["parameters"])
    return report


def _compare_to_single_process(args, report: dict) -> None:
    start = time.perf_counter()
    single = train(args, report["model"])
    report["single"] = dict(losses=single["losses"], seconds=time.perf_counter() - start,
                            parameter_scale=single["parameters"].abs().max().item())
    for sync, run in report["runs"].items():
        difference = run.pop("parameters") - single["parameters"]
        run["max_difference_vs_single"] = difference.abs().max().item()
    initial = flat_parameters(build_model(report["model"]))
    report["initial_distance"] = (single["parameters"] - initial).abs().max().item()
    print_report(report)


def print_report(report: dict) -> None:
    print(f"{report['model']}: {report['world_size']} processes (gloo, DDP), global batch {report['batch']}, "
          f"{report['steps']} SGD steps")
    single = report["single"]
    for sync, run in report["runs"].items():
        print(f"--sync {sync}: posenc fused-attention nodes per forward {run['fused_nodes']}, "
              f"patched {run['patched']}, {run['seconds']:.2f} s")
        print("  step  loss (ranks' mean)  loss (1 process, whole batch)")
        for step, (loss, want) in enumerate(zip(run["losses"], single["losses"])):
            print(f"  {step:4d}  {loss:18.7f}  {want:29.7f}")
        print(f"  ranks bitwise identical: {run['ranks_identical']} "
              f"(max |rank r - rank 0| {run['max_rank_difference']:.3g})")
        print(f"  max |parameter - single process| {run['max_difference_vs_single']:.3g} "
              f"(largest parameter {single['parameter_scale']:.3g}, "
              f"training moved them by up to {report['initial_distance']:.3g})")
    print(f"single process: {single['seconds']:.2f} s")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("t5", "deberta", "both"), default="t5",
                        help="both: t5, then deberta, in the same processes")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--world-size", type=int, default=2,
                        help="processes to spawn (ignored under torchrun, which sets WORLD_SIZE)")
    parser.add_argument("--batch", type=int, default=8, help="global batch, split evenly over the ranks")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--sync", default="mean",
                        type=lambda text: [s for s in text.split(",") if s],
                        help="comma-separated runs: mean (DDP, the default), sum (gradients summed), "
                             "none (no DDP)")
    parser.add_argument("--report", help="rank 0 writes the figures there as JSON")
    args = parser.parse_args(argv)
    unknown = [s for s in args.sync if s not in SYNCS]
    if unknown or not args.sync:
        parser.error(f"--sync: one or more of {', '.join(SYNCS)}")
    args.models = ["t5", "deberta"] if args.model == "both" else [args.model]
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:          # under torchrun
        world = int(os.environ["WORLD_SIZE"])
        rank = int(os.environ["RANK"])
        launch = None
    else:
        world, launch = args.world_size, f"tcp://127.0.0.1:{free_port()}"
    if world < 1 or args.batch % world:
        raise SystemExit(f"the global batch {args.batch} must split evenly over {world} processes")
    start = time.perf_counter()
    if launch is None:
        worker(rank, world, args)
    else:
        mp.start_processes(worker, args=(world, args, launch), nprocs=world, start_method="spawn")
        print(f"total {time.perf_counter() - start:.1f} s (start of {world} processes included)")


if __name__ == "__main__":
    main()
