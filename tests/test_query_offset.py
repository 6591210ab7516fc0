"""query_offset (SPEC §1): query row i sits at position query_offset + i.  A
one-query decoding step (n = 1, query_offset = m - 1) equals the last row of
the full sequence, in every namespace, forward and backward."""

import numpy as np
import pytest

import posenc
from posenc import reference
from posenc._examples import make_inputs, query_rows
from posenc._registry import METHODS

torch = pytest.importorskip("torch")
import posenc.torch as pt  # noqa: E402


@pytest.mark.parametrize("offset_rows", [(8, slice(8, 9)), (3, slice(3, 7))], ids=["step", "block"])
@pytest.mark.parametrize("method", METHODS)
def test_rows_at_an_offset_equal_the_full_rows(method, offset_rows, rng):
    offset, rows = offset_rows
    args, kwargs = make_inputs(method, 2, 3, 9, 9, 4, rng=rng)
    full = getattr(reference, method)(*args, **kwargs)[:, :, rows]
    G = rng.standard_normal(full.shape)
    sub_args, sub_kwargs = query_rows(method, args, kwargs, rows)
    want_grads = getattr(reference, method + "_backward")(G, *sub_args, **sub_kwargs,
                                                           query_offset=offset)
    np.testing.assert_allclose(getattr(reference, method)(*sub_args, **sub_kwargs,
                                                           query_offset=offset), full,
                               rtol=1e-12, atol=1e-12)
    got = getattr(posenc, method)(*sub_args, **sub_kwargs, query_offset=offset)
    np.testing.assert_allclose(got, full, rtol=1e-12, atol=1e-12)
    grads = getattr(posenc, method + "_backward")(G, *sub_args, **sub_kwargs,
                                                  query_offset=offset)
    for name in grads._fields:
        if getattr(grads, name) is not None:
            np.testing.assert_allclose(getattr(grads, name), getattr(want_grads, name),
                                       rtol=1e-11, atol=1e-11, err_msg=name)
    tensors = [torch.from_numpy(a) for a in sub_args]
    keywords = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v
                for k, v in sub_kwargs.items()}
    with pt.use_native():
        native = getattr(pt, method)(*tensors, **keywords, query_offset=offset)
    np.testing.assert_allclose(native.numpy(), full, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("module", [posenc, reference], ids=["posenc", "reference"])
def test_query_offset_must_be_a_nonnegative_int(module):
    q = np.zeros((1, 1, 2, 2))
    with pytest.raises(ValueError, match="query_offset must be >= 0"):
        module.content(q, q, query_offset=-1)
    with pytest.raises(TypeError, match="query_offset must be an int"):
        module.content(q, q, query_offset=1.0)


@pytest.mark.parametrize("namespace", ["posenc", "reference", "torch"])
def test_query_offset_bounded_where_positions_overflow(namespace):
    """query_offset + n + m must fit in int64 (the positions and offsets the kernels
    index): at the bound the result is the reference's; past it (where the bucket map
    wrapped and the output was off by 0.1, and 2**63 raised an OverflowError that did
    not name it) a ValueError names query_offset."""
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((1, 2, 3, 4)), rng.standard_normal((1, 2, 5, 4))
    bias = rng.standard_normal((2, 32))
    largest = 2**63 - 1 - (3 + 5)
    module = {"posenc": posenc, "reference": reference, "torch": pt}[namespace]
    wrap = torch.from_numpy if namespace == "torch" else (lambda x: x)
    got = module.t5(wrap(q), wrap(k), wrap(bias), query_offset=largest)
    np.testing.assert_allclose(np.asarray(got), reference.t5(q, k, bias, query_offset=largest),
                               rtol=1e-12)
    for offset in (largest + 1, 2**63 - 1, 2**63, 2**70):
        with pytest.raises(ValueError, match=rf"query_offset = {offset} is too large: .* "
                                             rf"query_offset <= 2\*\*63 - 1 - \(n \+ m\) = {largest}"):
            module.t5(wrap(q), wrap(k), wrap(bias), query_offset=offset)
