"""posenc.torch: the custom ops (C kernels), the native formulas, the modules.

Every op and every float input is checked by float64 gradcheck on both paths
(C kernels; torch-native formulas forced on CPU by `use_native`), against
posenc.reference (forward and gradients), for the gradients it must not
compute, inside torch.compile(fullgraph=True), and through the modules of
posenc.torch.nn.  Seeds come from POSENC_TEST_SEED via the `rng` fixture.
"""

from __future__ import annotations

import importlib.util
import inspect
import math
import pathlib
import shutil
from dataclasses import dataclass, field

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import posenc
import posenc.reference as ref
import posenc.torch as pt
from posenc import _methods
from posenc._registry import GRAD_FIELDS
from posenc.torch import _ops
from posenc.torch import nn as pnn

B, H, N, M, D, DP = 2, 2, 5, 4, 3, 2
PATHS = ("c", "native")
ROOT = pathlib.Path(__file__).resolve().parents[1]


@dataclass
class Case:
    """One call: float tensors by argument name (positional ones first), params."""

    id: str
    method: str
    positional: dict               # name -> shape, after q and k
    keyword: dict = field(default_factory=dict)     # float keyword tensors: name -> shape
    params: dict = field(default_factory=dict)
    segments: int = 0              # number of segment ids (0: no segments)
    positive: bool = False         # parameters drawn in (0.5, 1.5) (KERPLE's r1, r2)


def _case_list():
    qk = {"q": (B, H, N, D), "k": (B, H, M, D)}
    t5 = {"num_buckets": 8, "max_distance": 6}
    return [
        Case("content", "content", qk),
        Case("content-scale", "content", qk, params={"scale": 0.7}),
        Case("shaw-shared", "shaw", {**qk, "rel_k": (1, 5, D)}, params={"max_distance": 2}),
        Case("shaw-per-head", "shaw", {**qk, "rel_k": (H, 3, D)}, params={"max_distance": 1}),
        Case("t5", "t5", {**qk, "bias": (H, 8)}, params=t5),
        Case("t5-shared-unidirectional", "t5", {**qk, "bias": (1, 8)},
             params={**t5, "bidirectional": False, "scale": 0.5}),
        Case("m2-per-head", "m2", {**qk, "rel": (H, 5)}, params={"max_distance": 2}),
        Case("m2-shared", "m2", {**qk, "rel": (1, 3)}, params={"max_distance": 1}),
        Case("m4-shared", "m4", {**qk, "rel_k": (1, 5, D)}, params={"max_distance": 2}),
        Case("m4-per-head", "m4", {**qk, "rel_k": (H, 5, D)}, params={"max_distance": 2}),
        Case("m4m-per-head", "m4m", {**qk, "rel_k": (H, 5, D)}, params={"max_distance": 2}),
        Case("m4m-shared", "m4m", {**qk, "rel_k": (1, 3, D)}, params={"max_distance": 1}),
        Case("deberta", "deberta", {**qk, "pos_key": (H, 6, D), "pos_query": (1, 6, D)},
             params={"att_span": 3}),
        Case("deberta-log-buckets", "deberta", {**qk, "pos_key": (1, 8, D), "pos_query": (H, 8, D)},
             params={"att_span": 4, "position_buckets": 4, "max_relative_positions": 8}),
        Case("tupe-a", "tupe", {**qk, "pos_q": (1, N, DP), "pos_k": (H, M, DP)}),
        Case("tupe-r-theta-shared", "tupe", {**qk, "pos_q": (H, N, DP), "pos_k": (1, M, DP)},
             keyword={"bias": (H, 8), "theta": (1, 2)}, params=t5),
        Case("tupe-a-theta-per-head", "tupe", {**qk, "pos_q": (H, N, DP), "pos_k": (H, M, DP)},
             keyword={"theta": (H, 2)}),
        Case("tupe-r-shared-bias", "tupe", {**qk, "pos_q": (1, N, DP), "pos_k": (1, M, DP)},
             keyword={"bias": (1, 8)}, params=t5),
        Case("diet-abs", "diet_abs", {**qk, "pos_q": (H, N, DP), "pos_k": (1, M, DP)}),
        Case("diet-abs-1-segment", "diet_abs", {**qk, "pos_q": (1, N, DP), "pos_k": (H, M, DP)},
             keyword={"segment_table": (1, 1, 1)}, segments=1),
        Case("diet-abs-3-segments", "diet_abs", {**qk, "pos_q": (H, N, DP), "pos_k": (H, M, DP)},
             keyword={"segment_table": (H, 3, 3)}, segments=3),
        Case("diet-rel", "diet_rel", {**qk, "rel": (H, 5)}, params={"max_distance": 2}),
        Case("diet-rel-3-segments", "diet_rel", {**qk, "rel": (1, 5)},
             keyword={"segment_table": (1, 3, 3)}, params={"max_distance": 2}, segments=3),
        Case("diet-rel-1-segment", "diet_rel", {**qk, "rel": (H, 3)},
             keyword={"segment_table": (H, 1, 1)}, params={"max_distance": 1}, segments=1),
        Case("relative-bias", "relative_bias", {**qk, "bias": (H, 5)}, params={"max_distance": 2}),
        Case("relative-bias-shared", "relative_bias", {**qk, "bias": (1, 3)},
             params={"max_distance": 1, "query_offset": 2}),
        Case("alibi", "alibi", {**qk, "slopes": (H,)}),
        Case("alibi-shared-offset", "alibi", {**qk, "slopes": (1,)}, params={"query_offset": 3}),
        Case("kerple-log", "kerple", {**qk, "r1": (H,), "r2": (1,)}, positive=True),
        Case("kerple-power", "kerple", {**qk, "r1": (1,), "r2": (H,)},
             params={"kind": "power", "query_offset": 1}, positive=True),
    ]


pytestmark = pytest.mark.usefixtures("one_thread")   # tiny problems (conftest.py)


CASES = _case_list()
CASE_IDS = [case.id for case in CASES]


def make_call(case: Case, rng, dtype=torch.float64, requires_grad=True):
    """(positional tensors, keyword arguments, {float name: tensor}) for `case`."""
    def tensor(shape, name=""):
        values = rng.standard_normal(shape)
        if case.positive and name not in ("q", "k"):   # a kernel's domain: log(1 + r2 x)
            values = 1.0 + 0.5 * np.tanh(values)
        t = torch.from_numpy(values).to(dtype)
        return t.requires_grad_(requires_grad)

    positional = [tensor(shape, name) for name, shape in case.positional.items()]
    floats = dict(zip(case.positional, positional))
    keyword = dict(case.params)
    for name, shape in case.keyword.items():
        keyword[name] = floats[name] = tensor(shape)
    if case.segments:
        keyword["segment_q"] = torch.from_numpy(rng.integers(0, case.segments, (B, N)))
        keyword["segment_k"] = torch.from_numpy(rng.integers(0, case.segments, (B, M)).astype(np.int32))
    return positional, keyword, floats


def run(path: str, method: str, *args, **kwargs):
    with pt.use_native(path == "native"):
        return getattr(pt, method)(*args, **kwargs)


def to_numpy(kwargs: dict) -> dict:
    return {k: v.detach().numpy() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}


# ------------------------------------------------------------------ gradients

def gradient_call(case, path: str, rng):
    """A function of the case's float tensors (in order) calling the method by
    `path`, and those tensors: what gradcheck and gradgradcheck take."""
    _, keyword, floats = make_call(case, rng)
    names = list(floats)

    def call(*values):
        bound = dict(zip(names, values))
        args = [bound[name] for name in case.positional]
        kwargs = {**keyword, **{name: bound[name] for name in case.keyword}}
        return run(path, case.method, *args, **kwargs)

    return call, tuple(floats.values())


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_gradcheck(case, path, rng):
    call, floats = gradient_call(case, path, rng)
    assert torch.autograd.gradcheck(call, floats, eps=1e-6, atol=1e-7)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_gradgradcheck(case, rng):
    """Second derivatives through the C op (create_graph routes the backward
    through the native formula) are right: gradgradcheck in float64."""
    call, floats = gradient_call(case, "c", rng)
    assert torch.autograd.gradgradcheck(call, floats, eps=1e-6, atol=1e-6)


def test_gradient_penalty_keeps_its_second_order_term():
    """A gradient penalty through the C op equals the native path's, term for term
    (it used to lose the penalty's dependence on q: a gradient without a graph)."""
    g = torch.Generator().manual_seed(0)
    results = []
    for path in PATHS:
        q = torch.randn(1, 1, 4, 2, dtype=torch.float64, generator=g).requires_grad_()
        k = torch.randn(1, 1, 4, 2, dtype=torch.float64, generator=g).requires_grad_()
        bias = torch.randn(1, 32, dtype=torch.float64, generator=g).requires_grad_()
        g.manual_seed(0)
        grad_k = torch.autograd.grad(run(path, "t5", q, k, bias).pow(2).sum(), k,
                                     create_graph=True)[0]
        (q.sum() + grad_k.pow(2).sum()).backward()
        results.append((q.grad, k.grad, bias.grad))
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert results[0][0].abs().max() > 10    # the penalty's term, not just d(q.sum())/dq = 1


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_matches_reference(case, path, dtype, rng):
    positional, keyword, floats = make_call(case, rng, dtype)
    result = run(path, case.method, *positional, **keyword)
    arrays = [t.detach().numpy() for t in positional]
    want = getattr(ref, case.method)(*arrays, **to_numpy(keyword))
    tol = 1e-12 if dtype == torch.float64 else 2e-5
    assert result.dtype == dtype and result.shape == (B, H, N, M)
    np.testing.assert_allclose(result.detach().numpy(), want, rtol=tol, atol=tol)

    G = torch.from_numpy(rng.standard_normal((B, H, N, M))).to(dtype)
    grads = torch.autograd.grad(result, list(floats.values()), G)
    want_grads = getattr(ref, case.method + "_backward")(G.numpy(), *arrays, **to_numpy(keyword))
    for name, grad in zip(floats, grads):
        assert grad.shape == floats[name].shape, name
        np.testing.assert_allclose(grad.numpy(), getattr(want_grads, name), rtol=tol, atol=tol,
                                   err_msg=name)


def _subsets(case):
    """Some proper subsets of the float inputs: q alone, the parameters alone, every other one."""
    names = list(case.positional) + list(case.keyword)
    return [names[:1], names[2:] or names[1:2], names[1::2]]


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_no_gradient_unless_required(case, rng, monkeypatch):
    asked = []
    original = _methods.backward

    def spy(problem, G, fields=None, config=None):
        names = GRAD_FIELDS[problem.method]
        asked.append(tuple(name for bit, name in enumerate(names) if fields >> bit & 1))
        return original(problem, G, fields, config)

    monkeypatch.setattr(_methods, "backward", spy)
    for subset in _subsets(case):
        for path in PATHS:
            positional, keyword, floats = make_call(case, rng, requires_grad=False)
            for name in subset:
                floats[name].requires_grad_(True)
            asked.clear()
            run(path, case.method, *positional, **keyword).sum().backward()
            for name, tensor in floats.items():
                assert (tensor.grad is not None) == (name in subset), (path, name)
            if path == "c":   # one C call, asked for exactly the required fields
                assert len(asked) == 1 and set(asked[0]) == set(subset), (asked, subset)
            else:
                assert asked == []
    # nothing requires grad: no graph, no backward call
    positional, keyword, _ = make_call(case, rng, requires_grad=False)
    assert not run("c", case.method, *positional, **keyword).requires_grad


OPCHECK_CASES = ["content-scale", "shaw-shared", "t5-shared-unidirectional", "m2-per-head",
                 "m4-per-head", "m4m-shared", "deberta-log-buckets", "tupe-r-theta-shared",
                 "diet-abs-3-segments", "diet-rel-3-segments"]


@pytest.mark.parametrize("case", [c for c in CASES if c.id in OPCHECK_CASES], ids=OPCHECK_CASES)
def test_opcheck(case, rng):
    """torch.library.opcheck: schema, fake kernel, autograd registration, AOT dispatch."""
    positional, keyword, _ = make_call(case, rng)
    public = inspect.signature(getattr(pt, case.method)).parameters
    given = {**dict(zip(case.positional, positional)), **keyword}
    tensors = [given.get(name) for name in _ops.tensor_names(case.method)]
    params = [given.get(name, public[name].default) for name, _ in _ops.PARAMS[case.method]]
    torch.library.opcheck(_ops.FORWARD[case.method], (*tensors, *params))
    G = torch.from_numpy(rng.standard_normal((B, H, N, M)))
    detached = [None if t is None else t.detach() for t in tensors]
    for needs in (1, (1 << len(GRAD_FIELDS[case.method])) - 1):
        torch.library.opcheck(_ops.BACKWARD[case.method], (G, *detached, *params, needs),
                              test_utils=("test_schema", "test_faketensor",
                                          "test_aot_dispatch_dynamic"))


# ------------------------------------------------------------------ other inputs

@pytest.mark.parametrize("path", PATHS)
def test_strided_inputs(path, rng):
    """q, k as (B, H, n, d) views of (B, n, H, d) buffers: no copy needed, same result."""
    buffer_q = torch.from_numpy(rng.standard_normal((B, N, H, D)))
    buffer_k = torch.from_numpy(rng.standard_normal((B, M, H, D)))
    rel = torch.from_numpy(rng.standard_normal((2 * H, 5, D)))[::2]      # head axis stride 2
    q, k = buffer_q.transpose(1, 2), buffer_k.transpose(1, 2)
    assert not q.is_contiguous()
    got = run(path, "m4", q, k, rel, max_distance=2)
    want = ref.m4(q.numpy(), k.numpy(), rel.numpy(), max_distance=2)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12)
    assert got.is_contiguous()


@pytest.mark.parametrize("path", PATHS)
def test_empty_sizes(path):
    q = torch.zeros(2, 2, 0, 3, dtype=torch.float64, requires_grad=True)
    k = torch.zeros(2, 2, 4, 3, dtype=torch.float64, requires_grad=True)
    bias = torch.zeros(2, 8, dtype=torch.float64, requires_grad=True)
    out = run(path, "t5", q, k, bias, num_buckets=8, max_distance=6)
    assert out.shape == (2, 2, 0, 4)
    out.sum().backward()
    assert q.grad.shape == q.shape and float(bias.grad.abs().sum()) == 0.0


def test_other_devices_take_native_path(monkeypatch):
    """A non-CPU tensor (here "meta", standing in for CUDA/MPS) never reaches the C ops."""
    def no_c(*args, **kwargs):
        raise AssertionError("the C kernels ran")

    monkeypatch.setattr(_methods, "forward", no_c)
    monkeypatch.setattr(_methods, "backward", no_c)
    q = torch.empty(2, 2, 5, 3, device="meta", requires_grad=True)
    k = torch.empty(2, 2, 4, 3, device="meta")
    segments = torch.zeros(2, 5, dtype=torch.long, device="meta")
    out = pt.diet_rel(q, k, torch.empty(1, 5, device="meta"), max_distance=2, segment_q=segments,
                      segment_k=segments[:, :4], segment_table=torch.empty(2, 3, 3, device="meta"))
    out = out + pt.deberta(q, k, torch.empty(2, 6, 3, device="meta"),
                           torch.empty(1, 6, 3, device="meta"), att_span=3)
    assert out.shape == (2, 2, 5, 4) and out.device.type == "meta"
    out.sum().backward()
    assert q.grad.shape == q.shape
    with pytest.raises(ValueError, match="share one device"):
        pt.content(q, torch.zeros(2, 2, 4, 3))


def test_bucket_maps_at_length(rng):
    """Longer sequences reach the log buckets: native (NumPy-built index) equals C."""
    n = m = 40
    q = torch.from_numpy(rng.standard_normal((1, 2, n, 4)))
    k = torch.from_numpy(rng.standard_normal((1, 2, m, 4)))
    table = torch.from_numpy(rng.standard_normal((2, 24, 4)))
    calls = [("t5", (q, k, table[:, :, 0]), {"num_buckets": 24, "max_distance": 30}),
             ("t5", (q, k, table[:, :16, 0]), {"num_buckets": 16, "max_distance": 20,
                                               "bidirectional": False}),
             ("deberta", (q, k, table, table.flip(0)),
              {"att_span": 12, "position_buckets": 12, "max_relative_positions": 32}),
             ("diet_rel", (q, k, table[:, :21, 1]), {"max_distance": 10})]
    for method, args, kwargs in calls:
        np.testing.assert_allclose(run("native", method, *args, **kwargs).numpy(),
                                   run("c", method, *args, **kwargs).numpy(),
                                   rtol=1e-12, atol=1e-12, err_msg=method)


def test_half_precision_both_paths():
    """bfloat16 and float16 on the C kernels (issue 16) and on the native formula;
    tests/test_torch_low_precision.py checks the C path's bounds."""
    for dtype in (torch.bfloat16, torch.float16):
        q = torch.randn(1, 2, 5, 4, dtype=dtype)
        bias = torch.randn(2, 32, dtype=dtype)
        want = run("native", "t5", q.float(), q.float(), bias.float())
        c_path = dtype == torch.float16 or importlib.util.find_spec("ml_dtypes") is not None
        for path in ("c", "native") if c_path else ("native",):
            got = run(path, "t5", q, q, bias)
            assert got.dtype == dtype
            torch.testing.assert_close(got.float(), want, rtol=0.05, atol=0.1)


_BAD_CALLS = [
    ("shaw: table rows", "shaw", lambda q, k: ((q, k, torch.zeros(1, 4, 3)), {"max_distance": 2})),
    ("mixed dtypes", "content", lambda q, k: ((q, k.double()), {})),
    ("int q", "content", lambda q, k: ((q.int(), k.int()), {})),
    ("float max_distance", "m2", lambda q, k: ((q, k, torch.zeros(1, 5)), {"max_distance": 2.0})),
    ("degenerate t5", "t5", lambda q, k: ((q, k, torch.zeros(1, 3)), {"num_buckets": 3})),
    ("theta shape", "tupe", lambda q, k: ((q, k, torch.zeros(1, 5, 2), torch.zeros(1, 4, 2)),
                                          {"theta": torch.zeros(1, 3)})),
    ("partial segments", "diet_rel", lambda q, k: ((q, k, torch.zeros(1, 5)), {
        "max_distance": 2, "segment_q": torch.zeros(2, 5, dtype=torch.long),
        "segment_table": torch.zeros(1, 2, 2)})),
    ("segment id range", "diet_abs", lambda q, k: ((q, k, torch.zeros(1, 5, 2), torch.zeros(1, 4, 2)), {
        "segment_q": torch.zeros(2, 5, dtype=torch.long), "segment_k": torch.full((2, 4), 2),
        "segment_table": torch.zeros(1, 2, 2)})),
    ("float segment ids", "diet_abs", lambda q, k: ((q, k, torch.zeros(1, 5, 2), torch.zeros(1, 4, 2)), {
        "segment_q": torch.zeros(2, 5), "segment_k": torch.zeros(2, 4),
        "segment_table": torch.zeros(1, 2, 2)})),
]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("label, method, make", _BAD_CALLS, ids=[c[0] for c in _BAD_CALLS])
def test_errors_match_posenc(label, method, make, path):
    """The same exception type (and message start) as posenc.<name> on the same input."""
    args, kwargs = make(torch.zeros(2, 2, 5, 3), torch.zeros(2, 2, 4, 3))
    with pytest.raises((TypeError, ValueError)) as expected:
        getattr(posenc, method)(*[a.numpy() for a in args], **to_numpy(kwargs))
    with pytest.raises(expected.type) as got:
        run(path, method, *args, **kwargs)
    assert str(got.value).split(" ")[0] == str(expected.value).split(" ")[0]
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        run(path, method, args[0].numpy(), *args[1:], **kwargs)


# ------------------------------------------------------------------ modules

def _qk(rng, n=N, m=M, d=4, heads=H, dtype=torch.float64):
    q = torch.from_numpy(rng.standard_normal((B, heads, n, d))).to(dtype)
    k = torch.from_numpy(rng.standard_normal((B, heads, m, d))).to(dtype)
    return q, k


def _segments(n=N, m=M):
    return torch.tensor([[0, 0, 1, 1, 1], [0, 1, 1, 1, 1]])[:, :n], torch.tensor([[0, 1, 1, 1], [0, 0, 0, 1]])[:, :m]


class _Sandwich(torch.nn.Module):
    """A learned function of the offset (Sandwich-like: a sum of cosines of it)."""

    def __init__(self, heads):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(heads, 3))
        self.frequency = torch.nn.Parameter(torch.rand(3))

    def forward(self, offsets):
        return (self.weight[:, :, None] * torch.cos(self.frequency[:, None] * offsets)).sum(1)


def _heads(x, d):
    return x.view(x.shape[0], -1, d).transpose(0, 1)


def _module_cases():
    """(id, module factory, functional twin of module.logits(q, k, segments))."""
    sq, sk = _segments()
    cases = [
        ("t5", lambda: pnn.T5RelativeBias(H, num_buckets=8, max_distance=6),
         lambda mod, q, k: pt.t5(q, k, mod.bias, num_buckets=8, max_distance=6)),
        ("shaw", lambda: pnn.ShawRelative(H, 4, 2),
         lambda mod, q, k: pt.shaw(q, k, mod.rel, max_distance=2)),
        ("m2-per-head", lambda: pnn.M2Relative(H, 2, per_head=True),
         lambda mod, q, k: pt.m2(q, k, mod.rel, max_distance=2)),
        ("m4", lambda: pnn.M4Relative(H, 4, 2),
         lambda mod, q, k: pt.m4(q, k, mod.rel, max_distance=2)),
        ("m4m-per-head", lambda: pnn.M4MRelative(H, 4, 2, per_head=True),
         lambda mod, q, k: pt.m4m(q, k, mod.rel, max_distance=2)),
        ("deberta", lambda: pnn.DebertaRelative(8, H, max_relative_positions=3),
         lambda mod, q, k: pt.deberta(
             q, k, _heads(mod.pos_key_proj(mod.embeddings.norm(mod.embeddings.weight)), 4),
             _heads(mod.pos_query_proj(mod.embeddings.norm(mod.embeddings.weight)), 4), att_span=3)),
        ("deberta-log-no-norm", lambda: pnn.DebertaRelative(
            8, H, position_buckets=4, max_relative_positions=8, layer_norm=False),
         lambda mod, q, k: pt.deberta(
             q, k, _heads(mod.pos_key_proj(mod.embeddings.weight), 4),
             _heads(mod.pos_query_proj(mod.embeddings.weight), 4), att_span=4,
             position_buckets=4, max_relative_positions=8)),
        ("tupe-a", lambda: pnn.TUPE(8, H, 6), None),
        ("tupe-r", lambda: pnn.TUPE(8, H, 6, relative=True, num_buckets=8, max_distance=6), None),
        ("tupe-no-reset", lambda: pnn.TUPE(8, H, 6, reset_cls=False), None),
        ("diet-abs-segments", lambda: pnn.DIETAbs(H, 6, 3, num_segments=2),
         lambda mod, q, k: pt.diet_abs(q, k, mod.pos_q[:, :N], mod.pos_k[:, :M], segment_q=sq,
                                       segment_k=sk, segment_table=mod.segments.table)),
        ("diet-abs-head-shared", lambda: pnn.DIETAbs(H, 6, 3, per_head=False),
         lambda mod, q, k: pt.diet_abs(q, k, mod.pos_q[:, :N], mod.pos_k[:, :M])),
        ("diet-rel-segments", lambda: pnn.DIETRel(H, 2, num_segments=2),
         lambda mod, q, k: pt.diet_rel(q, k, mod.rel, max_distance=2, segment_q=sq, segment_k=sk,
                                       segment_table=mod.segments.table)),
        ("segment-attention", lambda: pnn.SegmentAttention(H, 2, per_head=False),
         lambda mod, q, k: pt.diet_abs(q, k, torch.zeros(1, N, 0, dtype=q.dtype),
                                       torch.zeros(1, M, 0, dtype=q.dtype), segment_q=sq,
                                       segment_k=sk, segment_table=mod.table)),
        ("content", lambda: pnn.Content(H), lambda mod, q, k: pt.content(q, k)),
        ("relative-bias-table", lambda: pnn.RelativeBias(H, 2),
         lambda mod, q, k: pt.relative_bias(q, k, mod.table, max_distance=2)),
        ("relative-bias-fn", lambda: pnn.RelativeBias(H, 3, bias_fn=_Sandwich(H)),
         lambda mod, q, k: pt.relative_bias(
             q, k, mod.bias_fn(torch.arange(-3, 4, dtype=q.dtype)), max_distance=3)),
        ("alibi-learnable", lambda: pnn.ALiBi(H, learnable=True),
         lambda mod, q, k: pt.alibi(q, k, mod.log_slopes.exp())),
        ("kerple-power", lambda: pnn.KERPLE(H, "power"),
         lambda mod, q, k: pt.kerple(q, k, mod.log_r1.exp(), mod.log_r2.exp(), kind="power")),
        ("rotary-partial", lambda: pnn.RotaryEmbedding(H, 4, rotary_dim=2),
         lambda mod, q, k: pt.rope(q, k, *(torch.from_numpy(t) for t in posenc.rope_tables(
             2048, 2, dtype=np.float64)))),
    ]
    return cases


MODULE_CASES = _module_cases()
MODULE_IDS = [c[0] for c in MODULE_CASES]


def _tupe_twin(mod, q, k):
    """TUPE eq. (10)/(11) with theta from the two vectors of §3.3, on the module's parameters."""
    s = 1 / math.sqrt(2 * q.shape[-1])
    norm = lambda x: torch.nn.functional.layer_norm(x, (x.shape[-1],), mod.norm.weight, mod.norm.bias)
    p = norm(mod.positions)
    pos_q, pos_k = _heads(mod.query_proj(p), 4), _heads(mod.key_proj(p), 4)
    theta = None
    if mod.reset_cls:
        pt_ = norm(mod.theta_vectors)
        theta = (_heads(mod.query_proj(pt_), 4) * _heads(mod.key_proj(pt_), 4)).sum(-1) * s
    return pt.tupe(q, k, pos_q[:, :q.shape[2]], pos_k[:, :k.shape[2]], bias=mod.bias, theta=theta,
                   num_buckets=mod.num_buckets, max_distance=mod.max_distance)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("label, factory, twin", MODULE_CASES, ids=MODULE_IDS)
def test_module_equals_functional(label, factory, twin, path, rng):
    torch.manual_seed(0)
    module = factory().double()
    twin = twin or _tupe_twin
    q, k = _qk(rng)
    sq, sk = _segments()
    with pt.use_native(path == "native"):
        got = module(q, k, segment_q=sq, segment_k=sk)
        want = twin(module, q, k)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        state = module.positional(N, M)
        if state is not None:          # the shared-state route gives the same logits
            torch.testing.assert_close(module(q, k, state=state, segment_q=sq, segment_k=sk), want,
                                       rtol=1e-12, atol=1e-12)
        if got.requires_grad:         # every parameter takes part
            got.sum().backward()
    assert all(p.grad is not None for p in module.parameters())


@pytest.mark.parametrize("label, factory, twin", MODULE_CASES, ids=MODULE_IDS)
def test_attention_layer_gradgradcheck(label, factory, twin, rng):
    """Second derivatives of a whole PositionalSelfAttention layer in the input
    (as a gradient penalty takes them) on the C path, float64."""
    torch.manual_seed(0)
    encoding = factory().double()
    if encoding.projects_keys:
        pytest.skip("Linformer keys are covered by test_linformer_and_attention_layer")
    layer = pnn.PositionalSelfAttention(8, H, encoding).double().eval()
    n = encoding.max_len if hasattr(encoding, "max_len") else N
    x = torch.from_numpy(rng.standard_normal((1, n, 8))).requires_grad_()
    segments = torch.zeros(1, n, dtype=torch.long)
    assert torch.autograd.gradgradcheck(lambda x: layer(x, segment_ids=segments), (x,),
                                        eps=1e-6, atol=1e-5)


def test_diet_abs_cache_in_eval(rng):
    module = pnn.DIETAbs(H, 6, 3).double()
    q, k = _qk(rng)
    want = module(q, k)
    module.eval()
    with torch.no_grad():
        first = module.positional(N, M)
        assert module.positional(N, M) is first           # cached
        torch.testing.assert_close(module(q, k), want.detach(), rtol=1e-12, atol=1e-12)
        module.pos_q.add_(1.0)                            # a changed parameter invalidates it
        assert module.positional(N, M) is not first
    module.train()
    assert module._cache is None


def test_linformer_and_attention_layer(rng):
    """DIET-ABS^LIN projects keys and values to k rows; the layer matches a hand-written one."""
    torch.manual_seed(0)
    x = torch.from_numpy(rng.standard_normal((B, 6, 8)))
    mask = torch.zeros(B, 6, dtype=torch.bool)
    mask[1, -2:] = True
    for encoding in (None, pnn.DIETAbs(H, 6, 3, linformer_k=3)):
        layer = pnn.PositionalSelfAttention(8, H, encoding).double().eval()
        heads = lambda t: t.view(B, 6, H, 4).transpose(1, 2)
        q, k, v = heads(layer.q_proj(x)), heads(layer.k_proj(x)), heads(layer.v_proj(x))
        if encoding is None:
            logits = q @ k.transpose(-1, -2) / 2.0
            logits = logits.masked_fill(mask[:, None, None, :], torch.finfo(logits.dtype).min)
        else:
            keep = (~mask)[:, None, :, None].double()
            k, v = torch.einsum("kn,bhnd->bhkd", encoding.E, k * keep), \
                torch.einsum("kn,bhnd->bhkd", encoding.E, v * keep)
            logits = q @ k.transpose(-1, -2) / 2.0 + encoding.pos_q @ encoding.pos_k.transpose(-1, -2)
        out = (torch.softmax(logits, -1) @ v).transpose(1, 2).reshape(B, 6, 8)
        torch.testing.assert_close(layer(x, key_padding_mask=mask), layer.out_proj(out),
                                   rtol=1e-12, atol=1e-12)


def _all_modules():
    yield from (factory() for _, factory, _ in MODULE_CASES)
    yield pnn.DIETAbs(H, 6, 3, linformer_k=2, share_kv=False)
    yield pnn.DebertaRelative(8, H, max_relative_positions=3, share_att_key=True)
    yield pnn.PositionalSelfAttention(8, H, pnn.TUPE(8, H, 6, relative=True))


def test_state_dict_round_trip(rng):
    torch.manual_seed(1)
    sources = list(_all_modules())
    torch.manual_seed(2)
    targets = list(_all_modules())
    q, k = _qk(rng, dtype=torch.float32)
    sq, sk = _segments()
    for source, target in zip(sources, targets):
        state = source.state_dict()
        # no state: plain attention, and the rotation (its tables come from its arguments)
        assert state or isinstance(source, (pnn.Content, pnn.RotaryEmbedding)), \
            type(source).__name__
        target.load_state_dict(state)
        for name, value in target.state_dict().items():
            assert torch.equal(value, state[name]), (type(source).__name__, name)
        if isinstance(source, pnn.PositionalSelfAttention):
            x = torch.randn(B, 5, 8)
            torch.testing.assert_close(target(x), source(x))
        elif not source.uses_attention_projections:
            keys = k[:, :, :source.linformer_k] if getattr(source, "linformer_k", None) else k
            torch.testing.assert_close(target(q, keys, segment_q=sq, segment_k=sk),
                                       source(q, keys, segment_q=sq, segment_k=sk))


# ------------------------------------------------------------------ torch.compile

class _Model(torch.nn.Module):
    """Attention layers around the given encodings; TUPE shared by two layers
    with its positional correlation computed once per forward."""

    def __init__(self, n, every_op: bool):
        super().__init__()
        d, h = 16, 2
        self.tupe = pnn.TUPE(d, h, n, relative=True, num_buckets=8, max_distance=n)
        encodings = [self.tupe, self.tupe, pnn.DIETRel(h, 3, num_segments=2)]
        if every_op:
            encodings += [None, pnn.ShawRelative(h, 8, 3), pnn.T5RelativeBias(h, 8, n),
                          pnn.M2Relative(h, 3), pnn.M4Relative(h, 8, 3), pnn.M4MRelative(h, 8, 3),
                          pnn.DIETAbs(h, n, 4, num_segments=2), pnn.TUPE(d, h, n),
                          pnn.DebertaRelative(d, h, position_buckets=4, max_relative_positions=n,
                                              share_att_key=True),
                          pnn.RelativeBias(h, 3), pnn.ALiBi(h, learnable=True),
                          pnn.KERPLE(h, "power"), pnn.RotaryEmbedding(h, d // h, rotary_dim=4)]
        self.layers = torch.nn.ModuleList(pnn.PositionalSelfAttention(d, h, e) for e in encodings)

    def forward(self, x, mask, segments):
        n = x.shape[1]
        tupe_state = self.tupe.positional(n, n)
        for layer in self.layers:
            state = tupe_state if layer.encoding is self.tupe else None
            x = x + layer(x, key_padding_mask=mask, segment_ids=segments, state=state)
        return x


@pytest.fixture(scope="module")
def inductor():
    """Skip unless inductor finds a C++ compiler (it needs one to build CPU kernels)."""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler
        compiler = get_cpp_compiler()
    except Exception as error:  # noqa: BLE001  (any failure means: no usable toolchain)
        pytest.skip(f"torch.compile's inductor has no C++ compiler here: {error}")
    if shutil.which(compiler) is None:
        pytest.skip(f"torch.compile's inductor has no C++ compiler here ({compiler!r} not found)")


def _compile_and_compare(backend, native, every_op):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = _Model(8, every_op)
    x = torch.randn(2, 8, 16)
    mask = torch.zeros(2, 8, dtype=torch.bool)
    mask[0, -3:] = True
    segments = torch.tensor([[0] * 4 + [1] * 4, [0] * 6 + [1] * 2])
    with pt.use_native(native):
        eager = model(x, mask, segments)
        eager_grads = torch.autograd.grad(eager.square().sum(), list(model.parameters()))
        compiled = torch.compile(model, fullgraph=True, backend=backend)
        result = compiled(x, mask, segments)
        grads = torch.autograd.grad(result.square().sum(), list(model.parameters()))
    torch.testing.assert_close(result, eager, rtol=1e-4, atol=1e-4)
    for got, want in zip(grads, eager_grads):
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)


def test_compile_fullgraph_inductor(inductor):
    """A small model on the C custom ops, compiled by inductor: no graph break, same
    values and gradients as eager."""
    _compile_and_compare("inductor", native=False, every_op=False)


@pytest.mark.parametrize("path", PATHS)
def test_compile_fullgraph_every_op(path):
    """Every op traces without a graph break on both paths, forward and backward
    (aot_eager: the fake kernels and autograd formulas, without inductor's codegen)."""
    _compile_and_compare("aot_eager", native=path == "native", every_op=True)


# ------------------------------------------------------------------ example

def test_train_tiny_quick(capsys):
    spec = importlib.util.spec_from_file_location("train_tiny", ROOT / "examples" / "train_tiny.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--quick"]) == 0
    out = capsys.readouterr().out
    for name in ("t5", "shaw", "m2", "m4m", "deberta", "tupe", "diet_abs", "diet_rel"):
        assert name in out
