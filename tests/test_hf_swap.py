"""posenc.torch.hf.swap_positional_encoding: a tiny Llama (GQA, rotary) and a tiny
BERT (absolute position embeddings) with their positional encoding replaced by
every posenc method train on examples/pe_ablation.py's copy task, save and load
back bit-identically, generate with a cache as the no-cache forward computes,
keep every other weight, and say what they run (describe)."""

from __future__ import annotations

import importlib.util
import pathlib
import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from posenc.torch import hf  # noqa: E402
from posenc.torch._hf_swap import ENCODINGS, IdentityRotation, NoPositions  # noqa: E402

# a fallback is an error unless a test catches its warning
pytestmark = pytest.mark.usefixtures("no_hf_fallback")

ROOT = pathlib.Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("pe_ablation", ROOT / "examples" / "pe_ablation.py")
ablation = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ablation)

METHODS = sorted(ENCODINGS)


def build(kind, dtype=torch.float64):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ablation.build(kind).to(dtype).eval()


def test_the_swap_keeps_every_other_weight():
    model = build("llama")
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    hf.swap_positional_encoding(model, "t5")
    after = dict(model.named_parameters())
    assert all(torch.equal(before[name], after[name]) for name in before)
    assert all(before[name] is not None for name in before)
    new = sorted(set(after) - set(before))
    assert new == ["posenc_encodings.encodings.0.bias"]       # T5 shares one table
    assert isinstance(model.model.rotary_emb, IdentityRotation)
    bert = hf.swap_positional_encoding(build("bert"), "diet_rel")
    assert isinstance(bert.bert.embeddings.position_embeddings, NoPositions)
    assert len(bert.posenc_encodings.encodings) == 2                # DIET-REL: one per layer


@pytest.mark.parametrize("kind", ["llama", "bert"])
def test_every_method_trains(kind):
    """150 steps of the copy task per method: every loss falls (on the BERT, the
    encodings whose bias is symmetric in j - i -- alibi, kerple -- and content
    alone cannot tell the copy's source, k + 1 back, from other places: they learn
    only which tokens occur, towards log 8), and at least six methods all but
    solve it within those steps (examples/pe_ablation.py runs 300)."""
    solved = []
    for method in METHODS:
        losses = ablation.train(kind, method, 150)["losses"]
        start, end = losses[0], sum(losses[-20:]) / 20
        assert end < (0.85 if kind == "bert" else 0.75) * start, (method, start, end)
        if end < 0.1 * start:
            solved.append(method)
    assert len(solved) >= 6 and "content" not in solved, solved


@pytest.mark.parametrize("method", METHODS)
def test_save_and_load_back(method, tmp_path):
    for kind in ("llama", "bert"):
        model = hf.swap_positional_encoding(build(kind), method)
        with torch.no_grad():                 # trained-looking encodings, not the init
            for p in model.posenc_encodings.parameters():
                p.add_(torch.randn_like(p) * 0.1)
        ids = torch.randint(2, ablation.VOCAB, (2, 13), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            want = model(ids).logits
        model.save_pretrained(tmp_path / kind)
        loaded = hf.from_pretrained(type(model), str(tmp_path / kind)).eval()
        with torch.no_grad():
            got = loaded(ids).logits
        assert loaded.posenc_encodings.method == method
        assert torch.equal(want, got), (kind, float((want - got).abs().max()))


@pytest.mark.parametrize("method", METHODS)
def test_generate_with_cache_equals_the_forward(method):
    """Greedy decoding with HF's DynamicCache, one token per step: each step's
    logits are those of a forward of the whole sequence without a cache (float64,
    1e-10; generate() itself hands out float32 logits), and generate() gives the
    same tokens with and without its cache."""
    model = hf.swap_positional_encoding(build("llama"), method)
    with torch.no_grad():
        for p in model.posenc_encodings.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    ids = torch.randint(2, ablation.VOCAB, (2, 9), generator=torch.Generator().manual_seed(2))
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("error", RuntimeWarning)         # no fallback
        cache = transformers.DynamicCache(config=model.config)
        steps = [model(ids, past_key_values=cache, use_cache=True).logits[:, -1]]
        sequence = ids
        for _ in range(12):
            token = steps[-1].argmax(-1, keepdim=True)
            sequence = torch.cat([sequence, token], dim=1)
            steps.append(model(token, past_key_values=cache, use_cache=True).logits[:, -1])
        full = model(sequence, use_cache=False).logits[:, 8:]
        options = dict(max_new_tokens=12, min_new_tokens=12, do_sample=False, pad_token_id=0,
                       eos_token_id=None)
        cached = model.generate(ids, **options)
        uncached = model.generate(ids, use_cache=False, **options)
    error = float((torch.stack(steps, dim=1) - full).abs().max() / full.abs().max())
    assert error <= 1e-10, error
    assert torch.equal(cached, sequence[:, :21]) and torch.equal(cached, uncached)


def test_describe():
    model = build("llama")
    text = hf.describe(model)
    assert "LlamaRotaryEmbedding" in text and "2 self-attention layers (LlamaAttention)" in text
    hf.swap_positional_encoding(model, "kerple")
    text = hf.describe(model)
    assert "posenc kerple (KERPLE, one per layer (2); 16 parameters), replacing " \
           "LlamaRotaryEmbedding" in text
    assert "attn_implementation='posenc'" in text
    bert = hf.swap_positional_encoding(build("bert"), "tupe")
    assert "one shared by all layers" in hf.describe(bert)
    assert "Embedding (position_embeddings)" in hf.describe(bert)


def test_errors():
    with pytest.raises(ValueError, match="unknown method 'rotary'; choose one of alibi"):
        hf.swap_positional_encoding(build("llama"), "rotary")
    with pytest.raises(TypeError, match=r"T5RelativeBias \(t5\) takes no argument buckets"):
        hf.swap_positional_encoding(build("llama"), "t5", buckets=8)
    model = hf.swap_positional_encoding(build("llama"), "t5")
    with pytest.raises(ValueError, match="already swapped"):
        hf.swap_positional_encoding(model, "alibi")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bloom = transformers.BloomForCausalLM(transformers.BloomConfig(
            vocab_size=32, hidden_size=16, n_layer=1, n_head=2))
    with pytest.raises(ValueError, match="does not call its attention through HF's attention"):
        hf.swap_positional_encoding(bloom, "t5")
    with pytest.raises(TypeError, match="JSON values"):
        hf.swap_positional_encoding(build("llama"), "relative_bias", bias_fn=torch.nn.Identity())


@pytest.mark.parametrize("method", ["t5", "diet_abs", "alibi"])
def test_a_swapped_model_falls_back_with_its_own_encoding(method):
    """What the fused call cannot serve (attention weights) runs the swapped
    encoding's logits the eager way -- not the model's own eager attention, which
    knows nothing of the swap: the same logits, and weights that are softmaxes."""
    model = hf.swap_positional_encoding(build("llama"), method)
    with torch.no_grad():
        for p in model.posenc_encodings.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    ids = torch.randint(2, ablation.VOCAB, (2, 11), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    with torch.no_grad():
        fused = model(ids, attention_mask=mask).logits
        with pytest.warns(RuntimeWarning, match="output_attentions"):
            out = model(ids, attention_mask=mask, output_attentions=True)
    keep = mask.bool()
    error = float((out.logits - fused)[keep].abs().max() / fused[keep].abs().max())
    assert error <= 1e-10, error
    weights = out.attentions[0]
    assert weights.shape == (2, 4, 11, 11)
    assert torch.allclose(weights[0].sum(-1), torch.ones(4, 11, dtype=weights.dtype))
    assert not weights[0].triu(1).any()                  # causal
