"""Which calls of which Hugging Face models posenc serves, measured: each family's
tiny random model (the test suite's configs) runs each kind of call once, and a
cell says "posenc" where posenc's kernels served every attention call, or the
fallback's reason (its one RuntimeWarning) where HF's own attention ran.

    python benchmarks/hf_fallbacks.py            # the markdown table of docs/huggingface.md

Needs the source tree (the models are tests/test_hf_interface.py's), torch and
transformers.  About 20 s on 2 cores.
"""

from __future__ import annotations

import copy
import os
import re
import sys
import warnings

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, os.pardir, "tests"))

import transformers  # noqa: E402

import posenc.torch.hf as hf  # noqa: E402
from test_hf_interface import alibi_model, model, t5_model  # noqa: E402

N = 8


def _swapped(method):
    return hf.swap_positional_encoding(model("llama", torch.float64, "eager"), method)


# row -> (how to build it, how it is put on posenc, whether it decodes)
MODELS = {
    "Llama": (lambda: model("llama", torch.float64, "posenc"), "interface", True),
    "Mistral (window)": (lambda: model("mistral", torch.float64, "posenc"), "interface", True),
    "Qwen3": (lambda: model("qwen3", torch.float64, "posenc"), "interface", True),
    "Gemma 2 (window, softcap)": (lambda: model("gemma2", torch.float64, "posenc"), "interface", True),
    "gpt-oss (sinks, window)": (lambda: model("gpt_oss", torch.float32, "posenc"), "interface", True),
    "GPT-NeoX": (lambda: model("gpt_neox", torch.float64, "posenc"), "interface", True),
    "GPT-2": (lambda: model("gpt2", torch.float64, "posenc"), "interface", True),
    "BERT": (lambda: model("bert", torch.float64, "posenc"), "interface", False),
    "T5": (lambda: t5_model("posenc"), "interface", True),
    "BLOOM": (lambda: hf.patch(alibi_model("bloom")), "patch", True),
    "MPT": (lambda: hf.patch(alibi_model("mpt")), "patch", True),
    "Falcon (alibi)": (lambda: hf.patch(alibi_model("falcon")), "patch", True),
    "Llama swapped to t5": (lambda: _swapped("t5"), "swap", True),
}


def _call(net, ids, mask, **kwargs):
    if isinstance(net, transformers.T5ForConditionalGeneration):
        return net(input_ids=ids, attention_mask=mask, decoder_input_ids=ids,
                   decoder_attention_mask=kwargs.pop("decoder_attention_mask", mask), **kwargs)
    return net(ids, attention_mask=mask, **kwargs)


def _inputs():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(2, 61, (2, N), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    return ids, mask


def _step(net, cache_kind):
    ids, mask = _inputs()
    cache = (transformers.StaticCache(config=net.config, max_cache_len=N + 2)
             if cache_kind == "static" else None)
    if isinstance(net, transformers.T5ForConditionalGeneration):
        encoded = net.get_encoder()(input_ids=ids, attention_mask=mask)
        out = net(encoder_outputs=encoded, attention_mask=mask, decoder_input_ids=ids,
                  decoder_attention_mask=mask, use_cache=True,
                  past_key_values=None if cache is None else transformers.EncoderDecoderCache(
                      cache, transformers.StaticCache(config=net.config, max_cache_len=N)))
        net(encoder_outputs=encoded, attention_mask=mask, decoder_input_ids=ids[:, :1],
            decoder_attention_mask=torch.cat([mask, mask[:, :1]], 1),
            past_key_values=out.past_key_values, use_cache=True)
        return
    if cache is not None:       # a static cache's mask spans its slots, as generate() has it
        mask = torch.cat([mask, torch.zeros(2, 2, dtype=mask.dtype)], 1)
        out = net(ids, attention_mask=mask[:, :N], past_key_values=cache, use_cache=True)
        mask[:, N] = 1
        net(ids[:, :1], attention_mask=mask, past_key_values=cache, use_cache=True)
        return
    out = net(ids, attention_mask=mask, past_key_values=cache, use_cache=True)
    net(ids[:, :1], attention_mask=torch.cat([mask, mask[:, :1]], 1),
        past_key_values=out.past_key_values, use_cache=True)


def _packed(net):
    ids, _ = _inputs()
    position_ids = torch.tensor([[0, 1, 2, 0, 1, 2, 3, 4]] * 2)
    net(ids, position_ids=position_ids)


def _custom_mask(net):
    ids, _ = _inputs()
    keep = torch.ones(N, N, dtype=torch.bool).tril()
    keep[5, 2] = False
    additive = torch.zeros(2, 1, N, N, dtype=next(net.parameters()).dtype).masked_fill(
        ~keep, torch.finfo(next(net.parameters()).dtype).min)
    net(ids, attention_mask=additive)


CALLS = {
    "padded batch": lambda net: _call(net, *_inputs()),
    "cached step": lambda net: _step(net, "dynamic"),
    "static cache step": lambda net: _step(net, "static"),
    "packed sequences": _packed,
    "output_attentions": lambda net: _call(net, *_inputs(), output_attentions=True),
    "custom 4-D mask": _custom_mask,
}

_SHORT = [("attention weights", "weights asked for"), ("custom attention mask", "a 4-D mask"),
          ("cache", "HF's cache path"), ("not causal", "mask not served"),
          ("ALiBi tensor", "ALiBi not a line"), ("mask function", "mask function")]


def _cell(net, call) -> str:
    hf._WARNED.clear()
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        try:
            call(net)
        except Exception as error:                     # HF's own refusal, not posenc's
            return f"HF's model raises ({type(error).__name__})"
    reasons = [str(w.message) for w in caught if "posenc.torch.hf" in str(w.message)]
    if not reasons:
        return "posenc"
    reason = re.sub(r"^posenc\.torch\.hf: |; running.*$", "", reasons[0])
    return "HF: " + next((short for key, short in _SHORT if key in reason), reason)


def table() -> str:
    lines = ["| model | how | " + " | ".join(CALLS) + " |",
             "|---|---|" + "---|" * len(CALLS)]
    for name, (build, how, decodes) in MODELS.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            net = build()
        cells = []
        for call_name, call in CALLS.items():
            if (not decodes and "step" in call_name) or (name == "T5" and call_name in (
                    "packed sequences", "custom 4-D mask")):      # not T5's arguments
                cells.append("n/a")
                continue
            cells.append(_cell(copy.deepcopy(net) if call_name == "static cache step" else net, call))
        lines.append(f"| {name} | {how} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
