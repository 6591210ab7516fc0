#!/usr/bin/env python
"""Hugging Face models patched onto posenc (posenc.torch.hf) against HF's own attention.

    python benchmarks/hf.py [--quick] [--out DIR] [--threads 2] [--repeats 3] [--repeats-long 2]
                            [--note TEXT] [--models NAME ...] [--before PATH] [--profile]

One run, float32, 2 threads (torch and posenc), random weights from configs (no downloads):

* T5-small shape (d_model 512, 8 heads, d_kv 64, d_ff 2048, 6 + 6 layers, vocab 32128,
  32 buckets up to 128), T5ForConditionalGeneration in train() mode (dropout 0.1):
  a training step (forward + backward of the loss with labels) at batch 8, encoder 512
  tokens (two of the eight padded to 384), decoder 512 tokens; and, in eval() mode,
  greedy generate() of 64 new tokens with HF's cache from the same encoder batch.
* DeBERTa-v3-base shape (12 layers, hidden 768, 12 heads, d_ff 3072, vocab 128100,
  position_buckets 256, relative_attention, c2p|p2c, share_att_key, LayerNorm eps 1e-7),
  DebertaV2ForSequenceClassification in train() mode: a training step at batch 8 x 512.

Each against HF's attn_implementation "eager" and "sdpa" (where HF refuses one for a
model, the output says so): "posenc" is the same HF model with HF's default
implementation, patched by posenc.torch.hf.patch.  Every case runs in a process of
its own (model, inputs, a tiny warm-up step), and the cases of a model take turns,
step by step (the order rotating every round), so that a loaded machine slows all
alike.  A case's first step is a warm-up (reported apart); then --repeats timed
T5 training steps, --repeats-long timed generate() calls and DeBERTa training steps
(the long ones): median, min and max.  Peak memory: the largest over a case's steps
of its process's VmHWM (reset before each step) above its RSS as the step starts: the model,
its inputs and a warm-up at tiny size (each step gives its memory back).  Targets (issue 15): the patched T5 training step >= 2x faster
than the best HF implementation and its peak memory <= 0.5x the lowest HF peak;
DeBERTa's training step >= 2x.  Results: <out>/hf-<date>.json and .md
(--quick: tiny shapes, seconds; out defaults to benchmarks/results/tmp).

--before PATH adds, for each posenc case, the same case on PATH's posenc (a checkout
built in place: `git worktree add PATH <commit>`, then `python setup.py build_ext
--inplace` there), labelled "@before", taking turns with the others: a change's
effect on a whole model's step, time and peak memory.  --profile runs, after the
timed training steps, one more step of each posenc case under torch.profiler and
reports its copies (aten::copy_: calls, milliseconds, the largest shapes).
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARK = "@@posenc-hf "         # a worker's protocol lines on stdout start with this
IMPLEMENTATIONS = ("posenc", "eager", "sdpa")
# a model on HF's attention interface also runs the attention alone on posenc
EXTRA = {"llama": ("posenc-attn",), "llama-2k": ("posenc-attn",)}

T5_SMALL = dict(vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_decoder_layers=6,
                num_heads=8, relative_attention_num_buckets=32, relative_attention_max_distance=128,
                dropout_rate=0.1, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
DEBERTA_V3_BASE = dict(vocab_size=128100, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                       intermediate_size=3072, max_position_embeddings=512, relative_attention=True,
                       position_buckets=256, max_relative_positions=-1, norm_rel_ebd="layer_norm",
                       share_att_key=True, pos_att_type=["p2c", "c2p"], layer_norm_eps=1e-7,
                       position_biased_input=False, type_vocab_size=0, num_labels=2)
LLAMA = dict(vocab_size=32000, hidden_size=512, intermediate_size=1408, num_hidden_layers=8,
             num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=4096,
             attention_dropout=0.0, pad_token_id=0, bos_token_id=1, eos_token_id=2)
BLOOM = dict(vocab_size=32000, hidden_size=512, n_layer=8, n_head=8, attention_dropout=0.0,
             hidden_dropout=0.0, pad_token_id=0, bos_token_id=1, eos_token_id=2)
SHAPES = {
    "t5": dict(config=T5_SMALL, batch=8, encoder=512, decoder=512, new_tokens=64),
    "deberta": dict(config=DEBERTA_V3_BASE, batch=8, encoder=512),
    "llama": dict(config=LLAMA, batch=4, encoder=1024, new_tokens=64),
    "bloom": dict(config=BLOOM, batch=4, encoder=1024),
    "llama-2k": dict(config=LLAMA, batch=1, encoder=2048, new_tokens=64),   # issue 30: decoding
}
CAUSAL = ("llama", "bloom", "llama-2k")           # decoder-only: left padding, labels = ids
QUICK_SHAPES = {
    "t5": dict(config=dict(T5_SMALL, vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                           num_decoder_layers=2, num_heads=4, relative_attention_num_buckets=8,
                           relative_attention_max_distance=16),
               batch=2, encoder=24, decoder=16, new_tokens=4),
    "deberta": dict(config=dict(DEBERTA_V3_BASE, vocab_size=64, hidden_size=32, num_hidden_layers=2,
                                num_attention_heads=4, intermediate_size=64),
                    batch=2, encoder=24),
    "llama": dict(config=dict(LLAMA, vocab_size=64, hidden_size=32, intermediate_size=64,
                              num_hidden_layers=2, num_attention_heads=4), batch=2, encoder=24,
                  new_tokens=4),
    "bloom": dict(config=dict(BLOOM, vocab_size=64, hidden_size=32, n_layer=2, n_head=4), batch=2,
                  encoder=24),
    "llama-2k": dict(config=dict(LLAMA, vocab_size=64, hidden_size=32, intermediate_size=64,
                                 num_hidden_layers=2, num_attention_heads=4), batch=1, encoder=48,
                     new_tokens=4),
}
TITLES = {"t5": "T5-small shape, T5ForConditionalGeneration",
          "deberta": "DeBERTa-v3-base shape, DebertaV2ForSequenceClassification",
          "llama": "Llama shape (d_model 512, 8 heads, 2 KV heads, 8 layers, vocab 32000), "
                   "LlamaForCausalLM; posenc: patch() (attn_implementation=\"posenc\" and the "
                   "q, k, v, o projections on posenc's GEMM); posenc-attn: attn_implementation=\"posenc\" alone",
          "bloom": "BLOOM shape (d_model 512, 8 heads, 8 layers, vocab 32000), BloomForCausalLM",
          "llama-2k": "The Llama shape decoding: generate() of 64 tokens after a 2048-token prompt, "
                      "batch 1 (posenc and posenc-attn as above)"}
# the commands a model's cases run
COMMANDS = {"t5": ("generate", "train"), "deberta": ("train",), "llama": ("generate", "train"),
            "bloom": ("train",), "llama-2k": ("generate",)}


# ------------------------------------------------------------------ the worker (one case)

def _model_class(name):
    import transformers

    return {"t5": (transformers.T5Config, transformers.T5ForConditionalGeneration),
            "deberta": (transformers.DebertaV2Config, transformers.DebertaV2ForSequenceClassification),
            "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
            "llama-2k": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
            "bloom": (transformers.BloomConfig, transformers.BloomForCausalLM)}[name]


def _build(name, shape, implementation, seed=0):
    """The model with `implementation` ("posenc": HF's default, patched -- for the
    Llama shape attn_implementation="posenc" and its q, k, v, o projections on
    posenc's GEMM; "posenc-attn": attn_implementation="posenc" alone), or the
    implementation HF runs when it refuses that one (the caller checks)."""
    import torch
    from posenc.torch import hf

    config_class, model_class = _model_class(name)
    torch.manual_seed(seed)
    config = config_class(**shape["config"])
    chosen = {"posenc": None, "posenc-attn": "posenc"}.get(implementation, implementation)
    model = model_class._from_config(config, attn_implementation=chosen)
    if implementation == "posenc":
        hf.patch(model)
    return model


def _inputs(name, shape, batch, length, decoder, seed=1):
    """Token ids, an attention mask padding the last quarter of a quarter of the
    batch's sequences (at least one; the first quarter in a decoder-only model, left
    padding as generate() wants it), and labels (T5: `decoder` tokens; a decoder-only
    model: the ids, -100 on padding)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    vocab = shape["config"]["vocab_size"]
    ids = torch.randint(3, vocab, (batch, length), generator=g)
    mask = torch.ones_like(ids)
    padded = slice(0, length // 4) if name in CAUSAL else slice(length - length // 4, length)
    if batch > 1:                         # a batch of one has nothing to pad to
        mask[batch - max(1, batch // 4):, padded] = 0
    ids[mask == 0] = 0
    if name in CAUSAL:
        labels = ids.masked_fill(mask == 0, -100)
    elif name == "t5":
        labels = torch.randint(2, vocab, (batch, decoder), generator=g)
    else:
        labels = torch.randint(0, shape["config"]["num_labels"], (batch,), generator=g)
    return dict(input_ids=ids, attention_mask=mask, labels=labels)


def _train_step(model, batch) -> float:
    import time as _time

    model.train()
    model.zero_grad(set_to_none=True)
    start = _time.perf_counter()
    model(**batch).loss.backward()
    seconds = _time.perf_counter() - start
    model.zero_grad(set_to_none=True)
    return seconds


def _profiled_step(model, batch) -> dict:
    """A training step under torch.profiler: its seconds and its copies (aten::copy_: calls,
    self milliseconds, and the shapes that copied most)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        seconds = _train_step(model, batch)
    copies = [e for e in prof.key_averages(group_by_input_shape=True) if e.key == "aten::copy_"]
    shapes = sorted(copies, key=lambda e: -e.self_cpu_time_total)[:6]
    return {"s": seconds, "copy_calls": sum(e.count for e in copies),
            "copy_ms": sum(e.self_cpu_time_total for e in copies) / 1e3,
            "copy_shapes": [{"shape": str(e.input_shapes[0]) if e.input_shapes else "?",
                             "calls": e.count, "ms": e.self_cpu_time_total / 1e3} for e in shapes]}


def _give_back_memory() -> None:
    """Return freed heap to the system (glibc's malloc_trim), so that a case
    waiting for its turn holds its model and inputs, not its last step's peak."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _generate(model, batch, new_tokens):
    import time as _time

    model.eval()
    start = _time.perf_counter()
    tokens = model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                            max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                            use_cache=True)
    return _time.perf_counter() - start, tokens


def _train_flops(name, model, shape):
    """A decoder-only training step's floating-point operations (None for the others):
    6 x the matmul parameters (every 2-D weight but the input embedding, the output
    layer counted once) x the tokens, plus the causal attention's 6 B H n^2 d per layer."""
    if name not in CAUSAL:
        return None
    config = model.config
    skip = {id(model.get_input_embeddings().weight), id(model.get_output_embeddings().weight)}
    weights = sum(p.numel() for p in model.parameters() if p.dim() == 2 and id(p) not in skip)
    weights += model.get_output_embeddings().weight.numel()
    batch, n = shape["batch"], shape["encoder"]
    heads = config.num_attention_heads
    attention = 6 * batch * heads * n * n * (config.hidden_size // heads) * config.num_hidden_layers
    return 6 * weights * batch * n + attention


def _send(message: dict) -> None:
    sys.stdout.write(MARK + json.dumps(message) + "\n")
    sys.stdout.flush()


def worker(spec: dict, build=None) -> None:
    """One case in its own process: build (with `build`, default _build), warm up
    at a tiny size, then answer "train" / "generate" / "quit" lines on stdin with
    the step's seconds and its peak memory above the model and inputs (VmHWM
    reset before each step where Linux allows it; else the peak so far)."""
    import torch

    import posenc
    from posenc.torch import hf
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))        # the suite's posenc_bench
    from posenc_bench.worker import _current_rss_bytes, _maxrss_bytes, _reset_peak

    torch.set_num_threads(spec["threads"])
    posenc.set_num_threads(spec["threads"])
    name, implementation = spec["model"], spec["implementation"]
    shape = dict((QUICK_SHAPES if spec["quick"] else SHAPES)[name], batch=spec["batch"])
    model = (build or _build)(name, shape, implementation)
    batch = _inputs(name, shape, shape["batch"], shape["encoder"], shape.get("decoder"))
    small = _inputs(name, shape, 2, 16, 4)
    _train_step(model, small)
    if "generate" in COMMANDS[name]:
        _generate(model, small, 2)
    resets = _reset_peak()
    base = (_current_rss_bytes() if resets else None) or _maxrss_bytes()
    _send({"ready": True, "runs": model.config._attn_implementation, "train_flops": _train_flops(name, model, shape),
           "patched_modules": getattr(model, "_posenc_patched", 0), "patched": hf.is_patched(model),
           "base_bytes": base, "peak_resets": resets})
    for line in sys.stdin:
        command = line.strip()
        # the step's peak above what the process holds as it starts (the model and inputs: each step
        # gives its memory back); RSS can fall below `base` meanwhile, as pages are reclaimed
        step_base = (_current_rss_bytes() if _reset_peak() else None) or base
        if command == "train":
            reply = {"s": _train_step(model, batch)}
        elif command == "profile":
            reply = _profiled_step(model, batch)
        elif command == "generate":
            seconds, tokens = _generate(model, batch, shape["new_tokens"])
            reply = {"s": seconds, "tokens": tokens.tolist()}
        else:
            break
        reply["peak_bytes"] = _maxrss_bytes() - step_base
        _give_back_memory()
        _send(reply)


# ------------------------------------------------------------------ the parent

class Case:
    """A running worker process for (model, implementation); `script` runs the
    worker (benchmarks/hf_floor.py's cases run its own)."""

    script = os.path.abspath(__file__)

    def __init__(self, model: str, implementation: str, quick: bool, threads: int, batch: int,
                 before: str | None = None):
        # the label the results use: implementation, or implementation@before on `before`'s posenc
        self.implementation = implementation + ("@before" if before else "")
        self.stderr = tempfile.TemporaryFile(mode="w+")
        spec = dict(model=model, implementation=implementation, quick=quick, threads=threads, batch=batch)
        from posenc._paths import package_home   # the workers import this posenc, or before's

        home = os.path.abspath(before) if before else package_home()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [home,
                                                                        os.environ.get("PYTHONPATH")])))
        self.process = subprocess.Popen([sys.executable, self.script, "--worker", json.dumps(spec)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
                                        text=True, env=env)
        self.ready = None

    def read(self) -> dict:
        for line in self.process.stdout:
            if line.startswith(MARK):
                return json.loads(line[len(MARK):])
        self.process.wait()
        self.stderr.seek(0)
        tail = [line for line in self.stderr.read().strip().splitlines() if line.strip()]
        raise RuntimeError(f"worker exited with status {self.process.returncode}: "
                           + (tail[-1][:300] if tail else "no message"))

    def ask(self, command: str) -> dict:
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self.read()

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self.process.stdin.write("quit\n")
                self.process.stdin.close()
            except (BrokenPipeError, OSError):
                pass
            self.process.wait(timeout=120)
        self.stderr.close()


def _summary(times: list) -> dict:
    return {"warmup_s": times[0], "times_s": times[1:], "median_s": statistics.median(times[1:]),
            "min_s": min(times[1:]), "max_s": max(times[1:])}


def _refusal(name: str, implementation: str):
    """Why HF will not run `implementation` for this model, or None."""
    if implementation.startswith("posenc"):
        return None
    shape = QUICK_SHAPES[name]
    try:
        model = _build(name, shape, implementation)
    except (ValueError, ImportError) as error:
        return f"HF refuses attn_implementation={implementation!r}: {str(error).split('. ')[0][:200]}"
    runs = model.config._attn_implementation
    if runs != implementation:
        return f"HF runs {runs!r} when asked for {implementation!r} ({type(model).__name__})"
    return None


def _rounds(cases: list, command: str, repeats: int, log) -> tuple:
    """A warm-up and `repeats` timed rounds of `command`, each case one step per
    round, the order rotating; ({implementation: [replies]}, {implementation:
    error}) where a case's process died (killed for memory, say): the others go on."""
    replies, errors = {case.implementation: [] for case in cases}, {}
    for round_ in range(1 + repeats):
        alive = [case for case in cases if case.implementation not in errors]
        shift = round_ % max(1, len(alive))
        for case in alive[shift:] + alive[:shift]:
            try:
                reply = case.ask(command)
            except (RuntimeError, BrokenPipeError) as error:
                errors[case.implementation] = f"{command}: {error}"
                log(f"  {command} {case.implementation}: {error}")
                continue
            replies[case.implementation].append(reply)
            log(f"  {command} {case.implementation:6s} {'warm-up' if round_ == 0 else f'step {round_}'}: "
                f"{reply['s']:.2f} s, peak {reply['peak_bytes'] / 2**20:.0f} MiB")
    return {k: v for k, v in replies.items() if k not in errors}, errors


def run_model(name: str, args, log) -> dict:
    shape = (QUICK_SHAPES if args.quick else SHAPES)[name]
    if name == "deberta" and args.deberta_batch:
        shape = dict(shape, batch=args.deberta_batch)
    result = {"shape": {k: v for k, v in shape.items() if k != "config"}, "config": shape["config"],
              "repeats": {}, "refused": {}, "cases": {}}
    implementations = []
    for implementation in IMPLEMENTATIONS[:1] + EXTRA.get(name, ()) + IMPLEMENTATIONS[1:]:
        why = _refusal(name, implementation)
        if why:
            result["refused"][implementation] = why
            log(f"{name}: {why}")
        else:
            implementations.append(implementation)
    cases = [Case(name, implementation, args.quick, args.threads, shape["batch"])
             for implementation in implementations]
    before = getattr(args, "before", None)
    cases += [Case(name, implementation, args.quick, args.threads, shape["batch"], before)
              for implementation in implementations if before and implementation.startswith("posenc")]
    try:
        running = []
        for case in cases:
            try:
                case.ready = case.read()
                running.append(case)
                result["cases"][case.implementation] = {"runs": case.ready["runs"],
                                                        "patched_modules": case.ready["patched_modules"]}
                result["train_flops"] = case.ready.get("train_flops")
            except RuntimeError as error:
                result["cases"][case.implementation] = {"error": str(error)}
                log(f"{name} {case.implementation}: {error}")
        for command in COMMANDS[name]:
            repeats = args.repeats if (name, command) == ("t5", "train") else args.repeats_long
            result["repeats"][command] = repeats
            log(f"{TITLES[name]}: {command}")
            replies, errors = _rounds(running, command, repeats, log)
            for implementation, error in errors.items():
                result["cases"][implementation]["error"] = error
            running = [case for case in running if case.implementation not in errors]
            for implementation, got in replies.items():
                entry = _summary([r["s"] for r in got])
                entry["peak_bytes"] = max(r["peak_bytes"] for r in got)
                entry["step_peaks_bytes"] = [r["peak_bytes"] for r in got]
                if command == "generate":
                    entry["tokens"] = got[-1]["tokens"]
                result["cases"][implementation][command] = entry
            if command == "train" and getattr(args, "profile", False):
                profiled = [case for case in running if case.implementation.startswith("posenc")]
                log(f"{TITLES[name]}: a profiled training step")
                replies, errors = _rounds(profiled, "profile", 0, log)
                for implementation, got in replies.items():
                    result["cases"][implementation]["profile"] = got[0]
    finally:
        for case in cases:
            case.close()
    if "generate" in COMMANDS[name]:
        reference = result["cases"].get("eager", {}).get("generate", {}).get("tokens")
        for entry in result["cases"].values():
            if "generate" in entry and reference is not None:
                entry["generate"]["same_tokens_as_eager"] = entry["generate"].pop("tokens") == reference
    return result


def targets(results: dict) -> list:
    """Issues 15's and 29's targets with the measured ratios: [{name, ratio, target, verdict, ...}]."""
    found = []

    def hf_cases(name, command):
        cases = results["models"].get(name, {}).get("cases", {})
        return ({k: v[command] for k, v in cases.items() if not k.startswith("posenc") and command in v},
                cases.get("posenc", {}).get(command))

    # (model, label, speed target, peak-memory target): issue 15's for T5 and DeBERTa, issue 29's
    # for the Llama and BLOOM shapes
    wanted = (("t5", "T5", 2.0, 0.5), ("deberta", "DeBERTa", 2.0, None), ("llama", "Llama", 1.0, None),
              ("bloom", "BLOOM", 1.3, 1.0))
    for name, label, speed, memory in wanted:
        peers, ours = hf_cases(name, "train")
        if not peers or not ours:
            continue
        best = min(peers, key=lambda k: peers[k]["median_s"])
        ratio = peers[best]["median_s"] / ours["median_s"]
        found.append(dict(name=f"{label} training step: HF {best} (the fastest HF) ÷ posenc time",
                          ratio=ratio, target=(f">= {speed:g}x" if speed > 1 else "> 1x"),
                          verdict="PASS" if ratio >= speed and ratio > 1 else "SHORT"))
        lowest = min(peers, key=lambda k: peers[k]["peak_bytes"])
        ratio = ours["peak_bytes"] / peers[lowest]["peak_bytes"]
        found.append(dict(name=f"{label} training step peak memory: posenc ÷ HF {lowest} (the lowest HF)",
                          ratio=ratio, target=None if memory is None else
                          (f"<= {memory:g}x" if memory < 1 else "< 1x"),
                          verdict="info" if memory is None else
                          ("PASS" if ratio <= memory and ratio < 1 else "SHORT")))
    for command in ("train", "generate"):                # the attention alone on posenc
        peers, _ = hf_cases("llama", command)
        alone = results["models"].get("llama", {}).get("cases", {}).get("posenc-attn", {}).get(command)
        if peers and alone:
            best = min(peers, key=lambda k: peers[k]["median_s"])
            found.append(dict(name=f"Llama {command}: HF {best} ÷ attn_implementation=\"posenc\" alone "
                                   f"(projections on torch's GEMM)",
                              ratio=peers[best]["median_s"] / alone["median_s"], target=None, verdict="info"))
    for name, model in results["models"].items():       # --before: this checkout against before's
        for label, case in model.get("cases", {}).items():
            was = model["cases"].get(label + "@before", {})
            for command in ("train", "generate"):
                if command in case and command in was:
                    now, then = case[command], was[command]
                    found.append(dict(name=f"{name} {label} {command}: time ÷ before's",
                                      ratio=now["median_s"] / then["median_s"], target=None,
                                      verdict="info"))
                    found.append(dict(name=f"{name} {label} {command}: peak memory ÷ before's",
                                      ratio=now["peak_bytes"] / then["peak_bytes"], target=None,
                                      verdict="info"))
    for name, label in (("t5", "T5"), ("llama", "Llama"), ("llama-2k", "Llama, 2048-token prompt,")):
        peers, ours = hf_cases(name, "generate")
        if peers and ours:
            best = min(peers, key=lambda k: peers[k]["median_s"])
            ratio = peers[best]["median_s"] / ours["median_s"]
            found.append(dict(name=f"{label} generate(): HF {best} (the fastest HF) ÷ posenc time",
                              ratio=ratio, target="> 1x" if name != "t5" else None,
                              verdict=("PASS" if ratio > 1 else "SHORT") if name != "t5" else "info"))
    return found


def preamble(results: dict, title: str, command: str = "") -> list:
    """The markdown's first lines: the title, the machine, the load, the note."""
    machine = results["machine"]
    lines = [f"# {title}", "",
             f"{results['date']}; posenc {machine['posenc']} ({machine['isa']}), torch {machine['torch']}, "
             f"transformers {machine['transformers']}, {machine['cpu']} ({machine['cores']} cores). "
             f"Load average {results['load_before']} before, {results['load_after']} after; "
             f"{results['minutes']:.1f} min.{command}"
             + (f" Float32 FMA peak measured in this run: {results['fma_peak_gflops']:.0f} GFLOP/s."
                if results.get("fma_peak_gflops") else ""), ""]
    if results.get("note"):
        lines += [f"**{results['note']}**", ""]
    if results["quick"]:
        lines += ["**--quick: tiny shapes, the figures mean nothing.**", ""]
    return lines


def markdown(results: dict) -> str:
    machine = results["machine"]
    lines = preamble(results, f"Hugging Face models on posenc (posenc.torch.hf) against HF's attention, float32, "
                              f"{machine['threads']} threads")
    lines += ["Seconds per step: median (min–max) of the timed steps after one warm-up step; the cases "
              "of a model take turns step by step. Peak: the largest over the case's steps of its own "
              "process's VmHWM (reset before each step) above its RSS with the model, inputs and a tiny "
              "warm-up done.", ""]
    for name, model in results["models"].items():
        shape = model["shape"]
        lines += [f"## {TITLES[name]}", "",
                  "Shape: " + ", ".join(f"{k} {v}" for k, v in shape.items()) + "; timed steps per case "
                  "after a warm-up: " + ", ".join(f"{k} {v}" for k, v in model["repeats"].items()) + ".", ""]
        for implementation, why in model["refused"].items():
            lines += [f"* {implementation}: {why}"]
        if model["refused"]:
            lines.append("")
        for command in ("train", "generate"):
            rows = {k: v[command] for k, v in model["cases"].items() if command in v}
            if not rows:
                continue
            title = "training step (forward + backward)" if command == "train" else "generate()"
            lines += [f"{title}:", "", "| implementation | HF runs | s (min–max) | warm-up s | peak MiB "
                      "| time ÷ posenc's |" + (" same tokens as eager |" if command == "generate" else ""),
                      "|---|---|---|---|---|---|" + ("---|" if command == "generate" else "")]
            ours = rows.get("posenc")
            for implementation, entry in rows.items():
                case = model["cases"][implementation]
                runs = case["runs"] + (f", patched ({case['patched_modules']} modules)"
                                       if implementation == "posenc" and case["patched_modules"] else "")
                ratio = f"{entry['median_s'] / ours['median_s']:.2f}×" if ours else "—"
                line = (f"| {implementation} | {runs} | {entry['median_s']:.2f} ({entry['min_s']:.2f}–"
                        f"{entry['max_s']:.2f}) | {entry['warmup_s']:.2f} | {entry['peak_bytes'] / 2**20:.0f} "
                        f"| {ratio} |")
                if command == "generate":
                    line += f" {'yes' if entry.get('same_tokens_as_eager') else 'no'} |"
                lines.append(line)
            lines.append("")
            if command == "train" and model.get("train_flops") and results.get("fma_peak_gflops"):
                rates = {k: model["train_flops"] / v["median_s"] / 1e9 for k, v in rows.items()}
                lines += [f"A step is about {model['train_flops'] / 1e12:.2f} TFLOP (6 x matmul parameters x "
                          "tokens + the causal attention): " + ", ".join(
                              f"{k} {rate:.0f} GFLOP/s ({100 * rate / results['fma_peak_gflops']:.0f} %)"
                              for k, rate in rates.items())
                          + " of the float32 FMA peak measured in this run.", ""]
        profiles = {k: v["profile"] for k, v in model["cases"].items() if "profile" in v}
        if profiles:
            lines += ["Copies in one profiled training step (torch.profiler, aten::copy_):", "",
                      "| implementation | step s | copies | copy ms | largest (shape: calls, ms) |",
                      "|---|---|---|---|---|"]
            for implementation, got in profiles.items():
                largest = "; ".join(f"{x['shape']}: {x['calls']}, {x['ms']:.1f}" for x in got["copy_shapes"])
                lines.append(f"| {implementation} | {got['s']:.2f} | {got['copy_calls']} | "
                             f"{got['copy_ms']:.1f} | {largest} |")
            lines.append("")
        for implementation, case in model["cases"].items():
            if "error" in case:
                lines += [f"* {implementation} failed: {case['error']}", ""]
    lines += ["## Targets (issues 15 and 29), measured in this run", ""]
    for target in results["targets"]:
        if target["target"] is None:
            lines.append(f"* {target['name']}: {target['ratio']:.2f}× (no target)")
        else:
            lines.append(f"* {target['name']}: **{target['ratio']:.2f}×** (target {target['target']}): "
                         f"**{target['verdict']}**")
    return "\n".join(lines) + "\n"


def common_options(parser) -> None:
    """--quick, --threads, --note, --out and the workers' --worker (also benchmarks/hf_floor.py's)."""
    parser.add_argument("--quick", action="store_true", help="tiny shapes: checks that it runs")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--note", default="", help="a line printed beside the figures (e.g. the machine's load)")
    parser.add_argument("--out", default=None, help="default benchmarks/results (--quick: benchmarks/results/tmp)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common_options(parser)
    parser.add_argument("--repeats", type=int, default=3, help="timed T5 training steps per case (after a warm-up)")
    parser.add_argument("--repeats-long", type=int, default=2,
                        help="timed steps per case of the long ones: T5 generate() and the DeBERTa training step")
    parser.add_argument("--deberta-batch", type=int, default=None,
                        help="DeBERTa's batch (default 8): smaller where memory or time forces it")
    parser.add_argument("--models", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--before", default=None, metavar="PATH",
                        help="also run each posenc case on PATH's posenc (a checkout built in place)")
    parser.add_argument("--profile", action="store_true",
                        help="one more training step of each posenc case under torch.profiler: its copies")
    args = parser.parse_args(argv)
    if args.worker:
        worker(json.loads(args.worker))
        return 0
    if glob.glob(os.path.join(ROOT, "posenc", "_C*")):   # a checkout built in place
        sys.path.insert(0, ROOT)
    import torch
    import transformers

    import posenc

    log = lambda text: print(text, flush=True)
    began = time.perf_counter()
    results = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
               "quick": args.quick, "note": args.note,
               "machine": {"python": platform.python_version(), "torch": torch.__version__,
                           "transformers": transformers.__version__, "posenc": posenc.__version__,
                           "isa": posenc.get_isa(), "threads": args.threads, "cores": os.cpu_count(),
                           "cpu": _cpu_name()},
               "load_before": [round(x, 2) for x in os.getloadavg()], "models": {},
               "fma_peak_gflops": _fma_peak(args.threads, 0.2 if args.quick else 1.0)}
    for name in args.models:
        results["models"][name] = run_model(name, args, log)
    results["load_after"] = [round(x, 2) for x in os.getloadavg()]
    results["minutes"] = (time.perf_counter() - began) / 60
    results["targets"] = targets(results)
    save(results, markdown(results), args.out, "hf", args.quick)
    return 0


def save(results: dict, text: str, out, name: str, quick: bool) -> None:
    """Write <out>/<name>-<date>[-quick].json and .md (out None: benchmarks/results,
    or benchmarks/results/tmp for --quick) and print the markdown."""
    out = out or os.path.join(ROOT, "benchmarks", "results", "tmp" if quick else "")
    os.makedirs(out, exist_ok=True)
    stem = os.path.join(out, f"{name}-" + datetime.date.today().isoformat() + ("-quick" if quick else ""))
    with open(stem + ".json", "w") as f:
        json.dump(results, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write(text)
    print(text)
    print(f"wrote {stem}.json, .md")


def _fma_peak(threads: int, seconds: float):
    """The float32 FMA rate (GFLOP/s) of posenc's ISA on `threads` threads, or None."""
    import posenc
    from posenc import _machine

    try:
        rate = _machine.measure_fma(posenc.get_isa(), "float32", threads, seconds)   # FLOP/s
    except ValueError:
        return None
    return rate / 1e9 if rate > 0 else None


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    sys.exit(main())
