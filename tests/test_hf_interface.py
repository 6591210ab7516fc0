"""attn_implementation="posenc": Hugging Face models on HF's attention interface give
HF's numbers on posenc's fused attention (logits and every parameter gradient,
padded batches and packed sequences, generate() with the dynamic and the static
cache, left padding included), switch back bit-identically, read HF's masks as
the kernel's parameters, and fall back to the model's eager attention -- with a
warning -- for what they cannot serve.  Tiny random models built from configs.

HF's eager attention of the Llama family takes its softmax in float32 (and
casts the float64 dtype minimum of its mask to -inf there: a left-padded float64
batch gives NaN rows); the float64 references run it with the softmax in the
input's dtype (`float64_softmax`), so that they are float64 throughout."""

from __future__ import annotations

import contextlib
import copy
import io
import sys
import warnings
from unittest import mock

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import posenc.torch.hf  # noqa: E402,F401  (registers "posenc")
from posenc.torch import _hf_interface as interface  # noqa: E402

# a fallback is an error unless a test catches its warning
pytestmark = pytest.mark.usefixtures("no_hf_fallback")

VOCAB = 61
_COMMON = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
               num_attention_heads=4, max_position_embeddings=256)

# family -> (config class, model class, config arguments, what it exercises)
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(num_key_value_heads=2)),
    "llama3": ("LlamaConfig", "LlamaForCausalLM", dict(
        num_key_value_heads=1, rope_parameters=dict(
            rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0,
            high_freq_factor=4.0, original_max_position_embeddings=16))),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(num_key_value_heads=2, sliding_window=6)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(num_key_value_heads=2, head_dim=16)),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(
        num_key_value_heads=2, head_dim=8, sliding_window=6, attn_logit_softcapping=2.0,
        final_logit_softcapping=None)),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM", dict(
        num_key_value_heads=2, head_dim=8, sliding_window=6, num_local_experts=4,
        num_experts_per_tok=2, rope_parameters=dict(
            rope_type="yarn", rope_theta=10000.0, factor=4.0, beta_fast=32.0, beta_slow=1.0,
            original_max_position_embeddings=64, truncate=False))),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", dict(rotary_pct=0.5)),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(n_inner=48)),
    "bert": ("BertConfig", "BertModel", dict()),
}
DECODERS = [family for family in FAMILIES if family != "bert"]
# gpt-oss's experts run float32 only
FLOAT64 = [family for family in FAMILIES if family != "gpt_oss"]


@contextlib.contextmanager
def float64_softmax():
    """HF's eager attention float64 throughout for float64 inputs: its softmax in the
    input's dtype (the Llama family asks for float32, MPT calls .float() on its
    scores; other .float() calls, as Gemma's norms, stay as they are), and
    BLOOM's and Falcon's ALiBi line `slope * position` computed in float64 from
    their own slopes (HF multiplies in float32 and bfloat16)."""
    from transformers.models.bloom import modeling_bloom
    from transformers.models.falcon import modeling_falcon

    softmax, to_float = torch.nn.functional.softmax, torch.Tensor.float

    def float64_kept(x, *args, **kwargs):          # MPT's softmax(scores.float()) only
        if x.dtype == torch.float64 and not args and not kwargs \
                and sys._getframe(1).f_globals.get("__name__", "").endswith("modeling_mpt"):
            return x
        return to_float(x, *args, **kwargs)

    def exact_line(build):
        def alibi(mask, heads, dtype):
            if dtype != torch.float64:
                return build(mask, heads, dtype)
            slopes = build(torch.ones(1, 2, dtype=torch.long), heads, torch.float32).view(heads, 2)[:, 1]
            positions = ((mask.cumsum(-1) - 1) * mask)[:, None, :].double()
            return (slopes.double()[None, :, None] * positions).reshape(-1, 1, mask.shape[-1])
        return alibi

    with mock.patch.object(torch.nn.functional, "softmax",
                           lambda x, dim=None, _stacklevel=3, dtype=None: softmax(
                               x, dim=dim, dtype=None if x.dtype == torch.float64 else dtype)), \
            mock.patch.object(torch.Tensor, "float", float64_kept), \
            mock.patch.object(modeling_bloom, "build_alibi_tensor",
                              exact_line(modeling_bloom.build_alibi_tensor)), \
            mock.patch.object(modeling_falcon, "build_alibi_tensor",
                              exact_line(modeling_falcon.build_alibi_tensor)):
        yield


def model(family, dtype=torch.float64, implementation="eager", seed=0):
    config_name, model_name, extra = FAMILIES[family]
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = getattr(transformers, config_name)(**_COMMON, **extra)
        built = getattr(transformers, model_name)(config).to(dtype).eval()
    built.set_attn_implementation(implementation)
    if family == "gpt_oss":                  # sinks away from zero, so that they count
        with torch.no_grad():
            for layer in built.model.layers:
                layer.self_attn.sinks.normal_()
    return built


def twin(reference, implementation="posenc"):
    other = copy.deepcopy(reference)
    other.set_attn_implementation(implementation)
    return other


def batch(family, left_padding=True, seed=1, n=19):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, VOCAB, (3, n), generator=g)
    mask = torch.ones_like(ids)
    mask[2, n - 4:] = 0                                # right padding
    if left_padding:
        mask[1, :5] = 0
    return ids, mask


def run(net, ids, **kwargs):
    out = net(ids, **kwargs)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def assert_grads_close(want, got, rtol):
    """Every gradient within rtol of its largest entry; gradients that are zero in
    exact arithmetic (a key bias: the softmax ignores a constant per row) against
    a millionth of the largest gradient."""
    assert want.keys() == got.keys() and len(got) > 5
    floor = 1e-6 * max(float(g.abs().max()) for g in want.values())
    for name in want:
        assert_close(want[name], got[name], rtol, floor)


def loss_and_grads(net, ids, mask, **kwargs):
    net.zero_grad()
    out = run(net, ids, **kwargs)
    keep = mask.bool()
    weights = torch.linspace(-1, 1, out.shape[-1], dtype=out.dtype)
    (out[keep] * weights).sum().backward()
    return out.detach(), {name: p.grad.clone() for name, p in net.named_parameters()
                          if p.grad is not None}


def assert_close(a, b, rtol, floor=1e-30):
    """max |a - b| <= rtol max(max |a|, floor)."""
    scale = max(float(a.abs().max()), floor)
    error = float((a - b).abs().max()) / scale
    assert error <= rtol, f"relative error {error:.3g} > {rtol:.1g}"


def _tolerance(dtype):
    return 1e-10 if dtype == torch.float64 else 1e-4


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_logits_and_gradients_with_padding(family, dtype):
    if dtype == torch.float64 and family not in FLOAT64:
        pytest.skip("gpt-oss's experts run float32 only")
    reference = model(family, dtype)
    check_padded_batch(reference, twin(reference), family, dtype)


def check_padded_batch(reference, ours, family, dtype):
    """`ours` against HF's `reference` on a left- and right-padded batch: the logits
    of the real tokens and every parameter's gradient, with no fallback."""
    ids, mask = batch(family)
    with warnings.catch_warnings():
        warnings.simplefilter("error")                 # no fallback
        got, got_grads = loss_and_grads(ours, ids, mask, attention_mask=mask)
    with float64_softmax():
        want, want_grads = loss_and_grads(reference, ids, mask, attention_mask=mask)
    keep = mask.bool()
    assert torch.isfinite(got[keep]).all()
    assert_close(want[keep], got[keep], _tolerance(dtype))
    assert_grads_close(want_grads, got_grads, 10 * _tolerance(dtype))


@pytest.mark.parametrize("family", [f for f in DECODERS if f in FLOAT64])
def test_packed_sequences(family):
    """DataCollatorWithFlattening's layout: one row, position_ids restarting per
    document, no attention mask, no cache (HF looks for documents only then): HF
    masks across documents, so does posenc (as document ids), and every gradient
    matches."""
    reference = model(family)
    ours = twin(reference)
    lengths = (7, 1, 9, 4)
    ids = torch.randint(2, VOCAB, (1, sum(lengths)), generator=torch.Generator().manual_seed(3))
    positions = torch.cat([torch.arange(length) for length in lengths])[None]
    mask = torch.ones_like(ids)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got, got_grads = loss_and_grads(ours, ids, mask, position_ids=positions,
                                        use_cache=False)
    with float64_softmax():
        want, want_grads = loss_and_grads(reference, ids, mask, position_ids=positions,
                                          use_cache=False)
    assert_close(want, got, 1e-10)
    assert_grads_close(want_grads, got_grads, 1e-9)
    # each document as if alone: the third (positions 8..16) run by itself
    with torch.no_grad():
        alone = run(ours, ids[:, 8:17])
    assert_close(alone, got[:, 8:17], 1e-10)


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("family", DECODERS)
def test_generate_matches(family, cache):
    """Greedy generate() of 32 tokens from a left-padded batch: the same tokens as
    HF's eager attention, with the dynamic and the static cache."""
    dtype = torch.float64 if family in FLOAT64 else torch.float32
    reference = model(family, dtype)
    ours = twin(reference)
    ids, mask = batch(family, n=9)
    mask[2] = 1                                          # left padding only
    ids[mask == 0] = 0
    options = dict(attention_mask=mask, max_new_tokens=32, min_new_tokens=32, do_sample=False,
                   pad_token_id=0, eos_token_id=None)
    if cache == "static":
        options["cache_implementation"] = "static"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = ours.generate(ids, **options)
    with float64_softmax():
        want = reference.generate(ids, **options)
    assert got.shape == (3, 9 + 32)
    assert torch.equal(got, want)


@pytest.mark.parametrize("family", ["llama", "gemma2", "bert"])
def test_switching_back_is_bit_identical(family):
    reference = model(family)
    ids, mask = batch(family, left_padding=False)
    with torch.no_grad():
        before = run(reference, ids, attention_mask=mask)
        reference.set_attn_implementation("posenc")
        served = run(reference, ids, attention_mask=mask)
        reference.set_attn_implementation("eager")
        after = run(reference, ids, attention_mask=mask)
    assert torch.equal(before, after)
    assert not torch.equal(before, served) or family == "bert"   # it did run posenc


def t5_model(implementation="eager"):
    """A tiny random float64 T5 (8 buckets over 16 positions) on `implementation`."""
    torch.manual_seed(0)
    config = transformers.T5Config(
        vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_decoder_layers=2,
        num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=16,
        decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    built = transformers.T5ForConditionalGeneration(config).double().eval()
    built.set_attn_implementation(implementation)
    return built


def test_t5_on_the_interface():
    """T5 calls the interface with HF's position bias: posenc runs its t5 kernel
    with the layer's bucket table (no (1, H, n, m) bias is read), logits and the
    bias table's gradient as HF's, and generate() gives HF's tokens."""
    reference = t5_model("eager")
    ours = twin(reference)
    ids, mask = batch("t5", left_padding=False, n=13)
    labels = torch.randint(2, VOCAB, (3, 20), generator=torch.Generator().manual_seed(4))
    calls = []
    with warnings.catch_warnings(), mock.patch.object(
            posenc.torch, "t5_attention", side_effect=lambda *a, **k: calls.append(1)
            or T5_ATTENTION(*a, **k)):
        warnings.simplefilter("error")
        got = ours(input_ids=ids, attention_mask=mask, labels=labels)
        got.loss.backward()
    want = reference(input_ids=ids, attention_mask=mask, labels=labels)
    want.loss.backward()
    assert len(calls) == 4                               # 2 encoder + 2 decoder self-attention
    assert_close(want.logits.detach(), got.logits.detach(), 1e-10)
    assert_grads_close({name: p.grad for name, p in reference.named_parameters()},
                       {name: p.grad for name, p in ours.named_parameters()}, 1e-9)
    for cache in (None, "static"):
        options = dict(attention_mask=mask, max_new_tokens=12, do_sample=False,
                       cache_implementation=cache)
        assert torch.equal(ours.generate(ids, **options), reference.generate(ids, **options))


T5_ATTENTION = posenc.torch.t5_attention


def test_fallbacks_warn_and_match_eager():
    """Attention weights asked for, and a mask that is not causal/window/documents/
    padding: the model's eager attention runs, with one warning per reason."""
    reference = model("llama")
    ours = twin(reference)
    ids, mask = batch("llama", left_padding=False)
    with float64_softmax(), torch.no_grad():
        want = reference(ids, attention_mask=mask, output_attentions=True)
        interface_warned = pytest.warns(RuntimeWarning, match="output_attentions")
        with interface_warned:
            got = ours(ids, attention_mask=mask, output_attentions=True)
    assert got.attentions is not None and len(got.attentions) == 2
    assert_close(want.logits, got.logits, 1e-10)
    # a 4-D mask with a hole no kernel parameter makes
    n = ids.shape[1]
    holes = torch.ones(n, n, dtype=torch.bool).tril()
    holes[10, 3] = False
    holes = holes[None, None].expand(3, 1, n, n)
    with float64_softmax(), torch.no_grad():
        want = run(reference, ids, attention_mask=_additive(holes))
        with pytest.warns(RuntimeWarning, match="custom attention mask"):
            got = run(ours, ids, attention_mask=holes)
    assert_close(want, got, 1e-10)


def _additive(keep):
    return torch.zeros(keep.shape, dtype=torch.float64).masked_fill(
        ~keep, torch.finfo(torch.float64).min)


# ------------------------------------------------------------------ reading masks

def _reading(keep, offset=0, causal=True):
    batch, _, n, m = keep.shape
    return interface.read_mask(keep, batch, n, m, offset, causal)


def test_read_mask_patterns():
    """The patched ALiBi families' masks read at the model's own query offset (the
    cache's): padding, a left window and packed documents; the offset is never read
    from the mask."""
    n, m, offset = 5, 12, 7
    i = torch.arange(n)[:, None] + offset
    j = torch.arange(m)
    causal = (j <= i)[None, None].expand(2, 1, n, m)
    reading = _reading(causal, offset)
    assert reading == (True, offset, None, None, None)
    window = causal & (j >= i - 3)
    assert _reading(window, offset)[:3] == (True, offset, 3)
    padding = torch.zeros(2, m, dtype=torch.bool)
    padding[1, :4] = True
    padded = window & ~padding[:, None, None, :]
    reading = _reading(padded, offset)
    assert reading[:3] == (True, offset, 3)
    assert torch.equal(interface._implied(2, n, m, reading), padded[:, 0])
    assert reading.key_padding[1, :4].all() and not reading.key_padding[:, 4:].any()
    additive = _reading(_additive(padded), offset)
    assert additive[:3] == reading[:3] and torch.equal(additive.key_padding, reading.key_padding)
    # one decoding row that sees every key: causal at the cache's offset, never a
    # bidirectional reading at offset 0 (ALiBi's bias would point the wrong way)
    step = torch.ones(2, 1, 1, 9, dtype=torch.bool)
    step[1, ..., :3] = False
    reading = _reading(step, 8)
    assert reading[:3] == (True, 8, None) and reading.key_padding[1, :3].all()
    with pytest.raises(interface.Unserved, match="not causal"):
        _reading(step, 5)                      # keys after the query's position: not causal
    # bidirectional with right padding reads as padding only
    right = torch.ones(2, 1, 6, 6, dtype=torch.bool)
    right[1, ..., 4:] = False
    reading = _reading(right, causal=False)
    assert reading[:3] == (False, 0, None)
    # packed documents
    documents = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2, 2]])
    square = torch.arange(9)
    packed = ((square[None, :] <= square[:, None]) & (documents[0][:, None] == documents[0][None, :]))
    reading = _reading(packed[None, None])
    assert torch.equal(reading.documents[0], documents)


def test_read_mask_refuses_what_it_cannot_read():
    keep = torch.ones(1, 1, 4, 4, dtype=torch.bool).tril()
    keep[0, 0, 3, 1] = False
    with pytest.raises(interface.Unserved, match="not causal"):
        _reading(keep)
    heads = torch.ones(1, 2, 4, 4, dtype=torch.bool)
    heads[0, 1] = heads[0, 1].tril()
    with pytest.raises(interface.Unserved, match="differs between heads"):
        _reading(heads)
    with pytest.raises(interface.Unserved, match="other than 0 and -inf"):
        _reading(torch.full((1, 1, 4, 4), 0.5))
    with pytest.raises(interface.Unserved, match="dtype torch.int64"):
        _reading(torch.ones(1, 1, 4, 4, dtype=torch.long))


# ------------------------------------------------------------------ the ALiBi families (patch)

ALIBI = {
    "bloom": ("BloomConfig", "BloomForCausalLM", dict(hidden_size=40, n_layer=2, n_head=10)),
    "mpt": ("MptConfig", "MptForCausalLM", dict(d_model=32, n_layers=2, n_heads=4, max_seq_len=96)),
    "falcon": ("FalconConfig", "FalconForCausalLM", dict(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, alibi=True, bias=True,
        new_decoder_architecture=False, multi_query=False)),
    "falcon_mqa": ("FalconConfig", "FalconForCausalLM", dict(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, alibi=True, bias=True,
        new_decoder_architecture=False, multi_query=True)),
    "falcon_gqa": ("FalconConfig", "FalconForCausalLM", dict(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_kv_heads=2, alibi=True,
        bias=True, new_decoder_architecture=True)),
}


def alibi_model(family, dtype=torch.float64, seed=0):
    """HF's eager attention, except Falcon's sdpa (HF's eager Falcon adds its ALiBi
    twice: once in the scores, once in the mask it folded it into)."""
    config_name, model_name, extra = ALIBI[family]
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = getattr(transformers, config_name)(vocab_size=VOCAB, **extra)
        config._attn_implementation = "sdpa" if family.startswith("falcon") else "eager"
        return getattr(transformers, model_name)(config).to(dtype).eval()


def patched(reference):
    return posenc.torch.hf.patch(copy.deepcopy(reference))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("family", list(ALIBI))
def test_alibi_families_logits_and_gradients(family, dtype):
    reference = alibi_model(family, dtype)
    ours = patched(reference)
    assert ours._posenc_patched == 2                     # both layers
    check_padded_batch(reference, ours, family, dtype)


@pytest.mark.parametrize("family", list(ALIBI))
def test_alibi_families_generate(family):
    """Greedy generate() of 32 tokens from a left-padded batch: HF's tokens (the
    static cache where HF runs it: BLOOM; MPT ignores it, Falcon fails on it)."""
    reference = alibi_model(family)
    ours = patched(reference)
    ids, mask = batch(family, n=9)
    mask[2] = 1
    ids[mask == 0] = 0
    caches = [None, "static"] if family == "bloom" else [None]
    for cache in caches:
        options = dict(attention_mask=mask, max_new_tokens=32, min_new_tokens=32, do_sample=False,
                       pad_token_id=0, eos_token_id=None, cache_implementation=cache)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = ours.generate(ids, **options)
        with float64_softmax():
            want = reference.generate(ids, **options)
        assert got.shape == (3, 9 + 32) and torch.equal(got, want)


def test_alibi_unpatch_is_bit_identical_and_rotary_falcon_is_left_alone():
    reference = alibi_model("bloom")
    ids, mask = batch("bloom", left_padding=False)
    with torch.no_grad():
        before = run(reference, ids, attention_mask=mask)
        posenc.torch.hf.patch(reference)
        assert posenc.torch.hf.is_patched(reference)
        run(reference, ids, attention_mask=mask)
        posenc.torch.hf.unpatch(reference)
        after = run(reference, ids, attention_mask=mask)
    assert torch.equal(before, after) and not posenc.torch.hf.is_patched(reference)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rotary = transformers.FalconForCausalLM(transformers.FalconConfig(
            vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            alibi=False))
    assert posenc.torch.hf.patch(rotary)._posenc_patched == 0


def test_alibi_padding_inside_a_row_falls_back():
    """BLOOM's positions count kept tokens only: a hole in the middle of a row shifts
    the keys after it, which no ALiBi line gives; HF's forward runs, with a warning."""
    reference = alibi_model("bloom")
    ours = patched(reference)
    ids, mask = batch("bloom", left_padding=False)
    mask[0, 6:8] = 0
    with float64_softmax(), torch.no_grad():
        want = run(reference, ids, attention_mask=mask)
    with pytest.warns(RuntimeWarning, match="ALiBi tensor that is not"), torch.no_grad():
        got = run(ours, ids, attention_mask=mask)
    keep = mask.bool()
    assert_close(want[keep], got[keep], 1e-6)      # HF's own float32 line in the fallback


def test_patch_puts_an_interface_model_on_posenc_and_unpatch_restores_it():
    """patch() of a model on the attention interface: attn_implementation="posenc" and
    the attention projections on posenc's GEMM; unpatch() restores both, bit-identically."""
    reference = model("llama", implementation="sdpa")
    ids, mask = batch("llama", left_padding=False)
    with torch.no_grad():
        before = run(reference, ids, attention_mask=mask)
        posenc.torch.hf.patch(reference)
        assert reference.config._attn_implementation == "posenc"
        assert reference._posenc_patched == 2 and posenc.torch.hf.is_patched(reference)
        projection = reference.model.layers[0].self_attn.q_proj
        assert type(projection).__name__ == "PosencLinear"        # on posenc's GEMM
        served = run(reference, ids, attention_mask=mask)
        buffer = io.BytesIO()                 # a whole patched model pickles (torch.save)
        torch.save(reference, buffer)
        buffer.seek(0)
        assert torch.equal(run(torch.load(buffer, weights_only=False), ids, attention_mask=mask),
                           served)
        posenc.torch.hf.unpatch(reference)
        assert type(projection) is torch.nn.Linear
        after = run(reference, ids, attention_mask=mask)
    assert reference.config._attn_implementation == "sdpa" and not posenc.torch.hf.is_patched(reference)
    assert torch.equal(before, after)
    assert_close(before, served, 1e-10)


def test_training_with_attention_dropout():
    """train() with HF's attention dropout: posenc draws it inside the kernel from
    torch's generator (a seeded step repeats exactly, gradients too; another seed
    drops other entries; the dropped output differs from eval()'s)."""
    config_name, model_name, extra = FAMILIES["llama"]
    torch.manual_seed(0)
    config = getattr(transformers, config_name)(**_COMMON, **extra, attention_dropout=0.3)
    net = getattr(transformers, model_name)(config).double()
    net.set_attn_implementation("posenc")
    ids, mask = batch("llama", left_padding=False)

    def step(seed):
        torch.manual_seed(seed)
        return loss_and_grads(net.train(), ids, mask, attention_mask=mask)

    (a, grads_a), (b, grads_b), (c, _) = step(1), step(1), step(2)
    assert torch.equal(a, b) and all(torch.equal(grads_a[k], grads_b[k]) for k in grads_a)
    assert not torch.equal(a, c)
    with torch.no_grad():
        plain = run(net.eval(), ids, attention_mask=mask)
    assert not torch.equal(a, plain) and torch.isfinite(a).all()
