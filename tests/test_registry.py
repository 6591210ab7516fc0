"""The method registry is the one place a method is declared: every method it
lists exists, with the same signature and gradient fields, in every namespace
(posenc, posenc.reference, posenc.torch and its native formulas, the custom
ops, an nn module), with a docstring, example inputs and benchmark facts.  A
place missing for a new method fails here."""

import inspect

import numpy as np
import pytest

import posenc
from posenc import _checks, _examples, _methods, reference
from posenc._engine import ENGINE_GRADS, EngineConfig
from posenc._registry import GRAD_FIELDS, GRAD_TYPES, METHODS, REGISTRY

torch = pytest.importorskip("torch")
import posenc.torch as pt  # noqa: E402
from posenc.torch import _ops, native  # noqa: E402
from posenc.torch import nn as pnn  # noqa: E402


def _parameters(function, drop=("out",)):
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()
            if p.name not in drop]


def test_methods_are_the_registry():
    assert posenc.METHODS == METHODS == tuple(REGISTRY)
    assert reference.METHODS[:len(METHODS)] == METHODS
    for method in METHODS:
        assert method in posenc.__all__ and method + "_backward" in posenc.__all__
        assert method in pt.__all__


@pytest.mark.parametrize("method", METHODS)
def test_every_namespace_has_the_method(method):
    spec = REGISTRY[method]
    forward = getattr(posenc, method)
    signature = _parameters(forward)
    assert [name for name, *_ in signature] == list(spec.arguments)
    assert set(spec.arguments) == set(spec.tensors) | {p for p, _ in spec.params}
    assert list(inspect.signature(forward).parameters)[-1] == "out"
    for other in (getattr(reference, method), _checks.CHECKERS[method]):
        assert _parameters(other) == signature
    for other in (getattr(pt, method), getattr(native, method)):
        assert _parameters(other) == signature, other
    for namespace in (posenc, reference):
        backward = getattr(namespace, method + "_backward")
        assert _parameters(backward) == [("G", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                          inspect.Parameter.empty)] + signature
    # a docstring with the formula in every namespace
    for function in (forward, getattr(posenc, method + "_backward"), getattr(reference, method),
                     getattr(reference, method + "_backward"), getattr(pt, method),
                     getattr(native, method)):
        assert spec.formula and spec.formula in function.__doc__, function
    # the reference's own formulas, written from the paper
    assert callable(getattr(reference, f"_{method}_logits"))
    assert callable(getattr(reference, f"_{method}_grads"))
    # torch: the custom ops, and one nn module computing the method (besides its variants:
    # rope's per-token encodings)
    assert method in _ops.FORWARD and method in _ops.BACKWARD
    assert hasattr(torch.ops.posenc, method) and hasattr(torch.ops.posenc, method + "_backward")
    modules = [cls for cls in vars(pnn).values() if isinstance(cls, type)
               and issubclass(cls, pnn.PositionalEncoding) and cls.method == method
               and not cls.variant]
    assert len(modules) == 1, (method, modules)
    # benchmark facts
    assert spec.bench is not None and len(spec.bench.flops) == 2 and len(spec.bench.flop_text) == 2


@pytest.mark.parametrize("method", METHODS)
def test_gradient_fields_and_types(method):
    spec = REGISTRY[method]
    fields = GRAD_FIELDS[method]
    assert fields == spec.grad_fields == GRAD_TYPES[method]._fields
    assert getattr(posenc, GRAD_TYPES[method].__name__) is GRAD_TYPES[method]
    m = _examples.key_count(method, 5, 4)
    args, kwargs = _examples.make_inputs(method, 2, 3, 5, m, 3, rng=np.random.default_rng(0))
    G = np.ones((2, 3, 5, m))
    for namespace in (posenc, reference):
        grads = getattr(namespace, method + "_backward")(G, *args, **kwargs)
        assert type(grads) is GRAD_TYPES[method]
        for name in fields:          # a constant's field is None (RoPE's tables, SPEC §3.12)
            given = _examples.trainable_inputs(method, args, kwargs).get(name)
            value = getattr(grads, name)
            assert (value is None) == (given is None), name
            if value is not None:
                assert value.shape == given.shape and value.dtype == given.dtype, name


@pytest.mark.parametrize("method", METHODS)
def test_engine_configuration(method):
    """Each term lands in its engine slot; each gradient field comes from one slot."""
    spec = REGISTRY[method]
    args, kwargs = _examples.make_inputs(method, 1, 2, 3, 4, 5)
    problem = _checks.CHECKERS[method](*args, **kwargs)
    config = _methods.configure(problem)
    assert isinstance(config, EngineConfig) and config.product == spec.product
    assert config.scale == spec.default_scale(5)
    sources = _methods.SOURCES[method]
    assert len(sources) == len(spec.grad_fields)
    entries = [entry for entry, finish in sources if entry is not None and finish is None]
    assert len(set(entries)) == len(entries)
    floats = _examples.float_inputs(method, args, kwargs)
    for field, (entry, finish) in zip(spec.grad_fields, sources):
        if field in spec.constant:       # the rotation's tables: per-token ones' only
            assert entry is not None and getattr(config, ENGINE_GRADS[entry]) is None
        elif finish is None:             # the engine's array is the argument itself
            assert getattr(config, ENGINE_GRADS[entry]) is floats[field], (field, entry)
        else:                            # a parameter of an array the engine reads
            assert getattr(config, ENGINE_GRADS[entry]) is not None, (field, entry)
    for name in ("query_table", "key_table"):   # the vector tables: a table with its map
        mapped = getattr(config, name + "_map")
        assert (getattr(config, name + "_table") is None) == (mapped is None)


def test_one_array_for_two_tables():
    """DeBERTa's two tables are two tensors: the same array passed for both still gets both
    gradients (the engine sums two sides into one only where the registry names one tensor on
    both sides: M4's rel_k)."""
    args, kwargs = _examples.make_inputs("deberta", 2, 3, 5, 7, 4, rng=np.random.default_rng(0))
    names = inspect.signature(posenc.deberta).parameters
    args = list(args)
    at = {name: t for t, name in enumerate(names)}
    args[at["pos_query"]] = args[at["pos_key"]]
    G = np.random.default_rng(1).standard_normal((2, 3, 5, 7))
    got, want = posenc.deberta_backward(G, *args, **kwargs), reference.deberta_backward(
        G, *args, **kwargs)
    for field in ("pos_key", "pos_query"):
        np.testing.assert_allclose(getattr(got, field), getattr(want, field), rtol=1e-12,
                                   atol=1e-12)
    m4_args, m4_kwargs = _examples.make_inputs("m4", 1, 2, 3, 4, 5)
    config = _methods.configure(_checks.CHECKERS["m4"](*m4_args, **m4_kwargs))
    assert config.key_table_table is config.query_table_table   # M4: one tensor, one object


def test_a_new_entry_is_checked_for_consistency():
    """A term whose tensor is not in the signature is caught when the entry is made."""
    from posenc._registry import Method, Table
    with pytest.raises(AssertionError, match="signature"):
        Method("broken", "", "rel, *, max_distance, scale=None", terms=(Table("bias"),),
               bucket="clipped")
