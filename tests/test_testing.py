"""posenc.testing, posenc's pytest plugin, posenc.info() and posenc.check().

* the helpers pass a correct kernel (posenc's own, posenc.torch's) for every
  method and dtype, and fail a wrong one -- an off-by-one offset, a wrong
  scale, one wrong entry, a wrong or missing gradient -- with a message that
  names the worst entry, both values and the tolerance;
* the plugin, from a user's project outside the package (tests/user_project,
  copied to a temporary directory): it passes, and a bug put into the user's
  kernel fails with the helpers' message;
* the display objects: text as the command line prints it, HTML, progress.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import io
import os
import pathlib
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import posenc
from posenc import reference
from posenc._display import Progress
from posenc._examples import key_count
from posenc import testing
from posenc.testing import Inputs, assert_grads_close, assert_logits_close, random_inputs

ROOT = pathlib.Path(__file__).resolve().parent.parent
USER_PROJECT = ROOT / "tests" / "user_project"
SEED = int(os.environ.get("POSENC_TEST_SEED", "0"))
HAVE_TORCH = importlib.util.find_spec("torch") is not None
DTYPES = [np.float32, np.float64]
needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")


def fails(match: str):
    return pytest.raises(AssertionError, match=match)


# ------------------------------------------------------------------ random_inputs

def test_random_inputs_unpack_and_repeat():
    inputs = random_inputs("tupe", B=1, H=2, n=6, m=4, d=3, dtype=np.float32, seed=5)
    args, kwargs = inputs
    assert isinstance(inputs, Inputs) and inputs.method == "tupe"
    assert args[0].shape == (1, 2, 6, 3) and args[1].shape == (1, 2, 4, 3)
    assert {"bias", "theta", "num_buckets", "max_distance"} <= set(kwargs)
    assert all(a.dtype == np.float32 for a in inputs.floats.values())
    again = random_inputs("tupe", B=1, H=2, n=6, m=4, d=3, dtype=np.float32, seed=5)
    assert all(np.array_equal(inputs.floats[name], again.floats[name]) for name in inputs.floats)
    other = random_inputs("tupe", B=1, H=2, n=6, m=4, d=3, dtype=np.float32, seed=6)
    assert not np.array_equal(inputs.args[0], other.args[0])
    assert inputs.call(posenc.tupe).shape == (1, 2, 6, 4)


def test_random_inputs_options_and_errors():
    args, kwargs = random_inputs("diet_abs", shared=True, segments=0, d_p=2)
    assert args[2].shape == (1, 7, 2) and "segment_table" not in kwargs
    with pytest.raises(TypeError, match="unknown option.*segment"):
        random_inputs("diet_rel", segment=2)
    with pytest.raises(TypeError, match="float32, float64, bfloat16"):
        random_inputs("t5", dtype=np.int32)
    assert all(a.dtype == np.float16 for a in random_inputs("t5", dtype=np.float16).floats.values())
    with pytest.raises(ValueError, match="unknown method 'sinusoidal'"):
        random_inputs("sinusoidal")


# ------------------------------------------------------------------ correct kernels pass

@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("method", posenc.METHODS)
def test_posenc_kernels_pass(method, dtype):
    args, kwargs = random_inputs(method, dtype=dtype)
    assert_logits_close(getattr(posenc, method)(*args, **kwargs), method, *args, **kwargs)
    assert_grads_close(getattr(posenc, method + "_backward"), method, *args, **kwargs)


@needs_torch
@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("method", posenc.METHODS)
def test_torch_ops_pass(method, dtype):
    import posenc.torch as pt

    inputs = random_inputs(method, dtype=dtype, shared=True).torch(requires_grad=True)
    op = getattr(pt, method)
    assert_logits_close(inputs.call(op), method, *inputs.args, **inputs.kwargs)
    assert_grads_close(op, method, *inputs.args, **inputs.kwargs)


def test_nan_and_inf_propagate_alike():
    args, kwargs = random_inputs("content")
    args[0][0, 0, 0, 0], args[1][1, 2, 3, 1] = np.nan, np.inf
    assert_logits_close(posenc.content(*args, **kwargs), "content", *args, **kwargs)


# ------------------------------------------------------------------ wrong kernels fail

def test_one_wrong_entry_is_named_with_both_values_and_the_tolerance():
    args, kwargs = random_inputs("m4", dtype=np.float64)
    logits = posenc.m4(*args, **kwargs)
    expected = float(logits[1, 2, 3, 4])
    logits[1, 2, 3, 4] += 1e-6
    tolerance = 1e-12 * np.abs(reference.m4(*args, **kwargs)).max()
    with fails(r"at \(b, h, i, j\) = \(1, 2, 3, 4\)") as error:
        assert_logits_close(logits, "m4", *args, **kwargs)
    message = str(error.value)
    assert f"actual {expected + 1e-6:.10g}, reference {expected:.10g}" in message
    assert f"tolerance {tolerance:.3g} (float64, normwise" in message
    assert "1 of 210 entries outside the tolerance" in message


def test_float32_tolerance_is_elementwise_and_tight():
    args, kwargs = random_inputs("shaw", dtype=np.float32, n=9, m=9, d=16)
    logits = posenc.shaw(*args, **kwargs)
    assert_logits_close(logits, "shaw", *args, **kwargs)
    nudged = logits.copy()
    nudged[0, 1, 2, 3] = np.nextafter(nudged[0, 1, 2, 3], np.float32(np.inf))   # one ulp: rounding
    assert_logits_close(nudged, "shaw", *args, **kwargs)
    nudged[0, 1, 2, 3] *= np.float32(1 + 1e-4)
    with fails(r"\(0, 1, 2, 3\).*float32, element-wise: \(depth \+ 8\) eps32 x M, depth = d \+ d_p"):
        assert_logits_close(nudged, "shaw", *args, **kwargs)


def test_off_by_one_offset_fails():
    """Offsets j - i - 1 instead of j - i (here: query_offset=1, every position
    shifted by one), the classic bucket mistake."""
    for method in ("t5", "shaw", "m2", "deberta", "diet_rel"):
        args, kwargs = random_inputs(method, dtype=np.float32)
        shifted = getattr(posenc, method)(*args, **kwargs, query_offset=1)
        with fails(rf"logits of {method} \(float32\) differ from posenc.reference.{method} "
                   r"at \(b, h, i, j\) = \(\d, \d, \d, \d\): actual .*, reference .*, "
                   r"error .* > tolerance .*entries outside the tolerance"):
            assert_logits_close(shifted, method, *args, **kwargs)


@pytest.mark.parametrize("method", ["content", "tupe", "deberta"])
def test_wrong_scale_fails(method):
    """1/sqrt(d) where the method says 1/sqrt(2d) or 1/sqrt(3d), or 0.1% off."""
    args, kwargs = random_inputs(method, dtype=np.float32, d=8)
    wrong = 1.001 / np.sqrt(8) if method == "content" else 1 / np.sqrt(8)
    with fails(f"logits of {method}"):
        assert_logits_close(getattr(posenc, method)(*args, **kwargs, scale=wrong),
                            method, *args, **kwargs)


def test_wrong_shape_fails():
    args, kwargs = random_inputs("t5")
    with fails(r"in shape: \(2, 3, 5, 7\) instead of \(2, 3, 7, 5\)"):
        assert_logits_close(posenc.t5(*args, **kwargs).transpose(0, 1, 3, 2), "t5", *args, **kwargs)


def test_half_precision_has_its_bound():
    """float16 (and bfloat16) results are held to u |reference| + (1 + u) E32: posenc's
    pass, one 2^-9 too large fails (u = 2^-11); other float dtypes are refused."""
    args, _ = random_inputs("content", dtype=np.float16)
    got = posenc.content(*args)
    assert_logits_close(got, "content", *args)
    with fails(r"logits of content \(float16\).*u \|reference\| \+ \(1 \+ u\) E32, u = 2\^-11"):
        assert_logits_close(got * np.float16(1 + 2 ** -9), "content", *args)
    with pytest.raises(TypeError, match="float128 is not supported"):
        assert_logits_close(got.astype(np.longdouble), "content", *args)


def _t5_backward_with(change):
    def backward(G, *args, **kwargs):
        return change(posenc.t5_backward(G, *args, **kwargs))
    return backward


def test_wrong_gradient_is_named():
    args, kwargs = random_inputs("t5", dtype=np.float32)
    wrong = _t5_backward_with(lambda g: g._replace(bias=g.bias[:, ::-1].copy()))
    with fails(r"gradient 'bias' of t5 \(float32\) differs from posenc.reference.t5_backward "
               r"at bias\[\d, \d+\]: actual .*float32, element-wise.*depth = n \+ m \+ d \+ d_p"):
        assert_grads_close(wrong, "t5", *args, **kwargs)
    missing = _t5_backward_with(lambda g: {"q": g.q, "k": g.k})
    with fails("fn gave no gradient for 'bias' of t5"):
        assert_grads_close(missing, "t5", *args, **kwargs)


def test_gradients_by_dict_or_plain_tuple():
    args, kwargs = random_inputs("diet_rel", segments=0)
    assert_grads_close(lambda G, *a, **k: posenc.diet_rel_backward(G, *a, **k)._asdict(),
                       "diet_rel", *args, **kwargs)
    assert_grads_close(lambda G, *a, **k: tuple(posenc.diet_rel_backward(G, *a, **k))[:3],
                       "diet_rel", *args, **kwargs)
    with fails(r"gradient 'rel' of diet_rel"):     # the sign of the table's gradient
        assert_grads_close(lambda G, *a, **k: posenc.diet_rel_backward(G, *a, **k)[:2]
                           + (-posenc.diet_rel_backward(G, *a, **k).rel,), "diet_rel", *args, **kwargs)


@needs_torch
def test_torch_half_tensors_have_their_bound():
    """torch.float16 and torch.bfloat16 results and inputs are read with their bits
    (bfloat16 as ml_dtypes.bfloat16) and held to their dtype's bound."""
    import torch

    from posenc._dtypes import BFLOAT16

    args, _ = random_inputs("content", dtype=np.float16)
    assert_logits_close(torch.from_numpy(posenc.content(*args)), "content",
                        *map(torch.from_numpy, args))
    if BFLOAT16 is None:
        return
    args = [a.astype(BFLOAT16) for a in args]

    def tensor(array):
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)

    got = tensor(posenc.content(*args))
    assert_logits_close(got, "content", *map(tensor, args))
    with fails(r"logits of content \(bfloat16\).*u = 2\^-8"):
        assert_logits_close(got * 1.02, "content", *map(tensor, args))


@needs_torch
def test_torch_wrong_gradient_and_detached_input():
    import torch

    import posenc.torch as pt

    inputs = random_inputs("t5", dtype=np.float32).torch()

    def wrong(q, k, bias, **kwargs):   # the right value, a gradient 0.01 too large per entry
        return pt.t5(q, k, bias, **kwargs) + 0.01 * (bias.sum() - bias.sum().detach())

    with fails(r"gradient 'bias' of t5 \(float32\)"):
        assert_grads_close(wrong, "t5", *inputs.args, **inputs.kwargs)
    with fails("fn gave no gradient for 'bias'"):
        assert_grads_close(lambda q, k, bias, **kw: pt.t5(q, k, bias.detach(), **kw),
                           "t5", *inputs.args, **inputs.kwargs)
    with fails("fn returned a tensor without a gradient"):
        assert_grads_close(lambda *a, **kw: pt.t5(*a, **kw).detach(), "t5",
                           *inputs.args, **inputs.kwargs)
    with fails(r"logits of t5 \(float16\)"):     # a torch.float16 result has float16's bound
        assert_logits_close(torch.zeros(2, 3, 7, 5, dtype=torch.float16), "t5",
                            *inputs.args, **inputs.kwargs)


# ------------------------------------------------------------------ the pytest plugin

def _plugin_installed() -> bool:
    return any(entry.value == "posenc._pytest_plugin"
               for entry in importlib.metadata.entry_points(group="pytest11"))


def _run_user_project(project: pathlib.Path, *options, **environment) -> subprocess.CompletedProcess:
    """pytest on a copy of the user's project, from its directory, with the
    plugin of the entry point (or -p where posenc is not installed), and
    `environment`'s variables set."""
    plugin = [] if _plugin_installed() else ["-p", "posenc._pytest_plugin"]
    env = {key: value for key, value in os.environ.items() if key != "PYTEST_ADDOPTS"}
    env.update(environment)
    # the posenc under test, installed or not
    tested = str(pathlib.Path(posenc.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [tested, env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           *plugin, *options, str(project)],
                          cwd=project, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture
def user_project(tmp_path):
    project = tmp_path / "user_project"
    shutil.copytree(USER_PROJECT, project, ignore=shutil.ignore_patterns("__pycache__"))
    return project


def test_the_entry_point_names_the_plugin():
    text = (ROOT / "pyproject.toml").read_text()
    assert '"posenc._pytest_plugin" = "posenc._pytest_plugin"' in text


def test_user_project_passes(user_project):
    result = _run_user_project(user_project)
    assert result.returncode == 0, result.stdout + result.stderr
    isas = posenc.capabilities()
    collected = _run_user_project(user_project, "--collect-only")
    for isa in isas:
        assert f"test_agrees_with_posenc_on_every_isa[{isa}]" in collected.stdout
    expected = 6 + len(isas) + HAVE_TORCH
    assert re.search(rf"\b{expected} passed", result.stdout), result.stdout


def test_user_project_with_a_wrong_kernel_fails(user_project):
    kernel = user_project / "my_t5.py"
    source = kernel.read_text()
    assert "return t5_bucket(offset, " in source
    kernel.write_text(source.replace("return t5_bucket(offset, ", "return t5_bucket(offset + 1, "))
    result = _run_user_project(user_project)
    assert result.returncode == 1, result.stdout + result.stderr
    output = result.stdout
    assert re.search(r"AssertionError: logits of t5 \(float64\) differ from posenc.reference.t5 "
                     r"at \(b, h, i, j\) = \(\d, \d, \d, \d\): actual -?[\d.e-]+, reference "
                     r"-?[\d.e-]+, error [\d.e-]+ > tolerance [\d.e-]+ \(float64, normwise",
                     output), output
    assert "gradient 'bias' of t5" in output
    assert (f"POSENC_TEST_SEED={SEED} python -m pytest "
            "'test_my_t5.py::test_logits[float32-per-head]'") in output
    assert re.search(rf"\b{6 + len(posenc.capabilities()) + HAVE_TORCH} failed", output), output


def test_loading_the_plugin_explicitly_is_harmless(user_project):
    """-p posenc._pytest_plugin beside the installed entry point (same name) is one plugin."""
    result = _run_user_project(user_project, "-p", "posenc._pytest_plugin", "-k", "every_isa")
    assert result.returncode == 0, result.stdout + result.stderr


def test_posenc_isa_restores_the_isa(user_project):
    (user_project / "test_isa.py").write_text(
        "import posenc, pytest\n"
        "START = posenc.get_isa()\n"
        "@pytest.mark.parametrize('posenc_isa', ['scalar'], indirect=True)\n"
        "def test_chosen(posenc_isa):\n"
        "    assert posenc.get_isa() == posenc_isa == 'scalar'\n"
        "def test_after():\n"
        "    assert posenc.get_isa() == START\n")
    result = _run_user_project(user_project, "-k", "chosen or after", "-vv")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "test_chosen[scalar] PASSED" in result.stdout


def test_a_bad_seed_fails_only_the_tests_of_posencs_fixtures(user_project):
    """POSENC_TEST_SEED=abc: the plugin is in every pytest run of the environment, so
    it must not abort a run (it did, rc 3, at import); the tests that take
    posenc_inputs error naming the variable, the others run."""
    (user_project / "test_seeds.py").write_text(
        "def test_plain():\n"
        "    assert 1 + 1 == 2\n"
        "def test_fixture(posenc_inputs):\n"
        "    posenc_inputs('t5')\n")
    result = _run_user_project(user_project, "-k", "plain or fixture", POSENC_TEST_SEED="abc")
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert re.search(r"\b1 passed", output) and re.search(r"\b1 error", output), output
    assert "POSENC_TEST_SEED must be a non-negative integer, got 'abc'" in output


# ------------------------------------------------------------------ info, check, progress

def test_info_is_the_command_line_text():
    from posenc.__main__ import main

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["info"]) == 0
    info = posenc.info()
    assert repr(info) == printed.getvalue().rstrip("\n")
    assert info["isa usable"] == ", ".join(posenc.capabilities())
    assert info._repr_html_().startswith("<table>") and "isa active" in info._repr_html_()


def test_check_result():
    from posenc._check import DTYPES

    result = posenc.check(["t5", "diet_abs"], "scalar", n=9, m=7, d=5, progress=False)
    rows = 2 * 2 * len(DTYPES)                           # methods x (logits, attention) x dtypes
    assert result.passed and len(result.rows) == rows and not result.failed
    assert {row.dtype for row in result.rows} == set(DTYPES) >= {"float32", "float64", "float16"}
    text = repr(result)
    assert text.splitlines()[0].endswith("(B=2 H=3 n=9 m=7 d=5, seed 0)")
    assert text.splitlines()[-1].startswith(
        f"{rows} passed, 0 failed (2 methods x 1 ISAs x {len(DTYPES)} dtypes")
    page = result._repr_html_()
    assert page.count("PASS") == rows and "<caption" in page
    only = posenc.check("t5", "scalar", dtypes="float16", progress=False)
    assert [row.dtype for row in only.rows] == ["float16", "float16"] and only.passed
    with pytest.raises(ValueError, match="unknown dtype 'float8'"):
        posenc.check("t5", dtypes=["float8"])
    with pytest.raises(ValueError, match="unknown method"):
        posenc.check("sinusoidal")
    with pytest.raises(ValueError, match="not available here"):
        posenc.check("t5", "sse9")


@pytest.mark.parametrize("case", ["rope/token", "relative_bias_2d", "cope"])
def test_check_of_tables_without_a_batch_axis(case):
    """The check's cases of the term modules whose tables have no batch axis pass on every
    ISA and dtype: the engine sums their gradients over the batch (posenc_grads), the
    check's bounds are summed in NumPy (a bound taken as the engine's row 0 was one batch
    row's: 5e31 times too small where that row was masked)."""
    result = posenc.check(case, progress=False)
    assert result.passed and result.rows, repr(result)


def test_progress_without_tqdm(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tqdm", None)       # as if tqdm were not installed
    with Progress(3, "steps", enabled=True) as bar:
        for _ in range(3):
            bar.update("x")
    assert "steps [########################] 3/3" in capsys.readouterr().err
    with Progress(3, "steps") as bar:                    # captured output: not a terminal
        bar.update()
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("method", posenc.METHODS)
def test_assert_attention_close(method, dtype):
    """posenc's fused attention passes; a wrong dropout seed or a perturbed entry fails
    with the entry (b, h, i, d) and the bound in the message."""
    m = key_count(method, 7, 5, 2)            # fox: every query among the keys at offset 2
    args, kwargs = testing.random_inputs(method, m=m, dtype=dtype)
    q, k = args[0], args[1]
    v = np.random.default_rng(5).standard_normal((2, 3, m, 4)).astype(dtype)
    mask = np.zeros((2, m), dtype=bool)
    mask[1, 3:] = True
    options = dict(causal=True, key_padding_mask=mask, query_offset=2, dropout_p=0.2, seed=4)
    got = getattr(posenc, method + "_attention")(q, k, v, *args[2:], **kwargs, **options)
    testing.assert_attention_close(got, method, q, k, v, *args[2:], **kwargs, **options)
    testing.assert_attention_close(got.out, method, q, k, v, *args[2:], **kwargs, **options)
    wrong = getattr(posenc, method + "_attention")(q, k, v, *args[2:], **kwargs,
                                                   **dict(options, seed=5))
    with pytest.raises(AssertionError, match=r"differs from posenc.reference\..*_attention at \("):
        testing.assert_attention_close(wrong.out, method, q, k, v, *args[2:], **kwargs, **options)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_assert_attention_close_message_states_its_own_rule(dtype):
    """The failure text said 'error 7.28e-10; error measure 4.02e-12 > 1' for float64
    (the measure is normwise against 1e-12, not 1): each dtype now states the rule it
    applied, with numbers that satisfy it."""
    args, kwargs = testing.random_inputs("t5", dtype=dtype)
    q, k = args[0], args[1]
    v = np.random.default_rng(5).standard_normal((2, 3, 5, 4)).astype(dtype)
    got = posenc.t5_attention(q, k, v, *args[2:], **kwargs).out.copy()
    got[1, 2, 3, 0] += 1e-9 if dtype == np.float64 else 1e-3
    with pytest.raises(AssertionError) as info:
        testing.assert_attention_close(got, "t5", q, k, v, *args[2:], **kwargs)
    text = str(info.value)
    assert "at (1, 2, 3, 0)" in text, text
    if dtype == np.float64:
        measure, limit = re.search(r"normwise relative error ([\d.e+-]+) > ([\d.e+-]+)", text).groups()
        assert float(limit) == 1e-12 and float(measure) > float(limit), text
    else:
        error, limit, ratio = re.search(r"error ([\d.e+-]+) > bound ([\d.e+-]+) .*error / bound "
                                        r"([\d.e+-]+)", text).groups()
        assert float(error) > float(limit) and float(ratio) > 1, text
