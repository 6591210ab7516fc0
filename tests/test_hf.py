"""posenc.torch.hf: Hugging Face models patched onto posenc's fused attention
give HF's numbers (logits, every parameter gradient, generate() with the
cache), keep the same parameters, fall back on what they cannot serve, and
unpatch exactly.  Tiny models with random weights, built from configs.  The
T5 tests run T5 and UMT5 (its own attention class, a bias in every layer);
the first of them mT5 too."""

from __future__ import annotations

import copy
import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import transformers  # noqa: E402

import posenc.torch  # noqa: E402
from posenc.torch import hf  # noqa: E402

pytestmark = pytest.mark.usefixtures("no_hf_fallback")

FAMILIES = {"t5": "T5", "mt5": "MT5", "umt5": "UMT5"}     # HF's class prefix
T5_FAMILIES = ["t5", "umt5"]


def t5_model(dtype=torch.float64, implementation="eager", seed=0, family="t5"):
    torch.manual_seed(seed)
    prefix = FAMILIES[family]
    config = getattr(transformers, prefix + "Config")(
        vocab_size=40, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
        relative_attention_num_buckets=8, relative_attention_max_distance=16, dropout_rate=0.1,
        decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    config._attn_implementation = implementation
    return getattr(transformers, prefix + "ForConditionalGeneration")(config).to(dtype).eval()


def self_attention_biases(model):
    """The relative_attention_bias weight of each self-attention layer's bias
    owner, encoder then decoder: T5's first layer's for every layer, UMT5's own."""
    found = []
    for stack in (model.encoder, model.decoder):
        for block in stack.block:
            layer = block.layer[0].SelfAttention
            owner = layer if layer.has_relative_attention_bias else stack.block[0].layer[0].SelfAttention
            found.append(owner.relative_attention_bias.weight)
    return found


def t5_batch(seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, 40, (3, 13), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0                                   # padded sequences
    mask[2, 4:] = 0
    ids[mask == 0] = 0
    labels = torch.randint(2, 40, (3, 20), generator=g)   # decoder longer than max_distance
    return dict(input_ids=ids, attention_mask=mask, labels=labels)


def logits_and_grads(model, batch):
    model.zero_grad(set_to_none=True)
    out = model(**batch)
    (out.logits.square().mean() + out.loss).backward()
    return out.logits.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-300)).item()


def grad_close(got, want, bound):
    """Relative to the gradient's largest entry, with a floor: pos_key_proj.bias
    gets an analytically zero gradient (q_i·b is the same for every key j, and
    the softmax cancels it), so both sides hold rounding noise of ~1e-22."""
    return ((got - want).abs().max() / want.abs().max().clamp_min(1e-6)).item() <= bound


def assert_same_logits_and_grads(got, want, bound):
    """(logits, gradients by name) of the patched model against HF's, relative error <= bound."""
    assert rel(got[0], want[0]) <= bound
    assert got[1].keys() == want[1].keys()
    for name in want[1]:
        assert grad_close(got[1][name], want[1][name], bound), name


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_t5_float64_logits_and_gradients(implementation, family):
    model, batch = t5_model(implementation=implementation, family=family), t5_batch()
    want = logits_and_grads(model, batch)
    hf.patch(model)
    assert model._posenc_patched == 2 + 2 * 2         # encoder self, decoder self + cross
    assert_same_logits_and_grads(logits_and_grads(model, batch), want, 1e-10)


@pytest.mark.parametrize("family", T5_FAMILIES)
def test_t5_float32(family):
    model, batch = t5_model(torch.float32, "sdpa", family=family), t5_batch()
    want = logits_and_grads(model, batch)
    hf.patch(model)
    assert_same_logits_and_grads(logits_and_grads(model, batch), want, 1e-4)


@pytest.mark.parametrize("family", T5_FAMILIES)
def test_t5_runs_posenc(monkeypatch, family):
    """The patched layers really call the fused functions: every T5 self-attention
    through t5_attention (2 encoder + 2 decoder layers) with its bias owner's
    table (T5: the first layer's, UMT5: the layer's own), cross-attention
    through content_attention."""
    import posenc.torch as pt

    calls, tables = [], []
    for name in ("t5_attention", "content_attention"):
        original = getattr(pt, name)
        monkeypatch.setattr(pt, name, lambda *a, _o=original, _n=name, **k: (calls.append(_n), _o(*a, **k))[1])
    t5_attention = pt.t5_attention
    monkeypatch.setattr(pt, "t5_attention", lambda *a, **k: (tables.append(a[3].data_ptr()), t5_attention(*a, **k))[1])
    model = hf.patch(t5_model(family=family))
    model(**t5_batch())
    assert calls.count("t5_attention") == 4 and calls.count("content_attention") == 2
    assert tables == [w.data_ptr() for w in self_attention_biases(model)]
    assert len(set(tables)) == (4 if family == "umt5" else 2)


@pytest.mark.parametrize("family", T5_FAMILIES)
def test_t5_parameters_are_shared(family):
    model = t5_model(family=family)
    before = [(name, id(p)) for name, p in model.named_parameters()]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    hf.patch(model)
    assert [(name, id(p)) for name, p in model.named_parameters()] == before
    assert model.state_dict().keys() == state.keys()
    # one optimizer step on the patched model moves the very parameters HF uses
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(**t5_batch()).loss.backward()
    optimizer.step()
    tables = [name for name in state if "relative_attention_bias" in name]
    assert len(tables) == (4 if family == "umt5" else 2)
    for name in tables:
        assert not torch.equal(model.state_dict()[name], state[name]), name


@pytest.mark.parametrize("family", T5_FAMILIES)
@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_t5_generate_with_cache(implementation, family):
    model, batch = t5_model(implementation=implementation, family=family), t5_batch()
    kwargs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=32,
                  min_new_tokens=32, do_sample=False, use_cache=True)
    want = model.generate(**kwargs)
    hf.patch(model)
    got = model.generate(**kwargs)
    assert got.shape == (3, 33)
    assert torch.equal(got, want)


@pytest.mark.parametrize("family", T5_FAMILIES)
def test_t5_cached_step_equals_full_pass(family):
    """Decoding step by step with posenc's cache (query_offset = cached keys)
    reproduces the logits of one full decoder pass, in float64."""
    model, batch = hf.patch(t5_model(family=family)), t5_batch()
    encoder = model.get_encoder()(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    dec = batch["labels"][:, :19]
    full = model(encoder_outputs=encoder, attention_mask=batch["attention_mask"], decoder_input_ids=dec).logits
    past, steps = None, []
    for i in range(dec.shape[1]):
        out = model(encoder_outputs=encoder, attention_mask=batch["attention_mask"],
                    decoder_input_ids=dec[:, i:i + 1], past_key_values=past, use_cache=True)
        past = out.past_key_values
        steps.append(out.logits)
    assert rel(torch.cat(steps, dim=1), full) <= 1e-10


@pytest.mark.parametrize("family", T5_FAMILIES)
def test_t5_unpatch_is_exact(family):
    model, batch = t5_model(family=family), t5_batch()
    before = model(**batch).logits
    classes = [type(m) for m in model.modules()]
    hf.unpatch(hf.patch(model))
    assert [type(m) for m in model.modules()] == classes
    assert not hf.is_patched(model)
    assert torch.equal(model(**batch).logits, before)


def test_t5_patch_is_idempotent_and_deepcopies():
    model = hf.patch(hf.patch(t5_model()))
    assert hf.is_patched(model)
    twin = copy.deepcopy(model)
    batch = t5_batch()
    assert torch.equal(twin(**batch).logits, model(**batch).logits)


@pytest.mark.parametrize("family", T5_FAMILIES)
def test_t5_output_attentions_falls_back_once(family):
    model, batch = t5_model(family=family), t5_batch()
    want = model(**batch, output_attentions=True)
    hf.patch(model)
    with pytest.warns(RuntimeWarning, match="output_attentions") as record:
        got = model(**batch, output_attentions=True)
        model(**batch, output_attentions=True)
    assert len([w for w in record if "output_attentions" in str(w.message)]) == 1
    # the warning points at the line that called the model, not into torch's module.py
    assert [w.filename for w in record if "output_attentions" in str(w.message)] == [__file__]
    assert rel(got.logits, want.logits) <= 1e-10
    assert len(got.encoder_attentions) == 2 and len(got.cross_attentions) == 2
    for a, b in zip(got.encoder_attentions + got.decoder_attentions, want.encoder_attentions + want.decoder_attentions):
        assert rel(a, b) <= 1e-10


@pytest.mark.parametrize("family", T5_FAMILIES)
def test_t5_unusual_mask_falls_back(family):
    """A decoder mask whose first key is padding leaves query row 0 with no key:
    HF's number there is not posenc's zero row, so that call falls back."""
    model, batch = t5_model(family=family), t5_batch()
    batch["decoder_attention_mask"] = torch.ones_like(batch["labels"])
    batch["decoder_attention_mask"][0, 0] = 0
    want = model(**batch).logits
    hf.patch(model)
    with pytest.warns(RuntimeWarning, match="all masked"):
        got = model(**batch).logits
    assert rel(got, want) <= 1e-10


@pytest.mark.parametrize("family", T5_FAMILIES)
def test_t5_dropout_in_training_runs_posenc(family):
    model, batch = hf.patch(t5_model(family=family)), t5_batch()
    model.train()
    torch.manual_seed(3)
    a = model(**batch).logits
    torch.manual_seed(3)
    b = model(**batch).logits
    torch.manual_seed(4)
    c = model(**batch).logits
    assert torch.equal(a, b) and not torch.equal(a, c)
    model(**batch).loss.backward()


# ------------------------------------------------------------------ DeBERTa-v2

DEBERTA_SETTINGS = [
    dict(share_att_key=True, position_buckets=256, max_relative_positions=-1),   # DeBERTa-v3's
    dict(share_att_key=False, position_buckets=-1, max_relative_positions=8),    # clipped, no log buckets
    dict(share_att_key=True, position_buckets=4, max_relative_positions=16),     # log buckets in reach
    dict(share_att_key=False, position_buckets=8, max_relative_positions=32),
]


def deberta_model(dtype=torch.float64, seed=0, **settings):
    from transformers import DebertaV2Config, DebertaV2ForSequenceClassification

    torch.manual_seed(seed)
    config = DebertaV2Config(vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                             intermediate_size=64, max_position_embeddings=512, relative_attention=True,
                             pos_att_type=["p2c", "c2p"], norm_rel_ebd="layer_norm", num_labels=3,
                             **settings)
    return DebertaV2ForSequenceClassification(config).to(dtype).eval()


def deberta_batch(seed=2):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, 40, (3, 21), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 15:] = 0
    mask[2, 4:] = 0
    return dict(input_ids=ids, attention_mask=mask, labels=torch.tensor([0, 1, 2]))


def deberta_logits_and_grads(model, batch):
    model.zero_grad(set_to_none=True)
    out = model(**batch)
    (out.loss + out.logits.square().mean()).backward()
    return out.logits.detach(), {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("settings", DEBERTA_SETTINGS, ids=lambda s: "-".join(f"{v}" for v in s.values()))
def test_deberta_float64_logits_and_gradients(settings):
    model, batch = deberta_model(**settings), deberta_batch()
    want = deberta_logits_and_grads(model, batch)
    params = [id(p) for p in model.parameters()]
    assert hf.patch(model)._posenc_patched == 2
    assert [id(p) for p in model.parameters()] == params
    assert_same_logits_and_grads(deberta_logits_and_grads(model, batch), want, 1e-10)


def test_deberta_float32_and_unpatch():
    model, batch = deberta_model(torch.float32, **DEBERTA_SETTINGS[0]), deberta_batch()
    want = deberta_logits_and_grads(model, batch)
    hf.patch(model)
    assert_same_logits_and_grads(deberta_logits_and_grads(model, batch), want, 1e-4)
    hf.unpatch(model)
    assert not hf.is_patched(model)
    assert torch.equal(deberta_logits_and_grads(model, batch)[0], want[0])


def test_deberta_runs_posenc(monkeypatch):
    import posenc.torch as pt

    calls = []
    original = pt.deberta_attention
    monkeypatch.setattr(pt, "deberta_attention", lambda *a, **k: (calls.append(k["scale"]), original(*a, **k))[1])
    model = hf.patch(deberta_model(**DEBERTA_SETTINGS[0]))
    model(**deberta_batch())
    import posenc
    assert calls == [posenc.deberta_hf_scale(8)] * 2     # HF's float32-rounded 1/sqrt(3d)


def test_deberta_output_attentions_and_c2p_only_fall_back():
    model, batch = deberta_model(**DEBERTA_SETTINGS[1]), deberta_batch()
    want = model(**batch, output_attentions=True)
    hf.patch(model)
    with pytest.warns(RuntimeWarning, match="output_attentions"):
        got = model(**batch, output_attentions=True)
    assert rel(got.logits, want.logits) <= 1e-10 and len(got.attentions) == 2
    model = deberta_model(**DEBERTA_SETTINGS[1])
    model.config.pos_att_type = ["c2p"]
    for layer in model.deberta.encoder.layer:
        layer.attention.self.pos_att_type = ["c2p"]
    want = model(**batch).logits
    hf.patch(model)
    with pytest.warns(RuntimeWarning, match="c2p"):
        got = model(**batch).logits
    assert torch.equal(got, want)


def test_example_runs(monkeypatch, capsys):
    """examples/hf_t5.py end to end, with a few steps."""
    import pathlib
    import runpy

    path = pathlib.Path(__file__).resolve().parent.parent / "examples" / "hf_t5.py"
    module = runpy.run_path(str(path), run_name="hf_t5_example")
    module["main"](["--steps", "3", "--deberta-steps", "3"])
    out = capsys.readouterr().out
    assert "t5 generate()" in out and "deberta majority token" in out


def _without_dropout(model):
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "dropout", None), float):     # T5Attention's probability
            module.dropout = 0.0
    return model


@pytest.mark.parametrize("which", ["t5", "umt5", "deberta"])
def test_activation_checkpointing_in_training(which):
    """train() with HF's activation checkpointing (the blocks re-run in the
    backward; T5 hands its shared-bias marker through them)."""
    if which in T5_FAMILIES:
        model, batch, run = t5_model(family=which), t5_batch(), logits_and_grads
    else:
        model, batch, run = deberta_model(**DEBERTA_SETTINGS[0]), deberta_batch(), deberta_logits_and_grads
    _without_dropout(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable()
        else:  # pragma: no cover
            model.gradient_checkpointing_enable()
    model.train()
    want = run(model, batch)
    hf.patch(model)
    assert_same_logits_and_grads(run(model, batch), want, 1e-10)


def test_patched_models_pickle(tmp_path):
    """torch.save of a whole patched model loads back patched, with equal outputs."""
    for model, batch in ((t5_model(), t5_batch()), (t5_model(family="umt5"), t5_batch()),
                         (deberta_model(**DEBERTA_SETTINGS[0]), deberta_batch())):
        hf.patch(model)
        want = model(**batch).logits
        torch.save(model, tmp_path / "model.pt")
        loaded = torch.load(tmp_path / "model.pt", weights_only=False)
        assert hf.is_patched(loaded)
        assert torch.equal(loaded(**batch).logits, want)


@pytest.mark.parametrize("family", T5_FAMILIES)
def test_t5_static_cache_falls_back(family):
    """A StaticCache (keys preallocated to the maximum length) is not served:
    generate() with it runs HF's forward and gives HF's tokens."""
    model, batch = t5_model(family=family), t5_batch()
    kwargs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=6,
                  min_new_tokens=6, do_sample=False, cache_implementation="static")
    want = model.generate(**kwargs)
    hf.patch(model)
    with pytest.warns(RuntimeWarning, match="StaticCache|Cache"):
        got = model.generate(**kwargs)
    assert torch.equal(got, want)


def _served_by_posenc(monkeypatch):
    """Count the patched layers' calls of the fused ops, by the dtype of q."""
    import posenc.torch as pt

    dtypes = []
    for name in ("t5_attention", "content_attention", "deberta_attention"):
        original = getattr(pt, name)
        monkeypatch.setattr(pt, name, lambda *a, _o=original, **k: (dtypes.append(a[0].dtype),
                                                                    _o(*a, **k))[1])
    return dtypes


def _worst(got, want):
    """The largest relative error of the logits and of any gradient against the
    float32 run (gradients as grad_close measures them)."""
    logits = rel(got[0].float(), want[0])
    grads = max(((got[1][k].float() - want[1][k]).abs().max() / want[1][k].abs().max()
                 .clamp_min(1e-6)).item() for k in want[1])
    return logits, grads


@pytest.mark.parametrize("precision", ["autocast-bf16", "bf16", "fp16"])
@pytest.mark.parametrize("which", ["t5", "umt5", "deberta"])
def test_low_precision(monkeypatch, which, precision):
    """Mixed precision (CPU autocast to bfloat16 on a float32 model) and models cast
    to bfloat16 or float16 run on posenc's C kernels in 16 bits (no fallback:
    the autouse fixture turns one into an error), and are as close to the float32
    model as HF's own run in that precision: the patched model's largest relative
    error (logits; every gradient) within twice HF's plus 4 u.  Under autocast the
    float32 parameters get float32 gradients."""
    if which in T5_FAMILIES:
        model, batch, run = t5_model(torch.float32, "sdpa", family=which), t5_batch(), logits_and_grads
    else:
        model, batch, run = (deberta_model(torch.float32, **DEBERTA_SETTINGS[0]), deberta_batch(),
                             deberta_logits_and_grads)
    want = run(model, batch)
    dtype = torch.float16 if precision == "fp16" else torch.bfloat16
    u = 2.0 ** -11 if dtype == torch.float16 else 2.0 ** -8
    autocast = torch.autocast("cpu", dtype=dtype, enabled=precision.startswith("autocast"))
    if not precision.startswith("autocast"):
        model = model.to(dtype)
    with autocast:
        theirs = run(model, batch)
    dtypes = _served_by_posenc(monkeypatch)
    hf.patch(model)
    with autocast:
        ours = run(model, batch)
    assert dtypes and set(dtypes) == {dtype}
    params = {g.dtype for g in ours[1].values()}
    assert params == ({torch.float32} if precision.startswith("autocast") else {dtype})
    for got, limit in zip(_worst(ours, want), _worst(theirs, want)):
        assert got <= 2 * limit + 4 * u, (got, limit)


def test_bfloat16_without_ml_dtypes_runs_the_native_formulas(monkeypatch):
    """Without ml_dtypes NumPy cannot hold bfloat16: a patched bfloat16 model raised a
    TypeError in every call; the ops now run their native formulas there (the same
    numbers as use_native), and the patched model its forward and backward."""
    model, batch = t5_model(dtype=torch.bfloat16), t5_batch()
    hf.patch(model)
    with posenc.torch.use_native():
        want = model(**batch).logits
    monkeypatch.setattr(posenc._dtypes, "BFLOAT16", None)
    got = model(**batch)
    torch.testing.assert_close(got.logits, want, rtol=0, atol=0)
    got.loss.backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize("family", ["t5", "deberta"])
def test_patched_models_export_and_compile_as_unpatched_ones(family):
    """torch.export (strict and not) and torch.compile(fullgraph=True) failed on patched
    models where the unpatched ones work: value-dependent Python in the forward
    (torch.equal on the mask, the relative_pos check, a ContextVar.get()).  The checks
    are runtime assertions in a traced graph; the results equal the eager ones."""
    if family == "t5":
        model, batch = t5_model(dtype=torch.float32), dict(t5_batch(), use_cache=False)
    else:
        model, batch = deberta_model(dtype=torch.float32), deberta_batch()
        batch.pop("labels")          # HF's own loss has a data-dependent branch
    hf.patch(model)
    want = model(**batch).logits
    for strict in (False, True):
        exported = torch.export.export(model, (), dict(batch), strict=strict)
        torch.testing.assert_close(exported.module()(**batch).logits, want, rtol=1e-5, atol=1e-6)
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(**batch).logits, want, rtol=1e-5, atol=1e-6)


def test_patched_t5_training_step_with_dropout_compiles_without_graph_breaks():
    """The dropout seed was drawn by .item() (35 graph breaks and a recompile a step);
    now one graph, a fresh seed each step, and gradients."""
    model, batch = t5_model(dtype=torch.float32), dict(t5_batch(), use_cache=False)
    hf.patch(model)
    model.train()
    explanation = torch._dynamo.explain(lambda: model(**batch).loss)()
    assert explanation.graph_break_count == 0, explanation.break_reasons
    torch._dynamo.reset()
    step = torch.compile(lambda: model(**batch).loss, fullgraph=True, backend="eager")
    first, second = step(), step()
    assert not torch.equal(first, second)          # two dropout seeds
    first.backward()
    assert model.shared.weight.grad is not None
