"""Bad input raises TypeError / ValueError naming the argument and what was
expected and received (SPEC §5), for every public function, as a table of
(function, case, exception, message fragments).  posenc and posenc.reference
raise the same exception for the same input."""


import numpy as np
import pytest

import posenc
from posenc import reference
from posenc._examples import METHODS, float_inputs, key_count, make_inputs, with_inputs
from posenc._registry import GRAD_FIELDS, REGISTRY

B, H, N, M, D = 2, 3, 5, 4, 3


def _keys(method):
    """M, or N for a method whose queries are among the keys (fox)."""
    return key_count(method, N, M)


def _valid(method):
    return make_inputs(method, B, H, N, _keys(method), D, rng=np.random.default_rng(0))


def _mutations(method):
    """(case name, function(args, kwargs) -> (args, kwargs), exception, fragments)."""
    cases = []
    add = cases.append

    def set_arg(name, value):
        def apply(args, kw):
            return with_inputs(method, args, kw, {name: value(float_inputs(method, args, kw)[name])})
        return apply

    def set_kw(name, value):
        def apply(args, kw):
            kw = dict(kw)
            kw[name] = value(kw.get(name))
            return args, kw
        return apply

    def drop_kw(name):
        def apply(args, kw):
            kw = dict(kw)
            kw.pop(name)
            return args, kw
        return apply

    for name in ("q", "k"):
        add((f"{name} list", set_arg(name, lambda v: v.tolist()), TypeError, [name, "numpy.ndarray", "list"]))
        add((f"{name} int", set_arg(name, lambda v: v.astype(np.int64)), TypeError, [name, "int64"]))
        add((f"{name} object", set_arg(name, lambda v: v.astype(object)), TypeError, [name, "object"]))
        add((f"{name} float16", set_arg(name, lambda v: v.astype(np.float16)), TypeError, [name, "float16"]))
        add((f"{name} rank 3", set_arg(name, lambda v: v[0]), ValueError, [name, "dimensions", "got shape"]))
        add((f"{name} rank 5", set_arg(name, lambda v: v[None]), ValueError, [name, "dimensions"]))
    add(("k float32 vs q float64", set_arg("k", lambda v: v.astype(np.float32)), TypeError,
         ["k", "float32", "q", "float64"]))
    m = _keys(method)
    add(("k batch", set_arg("k", lambda v: np.concatenate([v, v])), ValueError, ["k", "(2, 3, m, 3)", f"(4, 3, {m}, 3)"]))
    add(("k heads", set_arg("k", lambda v: v[:, :2]), ValueError, ["k", f"(2, 2, {m}, 3)"]))
    add(("k depth", set_arg("k", lambda v: v[..., :2]), ValueError, ["k", f"(2, 3, {m}, 2)"]))

    params = [f for f in GRAD_FIELDS[method] if f not in ("q", "k", "segment_table")]
    given = float_inputs(method, *_valid(method))
    def heads(name, count):
        """The parameter with `count` heads on its head axis (a head repeated)."""
        at = REGISTRY[method].head_axis(name)
        value = given[name]
        shape = list(value.shape)
        shape[at] = count
        repeat = lambda v: np.take(v, [t % v.shape[at] for t in range(count)], axis=at)
        return repeat, f"got {tuple(shape)}"

    for name in params:

        if name not in given:      # an optional table not given by the examples (xPos's)
            continue
        add((f"{name} int", set_arg(name, lambda v: v.astype(np.int32)), TypeError, [name, "int32"]))
        add((f"{name} float32", set_arg(name, lambda v: v.astype(np.float32)), TypeError, [name, "float32"]))
        add((f"{name} not array", set_arg(name, lambda v: 1.5), TypeError, [name, "numpy.ndarray"]))
        add((f"{name} rank", set_arg(name, lambda v: v[None]), ValueError, [name, "got"]))
        if name not in REGISTRY[method].constant:     # a head axis H or 1
            two, two_shape = heads(name, 2)
            four, four_shape = heads(name, 4)
            add((f"{name} heads 2", set_arg(name, two), ValueError, [name, "H|1", two_shape]))
            add((f"{name} heads 4", set_arg(name, four), ValueError, [name, four_shape]))
        if given[name].ndim >= 2 and name != "pos_emb":    # CoPE's P rows are the caller's
            add((f"{name} rows", set_arg(name, lambda v: v[:, :-1]), ValueError, [name, "got"]))
        if name in ("rel_k", "pos_key", "pos_query", "pos_emb"):
            add((f"{name} depth", set_arg(name, lambda v: v[..., :-1]), ValueError, [name, "got"]))
        if name == "theta":
            add(("theta (H, 3)", set_arg(name, lambda v: np.concatenate([v, v[:, :1]], 1)), ValueError,
                 ["theta", "(H|1, 2)", "got (3, 3)"]))

    if "max_distance" in _valid(method)[1]:
        add(("max_distance -1", set_kw("max_distance", lambda v: -1), ValueError, ["max_distance", "-1"]))
        add(("max_distance float", set_kw("max_distance", lambda v: 2.0), TypeError, ["max_distance", "float"]))
        add(("max_distance bool", set_kw("max_distance", lambda v: True), TypeError, ["max_distance", "bool"]))
        add(("max_distance str", set_kw("max_distance", lambda v: "4"), TypeError, ["max_distance", "str"]))
    if method in ("t5",) or (method == "tupe"):
        add(("num_buckets 1", set_kw("num_buckets", lambda v: 1), ValueError, ["num_buckets", "1"]))
        add(("num_buckets float", set_kw("num_buckets", lambda v: 16.0), TypeError, ["num_buckets", "float"]))
        add(("bidirectional int", set_kw("bidirectional", lambda v: 1), TypeError, ["bidirectional", "bool"]))
        add(("max_distance <= max_exact", set_kw("max_distance", lambda v: 2), ValueError, ["max_distance"]))
    if method == "deberta":
        add(("att_span 0", set_kw("att_span", lambda v: 0), ValueError, ["att_span", "0"]))
        add(("att_span float", set_kw("att_span", lambda v: 8.0), TypeError, ["att_span", "float"]))
        add(("position_buckets 1", set_kw("position_buckets", lambda v: 1), ValueError, ["bucket_size"]))
        add(("max_relative_positions degenerate", set_kw("max_relative_positions", lambda v: 5), ValueError,
             ["max_position"]))
    if method in ("diet_abs", "diet_rel"):
        add(("segment_k missing", drop_kw("segment_k"), ValueError, ["segment_k", "all three"]))
        add(("segment_table missing", drop_kw("segment_table"), ValueError, ["segment_table"]))
        add(("segment id negative", set_kw("segment_q", lambda v: v - 1), ValueError, ["segment_q", "-1", "[0, 3)"]))
        add(("segment id too large", set_kw("segment_k", lambda v: v + 3), ValueError, ["segment_k", "[0, 3)"]))
        add(("segment ids float", set_kw("segment_q", lambda v: v.astype(float)), TypeError, ["segment_q", "float64"]))
        add(("segment_q shape", set_kw("segment_q", lambda v: v[:, :-1]), ValueError, ["segment_q", "(2, 5)", "(2, 4)"]))
        add(("segment_k batch", set_kw("segment_k", lambda v: v[:1]), ValueError, ["segment_k", "(2, 4)", "(1, 4)"]))
        add(("segment_table not square", set_kw("segment_table", lambda v: v[:, :, :2]), ValueError,
             ["segment_table", "(3, 3, 2)"]))
        add(("segment_table heads 2", set_kw("segment_table", lambda v: v[:2]), ValueError, ["segment_table", "H|1"]))
        add(("segment_table int", set_kw("segment_table", lambda v: v.astype(np.int64)), TypeError,
             ["segment_table", "int64"]))
    add(("scale str", set_kw("scale", lambda v: "0.5"), TypeError, ["scale", "str"]))
    return cases


FORWARD_CASES = [(method, *case) for method in METHODS for case in _mutations(method)]


@pytest.mark.parametrize("method,case,mutate,exc,fragments", FORWARD_CASES,
                         ids=[f"{c[0]}-{c[1]}" for c in FORWARD_CASES])
def test_forward_errors(method, case, mutate, exc, fragments):
    args, kw = mutate(*_valid(method))
    for module in (posenc, reference):
        with pytest.raises(exc) as info:
            getattr(module, method)(*args, **kw)
        for fragment in fragments:
            assert fragment in str(info.value), f"{module.__name__}.{method}: {info.value!r} lacks {fragment!r}"


@pytest.mark.parametrize("method,case,mutate,exc,fragments", FORWARD_CASES,
                         ids=[f"{c[0]}-{c[1]}" for c in FORWARD_CASES])
def test_backward_errors(method, case, mutate, exc, fragments):
    args, kw = mutate(*_valid(method))
    G = np.zeros((B, H, N, M))
    for module in (posenc, reference):
        with pytest.raises(exc) as info:
            getattr(module, method + "_backward")(G, *args, **kw)
        for fragment in fragments:
            assert fragment in str(info.value)


def _out_cases(M=M):
    base = np.zeros((B, H, N, M))
    return [
        ("wrong shape", lambda a, k: np.zeros((B, H, N + 1, M)), ValueError,
         ["out", f"(2, 3, 5, {M})", f"(2, 3, 6, {M})"]),
        ("wrong dtype", lambda a, k: np.zeros((B, H, N, M), np.float32), TypeError, ["out", "float64", "float32"]),
        ("int dtype", lambda a, k: np.zeros((B, H, N, M), np.int64), TypeError, ["out", "int64"]),
        ("non-contiguous", lambda a, k: np.zeros((B, H, N, 2 * M))[..., ::2], ValueError, ["out", "C-contiguous"]),
        ("Fortran order", lambda a, k: np.asfortranarray(base.copy()), ValueError, ["out", "C-contiguous"]),
        ("read-only", lambda a, k: np.lib.stride_tricks.as_strided(base.copy(), writeable=False), ValueError,
         ["out", "writeable"]),
        ("aliases q", lambda a, k: a[0].reshape(-1)[: B * H * N * M].reshape(B, H, N, M) if a[0].size >= B * H * N * M else None,
         ValueError, ["out", "overlap", "q"]),
        ("not an array", lambda a, k: [[0.0]], TypeError, ["out", "numpy.ndarray"]),
    ]


OUT_CASES = [(method, *case) for method in METHODS for case in _out_cases(_keys(method))]


@pytest.mark.parametrize("method,case,make_out,exc,fragments", OUT_CASES,
                         ids=[f"{c[0]}-{c[1]}" for c in OUT_CASES])
def test_out_errors(method, case, make_out, exc, fragments):
    args, kw = _valid(method)
    M = _keys(method)
    if case == "aliases q":   # a q buffer large enough to hold the logits too
        big = np.zeros((B, H, N, M * D))
        args = [big[..., :D].copy(), args[1]] + list(args[2:])
        buffer = np.zeros(B * H * N * M * 2)
        q_view = buffer[: B * H * N * D].reshape(B, H, N, D)
        args[0] = q_view
        out = buffer[: B * H * N * M].reshape(B, H, N, M)
    else:
        out = make_out(args, kw)
    for module in (posenc, reference):
        with pytest.raises(exc) as info:
            getattr(module, method)(*args, out=out, **kw)
        for fragment in fragments:
            assert fragment in str(info.value), f"{info.value!r} lacks {fragment!r}"


@pytest.mark.parametrize("method", METHODS)
def test_grad_errors(method):
    args, kw = _valid(method)
    M = _keys(method)
    cases = [
        (np.zeros((B, H, N + 1, M)), ValueError, ["G", f"(2, 3, 5, {M})", f"got (2, 3, 6, {M})"]),
        (np.zeros((B, H, N, M), np.float32), TypeError, ["G", "float32"]),
        (np.zeros((B, H, N, M), np.int32), TypeError, ["G", "int32"]),
        (np.zeros((H, N, M)), ValueError, ["G", "4 dimensions", f"got shape (3, 5, {M})"]),
        ([0.0], TypeError, ["G", "numpy.ndarray"]),
    ]
    for G, exc, fragments in cases:
        for module in (posenc, reference):
            with pytest.raises(exc) as info:
                getattr(module, method + "_backward")(G, *args, **kw)
            for fragment in fragments:
                assert fragment in str(info.value)


def test_isa_errors():
    with pytest.raises(ValueError) as info:
        posenc.set_isa("sse9")
    assert "sse9" in str(info.value) and "scalar" in str(info.value)
    missing = [isa for isa in ("avx2", "avx512", "neon") if isa not in posenc.capabilities()]
    if missing:
        with pytest.raises(ValueError) as info:
            posenc.set_isa(missing[0])
        assert "unsupported" in str(info.value)
    with pytest.raises(TypeError):
        posenc.set_isa(3)
    with pytest.raises(ValueError):
        posenc.set_num_threads(0)
    with pytest.raises(TypeError):
        posenc.set_num_threads(2.0)


def test_case_count():
    """The table is what the closing note counts; keep it from shrinking unnoticed."""
    total = 2 * len(FORWARD_CASES) + len(OUT_CASES) + 5 * len(METHODS)
    assert total > 700, total


def test_array_errors_show_the_way_out():
    """A torch tensor to the NumPy API names posenc.torch; a masked array is refused
    (its mask would be ignored silently)."""
    q = np.random.default_rng(0).standard_normal((1, 1, 3, 4))
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match=r"q must be a numpy.ndarray, got torch.Tensor; "
                                        r"posenc.torch takes tensors"):
        posenc.content(torch.from_numpy(q), q)
    masked = np.ma.masked_array(q, mask=q > 1)
    for call in (lambda: posenc.content(masked, q), lambda: posenc.content_attention(q, q, masked)):
        with pytest.raises(TypeError, match="is a masked array: posenc would ignore its mask"):
            call()


def test_a_bad_posenc_isa_variable_is_named(python):
    result = python("-c", "import posenc", env={"POSENC_ISA": "foo"}, timeout=120)
    assert result.returncode == 1
    assert ("ValueError: the POSENC_ISA environment variable: unknown ISA 'foo'; this CPU "
            "supports") in result.stderr, result.stderr
