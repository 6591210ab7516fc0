"""Cached decoding on posenc, checked where it can be wrong: the logits of every
cached step (one token, then several at once; the dynamic and the static cache;
a left-padded and an unpadded batch) equal the uncached forward's logits at the
same positions -- for the families on attn_implementation="posenc", T5 with a
padded decoder mask, the patched ALiBi families, and a swapped Llama and BERT
decoder for every posenc method -- and generate() with the cache gives the
tokens it gives without one (and HF's own, where HF runs the same encoding).

Greedy tokens of tiny random models agree while the numbers are wrong (a query
put at position 0 moves ALiBi's logits by 1e-3 and keeps the argmax), hence the
logits.  The padded rows' padding positions are left out: their queries see no
key, and no model defines them."""

from __future__ import annotations

import copy
import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import posenc.torch.hf  # noqa: E402  (registers "posenc")
from posenc.torch._hf_swap import ENCODINGS  # noqa: E402
from test_hf_interface import (ALIBI, FLOAT64, VOCAB, alibi_model, assert_close,  # noqa: E402
                               float64_softmax, model, t5_model)

pytestmark = pytest.mark.usefixtures("no_hf_fallback")

N, PREFIX = 11, 6              # tokens in all; the prefix the cache takes first
STEPS = (1, 1, 3)              # then one token, one token, three at once


def _batch(padded: bool):
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(2, VOCAB, (3, N), generator=g)
    mask = torch.ones_like(ids)
    if padded:
        mask[1, :3] = 0                                 # left padding (as generate() pads)
        mask[2, :1] = 0
    return ids, mask


def _cache(net, kind: str):
    if kind == "static":
        return transformers.StaticCache(config=net.config, max_cache_len=N + 4)
    return transformers.DynamicCache(config=net.config)


def _logits(out):
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def cached_and_full(net, ids, mask, cache_kind: str, call=None):
    """(logits of the cached steps, logits of one uncached forward), (B, N, V) each."""
    call = call or (lambda ids, mask, **kwargs: net(ids, attention_mask=mask, **kwargs))
    cache = _cache(net, cache_kind)
    with torch.no_grad():
        pieces, start = [], 0
        for size in (PREFIX,) + STEPS:
            stop = start + size
            seen = mask[:, :stop]
            if cache_kind == "static":             # a static cache: a mask over all its
                seen = torch.cat([seen, seen.new_zeros(seen.shape[0], N + 4 - stop)], 1)  # slots
            pieces.append(_logits(call(ids[:, start:stop], seen, past_key_values=cache,
                                       use_cache=True)))
            start = stop
        assert start == N
        full = _logits(call(ids, mask, use_cache=False))
    return torch.cat(pieces, 1), full


def check_steps(net, dtype, cache_kind, padded, call=None):
    ids, mask = _batch(padded)
    got, want = cached_and_full(net, ids, mask, cache_kind, call)
    keep = mask.bool()
    assert torch.isfinite(got[keep]).all() and torch.isfinite(want[keep]).all()
    assert_close(want[keep], got[keep], 1e-10 if dtype == torch.float64 else 1e-4)


def _dtype(family):
    return torch.float64 if family in FLOAT64 else torch.float32


DECODER_FAMILIES = ["llama", "mistral", "qwen3", "gemma2", "gpt_oss", "gpt_neox"]


@pytest.mark.parametrize("padded", [True, False], ids=["padded", "unpadded"])
@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("family", DECODER_FAMILIES)
def test_interface_steps_equal_the_uncached_forward(family, cache, padded):
    check_steps(model(family, _dtype(family), "posenc"), _dtype(family), cache, padded)


def _bert_decoder(implementation="posenc"):
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=48,
                                     max_position_embeddings=64, is_decoder=True)
    net = transformers.BertLMHeadModel(config).double().eval()
    net.set_attn_implementation(implementation)
    return net


@pytest.mark.parametrize("padded", [True, False], ids=["padded", "unpadded"])
@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_bert_decoder_steps(cache, padded):
    check_steps(_bert_decoder(), torch.float64, cache, padded)


@pytest.mark.parametrize("padded", [True, False], ids=["padded", "unpadded"])
@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_t5_decoder_steps_with_a_padded_decoder_mask(cache, padded):
    """T5 on the interface: the decoder's relative bias at the cache's positions (a
    padded decoder_attention_mask once put the cached step's query at 0)."""
    net = t5_model("posenc")
    encoder_ids, encoder_mask = _batch(True)
    with torch.no_grad():
        encoded = net.get_encoder()(input_ids=encoder_ids, attention_mask=encoder_mask)

    def call(ids, mask, past_key_values=None, use_cache=False):
        if past_key_values is not None:
            past_key_values = transformers.EncoderDecoderCache(
                past_key_values, _cache(net, "dynamic")) if not hasattr(call, "cache") else call.cache
            call.cache = past_key_values
        return net(encoder_outputs=encoded, attention_mask=encoder_mask, decoder_input_ids=ids,
                   decoder_attention_mask=mask, past_key_values=past_key_values,
                   use_cache=use_cache)

    check_steps(net, torch.float64, cache, padded, call)


@pytest.mark.parametrize("padded", [True, False], ids=["padded", "unpadded"])
@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("family", list(ALIBI))
def test_patched_alibi_steps(family, cache, padded):
    """BLOOM, MPT, Falcon (alibi=True) patched: each step's query at the cache's
    position (a step that sees every key was read as bidirectional at 0 before).
    MPT's own model ignores a static cache; Falcon's refuses one."""
    if cache == "static" and family != "bloom":
        pytest.skip(f"HF's {family} runs no static cache")
    check_steps(posenc.torch.hf.patch(alibi_model(family)), torch.float64, cache, padded)


def test_mpt_output_attentions_falls_back_to_hf():
    reference = alibi_model("mpt")
    ours = posenc.torch.hf.patch(copy.deepcopy(reference))
    ids, mask = _batch(False)          # HF's eager MPT turns a left-padded batch into NaN
    with torch.no_grad():
        want = reference(ids, attention_mask=mask, output_attentions=True)
        with pytest.warns(RuntimeWarning, match="output_attentions"):
            got = ours(ids, attention_mask=mask, output_attentions=True)
    assert got.attentions is not None and len(got.attentions) == len(want.attentions)
    for a, b in zip(want.attentions, got.attentions):   # HF's own weights
        assert torch.equal(a, b)
    keep = mask.bool()
    assert_close(want.logits[keep], got.logits[keep], 1e-12)


def _swapped(base: str, method: str):
    net = model("llama", torch.float64, "eager") if base == "llama" else _bert_decoder("eager")
    return posenc.torch.hf.swap_positional_encoding(net, method)


@pytest.mark.parametrize("padded", [True, False], ids=["padded", "unpadded"])
@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("base", ["llama", "bert"])
@pytest.mark.parametrize("method", sorted(ENCODINGS))
def test_swapped_steps_every_method(method, base, cache, padded):
    """Every posenc method swapped into a Llama and a BERT decoder."""
    check_steps(_swapped(base, method), torch.float64, cache, padded)


GENERATE = dict(max_new_tokens=32, min_new_tokens=32, do_sample=False, pad_token_id=0,
                eos_token_id=None)


def _generate(net, ids, mask, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)      # HF's generation-config notes
        return net.generate(ids, attention_mask=mask, **GENERATE, **options)


@pytest.mark.parametrize("method", sorted(ENCODINGS))
def test_swapped_generate_with_and_without_the_cache(method):
    net = _swapped("llama", method)
    ids, mask = _batch(True)
    ids[mask == 0] = 0
    without = _generate(net, ids, mask, use_cache=False)
    for cache in (None, "static"):
        assert torch.equal(_generate(net, ids, mask, cache_implementation=cache), without)


@pytest.mark.parametrize("family", DECODER_FAMILIES)
def test_generate_with_the_cache_equals_without_and_hf(family):
    """Greedy tokens with the cache, without it, and HF's eager attention's (the
    static cache and HF's tokens per family: test_hf_interface.test_generate_matches)."""
    dtype = _dtype(family)
    ours = model(family, dtype, "posenc")
    reference = model(family, dtype, "eager")
    ids, mask = _batch(True)
    ids[mask == 0] = 0
    without = _generate(ours, ids, mask, use_cache=False)
    assert torch.equal(_generate(ours, ids, mask), without)
    with float64_softmax():
        assert torch.equal(_generate(reference, ids, mask), without)


def test_no_served_call_receives_a_dense_mask(monkeypatch):
    """The attention function gets posenc's Positions on every served path (no
    (B, 1, n, m) tensor is built): prefill, cached steps, both caches, windows."""
    from posenc.torch import _hf_interface as interface

    seen = []
    attention = interface.attention

    def spy(module, query, key, value, attention_mask, *args, **kwargs):
        seen.append(attention_mask)
        return attention(module, query, key, value, attention_mask, *args, **kwargs)

    transformers.AttentionInterface.register(interface.NAME, spy)
    try:
        for family in ("llama", "gemma2", "gpt_oss"):
            for cache in ("dynamic", "static"):
                check_steps(model(family, _dtype(family), "posenc"), _dtype(family), cache, True)
    finally:
        interface.register()
    assert seen and all(isinstance(mask, interface.Positions) for mask in seen)


COMPILED = {"llama": None, "mistral": True, "gemma2": True, "gpt_oss": True}


@pytest.mark.parametrize("family", list(COMPILED))
def test_compiled_static_cache_decoding_loop(family):
    """torch.compile(model.forward, fullgraph=True) over a static cache: 8 decoding
    steps equal the eager steps (and HF's eager attention's), and none after the
    first recompiles (fail_on_recompile).  A static cache's position reaches the
    kernel as a tensor (no specialisation on it).  The sliding-window families
    compile with dynamic=True: HF's own StaticSlidingWindowLayer keeps its length as
    a Python int that its mask sizes read (HF's sdpa recompiles there too without it)."""
    net = model(family, torch.float32, "posenc")
    reference = model(family, torch.float32, "eager")
    ids, mask = _batch(True)
    ids, mask = ids[:, :PREFIX], mask[:, :PREFIX]
    B, length = ids.shape[0], PREFIX + 8 + 2

    def decode(owner, forward, compiled):
        """The logits of 8 steps after an eager prefill, `forward` running the steps."""
        cache = transformers.StaticCache(config=owner.config, max_cache_len=length)
        full = torch.zeros(B, length, dtype=mask.dtype)       # one shape for every step
        full[:, :PREFIX] = mask
        out = owner(ids, attention_mask=mask, past_key_values=cache, use_cache=True)
        token, logits = out.logits[:, -1:].argmax(-1), []
        try:
            for step in range(8):
                full = full.clone()
                full[:, PREFIX + step] = 1
                if compiled and step == 1:
                    torch.compiler.set_stance("fail_on_recompile")
                position = (full.cumsum(-1) - 1)[:, PREFIX + step:PREFIX + step + 1].clone()
                out = forward(token, attention_mask=full, past_key_values=cache, use_cache=True,
                              position_ids=position)
                logits.append(out.logits)
                token = out.logits[:, -1:].argmax(-1)
        finally:
            torch.compiler.set_stance("default")
        return torch.cat(logits, 1)

    torch._dynamo.reset()
    with torch.no_grad():
        eager = decode(net, net.forward, False)
        compiled = decode(net, torch.compile(net.forward, fullgraph=True, dynamic=COMPILED[family]),
                          True)
        hf = decode(reference, reference.forward, False)
    assert_close(eager, compiled, 1e-5)
    assert_close(hf, eager, 1e-4)


def test_the_docs_fallback_table_is_measured():
    """docs/huggingface.md's table of what falls back is benchmarks/hf_fallbacks.py's
    output, measured now."""
    import os
    import sys

    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir)
    if not os.path.exists(os.path.join(root, "benchmarks", "hf_fallbacks.py")):
        pytest.skip("needs the source tree (benchmarks/hf_fallbacks.py)")
    sys.path.insert(0, os.path.join(root, "benchmarks"))
    try:
        import hf_fallbacks
    finally:
        sys.path.pop(0)
    with open(os.path.join(root, "docs", "huggingface.md")) as f:
        docs = f.read()
    assert hf_fallbacks.table() in docs


@pytest.mark.parametrize("family", list(ALIBI))
def test_patched_alibi_generate_with_and_without_the_cache(family):
    """The patched ALiBi families' greedy tokens with the cache equal those without
    it (HF's tokens: test_hf_interface.test_alibi_families_generate)."""
    net = posenc.torch.hf.patch(alibi_model(family))
    ids, mask = _batch(True)
    ids[mask == 0] = 0
    assert torch.equal(_generate(net, ids, mask), _generate(net, ids, mask, use_cache=False))
