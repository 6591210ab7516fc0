"""The generated fast check of each method (posenc._checks._FAST) against the
general one (check_call): the same Problem for every call it takes, the same
error for every call it hands on, and a hand-off for every input it is not
written for (NumPy scalars, array subclasses, `out`, non-native dtypes)."""

import numpy as np
import pytest

from posenc import _checks
from posenc._examples import make_inputs
from posenc._registry import METHODS, REGISTRY

SLOTS = [name for name in _checks.Problem.__slots__ if name != "_params"]


def _call(method, args, kwargs):
    """(tensors, params) in the order of the method's plan, as the signature passes them."""
    spec = REGISTRY[method]
    named = dict(zip(spec.tensors, args))
    named.update({k: v for k, v in kwargs.items() if k in spec.tensors})
    tensors = tuple(named.get(name) for name in spec.tensors)
    params = tuple(kwargs.get(name, default) for name, default in spec.params)
    return spec, tensors, params


def _same(a, b):
    for name in SLOTS:
        x, y = getattr(a, name), getattr(b, name)
        if name == "arrays":
            assert x.keys() == y.keys() and all(x[k] is y[k] for k in x), name
        else:
            assert type(x) is type(y) and x == y, (name, x, y)
    assert a.params == b.params


def _outcome(function, *args):
    try:
        return function(*args), None
    except (TypeError, ValueError) as error:
        return None, (type(error), str(error))


CASES = [dict(), dict(shared=True), dict(dtype=np.float32), dict(dtype=np.float16),
         dict(theta=False, bias=False, segments=0)]


@pytest.mark.parametrize("options", CASES, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items())
                         or "default")
@pytest.mark.parametrize("method", METHODS)
def test_fast_check_gives_the_general_problem(method, options):
    rng = np.random.default_rng(0)
    for B, H, n, m, d in [(1, 1, 1, 1, 1), (2, 3, 7, 5, 4), (1, 2, 17, 33, 8)]:
        try:
            args, kwargs = make_inputs(method, B, H, n, m, d, rng=rng, **options)
        except (TypeError, ValueError):
            continue
        for extra in ({}, {"query_offset": 3}, {"scale": 0.5}):
            spec, tensors, params = _call(method, args, {**kwargs, **extra})
            fast, fast_error = _outcome(_checks._FAST[method], spec, tensors, params, None)
            general, general_error = _outcome(_checks.check_call, spec, tensors, params, None)
            assert fast_error == general_error
            if general is not None:
                _same(fast, general)


@pytest.mark.parametrize("method", METHODS)
def test_fast_check_hands_on_what_it_is_not_written_for(method):
    """Each odd input goes to the general check: the same Problem or error."""
    rng = np.random.default_rng(1)
    args, kwargs = make_inputs(method, 2, 2, 5, 6, 4, rng=rng)
    spec, tensors, params = _call(method, args, kwargs)

    class Sub(np.ndarray):
        pass

    variants = [
        (tuple(t.view(Sub) if t is tensors[0] else t for t in tensors), params),      # subclass
        (tuple(t.astype(t.dtype.newbyteorder()) if t is tensors[1] else t              # byte order
               for t in tensors), params),
        (tensors, params[:-2] + (np.float64(0.25), np.int64(1))),                      # NumPy scalars
        (tensors, params[:-1] + (-1,)),                                                # bad offset
        (tensors, params[:-2] + ("x", 0)),                                             # bad scale
        (tuple(None if t is tensors[1] else t for t in tensors), params),              # missing k
        (tuple(t[..., :1] if t is tensors[1] else t for t in tensors), params),        # d differs
        (tuple(t.astype(np.float32) if t is tensors[-1] and t is not None
               and t.dtype.kind == "f" else t for t in tensors), params),               # mixed dtypes
    ]
    if params[:-2]:
        first = params[0]
        odd = np.int64(first) if type(first) is int else np.bool_(first) \
            if type(first) is bool else first
        variants.append((tensors, (odd,) + params[1:]))
    for tensors_v, params_v in variants:
        fast, fast_error = _outcome(_checks._FAST[method], spec, tensors_v, params_v, None)
        general, general_error = _outcome(_checks.check_call, spec, tensors_v, params_v, None)
        assert fast_error == general_error, (tensors_v, params_v)
        if general is not None:
            _same(fast, general)
    out = np.empty((2, 2, 5, 6), tensors[0].dtype)
    assert _checks.check(spec, tensors, params, out).out is out


def test_the_common_call_takes_the_fast_path(monkeypatch):
    """The plain call of a method with single-type parameters never reaches check_call."""
    calls = []
    real = _checks.check_call
    monkeypatch.setattr(_checks, "check_call", lambda *a: calls.append(a) or real(*a))
    for method in METHODS:
        if _checks._FAST[method] is real:
            continue
        args, kwargs = make_inputs(method, 1, 2, 3, 4, 2, rng=np.random.default_rng(2))
        _checks.check(*_call(method, args, kwargs), None)
    assert not calls
