"""my_t5 against posenc.reference, with posenc's pytest fixtures and posenc.testing."""

import numpy as np
import pytest

import my_t5
import posenc
from posenc.testing import assert_grads_close, assert_logits_close


@pytest.mark.parametrize("shared", [False, True], ids=["per-head", "shared"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_logits(posenc_inputs, dtype, shared):
    args, kwargs = posenc_inputs("t5", dtype=dtype, shared=shared)
    assert_logits_close(my_t5.t5_logits(*args, **kwargs), "t5", *args, **kwargs)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gradients(posenc_inputs, dtype):
    args, kwargs = posenc_inputs("t5", dtype=dtype, n=9, m=12)
    assert_grads_close(my_t5.t5_grads, "t5", *args, **kwargs)


def test_torch_autograd(posenc_inputs):
    pytest.importorskip("torch")
    inputs = posenc_inputs("t5", dtype=np.float32).torch()
    assert_logits_close(inputs.call(my_t5.t5_logits_torch), "t5", *inputs.args, **inputs.kwargs)
    assert_grads_close(my_t5.t5_logits_torch, "t5", *inputs.args, **inputs.kwargs)


def test_agrees_with_posenc_on_every_isa(posenc_isa, posenc_inputs):
    """posenc's kernels, whichever ISA runs them, and my_t5 compute the same logits."""
    assert posenc.get_isa() == posenc_isa
    args, kwargs = posenc_inputs("t5", dtype=np.float32, n=33, m=17, d=16)
    expected = posenc.t5(*args, **kwargs)
    assert_logits_close(expected, "t5", *args, **kwargs)
    np.testing.assert_allclose(my_t5.t5_logits(*args, **kwargs), expected, rtol=1e-5, atol=1e-5)
