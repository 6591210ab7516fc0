"""posenc.plot: positional terms, parameters, PNG rendering, the CLI."""

import builtins
import math
import os

import numpy as np
import pytest

try:
    import matplotlib
    matplotlib.use("Agg")            # before any pyplot import, here or in posenc
except ImportError:                  # pragma: no cover - depends on the environment
    matplotlib = None

from posenc import buckets, plot

SEED = int(os.environ.get("POSENC_TEST_SEED", "0"))
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
needs_matplotlib = pytest.mark.skipif(
    matplotlib is None, reason="matplotlib not installed: pip install matplotlib")
CLI_METHODS = ("t5", "diet_abs", "diet_rel", "tupe", "shaw", "deberta")


def _assert_png(path, min_bytes=5000):
    assert path.exists()
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert len(data) > min_bytes, f"{path} has only {len(data)} bytes"


# ---------------------------------------------------------------------------
# Positional terms (no matplotlib needed)
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("method", plot.POSITIONAL_METHODS)
def test_positional_term_shape_and_softmax(method):
    H, n = 3, 12
    params = plot.random_params(method, H, n, np.random.default_rng(SEED), d=8)
    term = plot.positional_term(method, params, n, rng=SEED)
    assert term.shape == (H, n, n) and term.dtype == np.float64
    assert np.isfinite(term).all()
    attention = plot.positional_attention(method, params, n, rng=SEED)
    np.testing.assert_allclose(attention.sum(-1), 1.0, rtol=1e-12)
    assert (attention >= 0).all()


def _offsets(n):
    i, j = np.indices((n, n))
    return j - i


def test_positional_term_t5_is_the_bias_table():
    H, n = 2, 40
    params = plot.random_params("t5", H, n, SEED)
    term = plot.positional_term("t5", params, n)
    np.testing.assert_array_equal(term, params["bias"][:, buckets.t5(_offsets(n))])


def test_positional_term_diet_and_tupe_literal():
    rng = np.random.default_rng(SEED)
    H, n, d = 2, 10, 6
    p = plot.random_params("diet_abs", H, n, rng, d=d)
    np.testing.assert_allclose(plot.positional_term("diet_abs", p),
                               p["pos_q"] @ p["pos_k"].transpose(0, 2, 1), rtol=1e-12)
    p = plot.random_params("tupe", H, n, rng, d=d)
    expected = p["pos_q"] @ p["pos_k"].transpose(0, 2, 1) / math.sqrt(2 * d)
    expected[:, 1:, 0] = p["theta"][:, 1:2]          # TUPE [CLS] reset
    expected[:, 0, :] = p["theta"][:, 0:1]
    np.testing.assert_allclose(plot.positional_term("tupe", p), expected, rtol=1e-12)
    p = plot.random_params("diet_rel", H, n, rng, segments=True)
    seg = (np.arange(n) >= n // 2).astype(int)
    expected = (p["rel"][:, buckets.clipped(-_offsets(n), p["max_distance"])]
                + p["segment_table"][:, seg[:, None], seg[None, :]])
    np.testing.assert_allclose(plot.positional_term("diet_rel", p, n), expected, rtol=1e-12)


def test_positional_term_shaw_uses_given_q_k():
    """Shaw's positional term is s q_i . rel_k[c(i, j)] for the q in the parameters."""
    rng = np.random.default_rng(SEED)
    H, n, d = 2, 9, 4
    p = plot.random_params("shaw", H, n, rng, d=d)
    p["q"], p["k"] = rng.standard_normal((2, 1, H, n, d))
    term, note = plot.positional_term("shaw", p, n, return_note=True)
    a = p["rel_k"][:, buckets.clipped(_offsets(n), p["max_distance"])]     # (H, n, n, d)
    expected = np.einsum("hid,hijd->hij", p["q"][0], a) / math.sqrt(d)
    np.testing.assert_allclose(term, expected, rtol=1e-10, atol=1e-12)
    assert note == "given q, k"


def test_random_q_k_are_seeded():
    p = plot.random_params("deberta", 2, 8, SEED, d=4)
    one = plot.positional_term("deberta", p, 8, rng=5)
    np.testing.assert_array_equal(one, plot.positional_term("deberta", p, 8, rng=5))
    assert not np.array_equal(one, plot.positional_term("deberta", p, 8, rng=6))


def test_npz_round_trip(tmp_path):
    for method in plot.POSITIONAL_METHODS:
        params = plot.random_params(method, 2, 8, SEED, d=4,
                                    segments=method in ("diet_abs", "diet_rel"))
        path = tmp_path / f"{method}.npz"
        plot.save_params(path, params)
        loaded = plot.load_params(path, method)
        assert set(loaded) == set(params)
        for name, value in params.items():
            np.testing.assert_array_equal(loaded[name], value)
            assert type(loaded[name]) is type(value) or isinstance(value, np.ndarray)
        np.testing.assert_array_equal(plot.positional_term(method, loaded, 8, rng=1),
                                      plot.positional_term(method, params, 8, rng=1))


def test_npz_infers_keywords_and_rejects_bad_names(tmp_path):
    rel = np.random.default_rng(SEED).standard_normal((2, 9))
    path = tmp_path / "rel.npz"
    np.savez(path, rel=rel)                            # no max_distance: 2t+1 = 9
    assert plot.load_params(path, "diet_rel")["max_distance"] == 4
    np.savez(path, rel=rel, table=rel)
    with pytest.raises(ValueError, match="unknown array names"):
        plot.load_params(path, "diet_rel")
    np.savez(path, pos_q=np.zeros((1, 4, 2)))
    with pytest.raises(ValueError, match="needs.*pos_k"):
        plot.load_params(path, "diet_abs")


def test_unknown_method_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown method 'foo'.*diet_rel"):
        plot.random_params("foo", 2, 8, SEED)
    with pytest.raises(ValueError, match="unknown method 'foo'"):
        plot.positional_term("foo", {}, 8)
    with pytest.raises(ValueError, match="no positional term"):
        plot.positional_term("content", {}, 8)
    with pytest.raises(ValueError, match="segments are a DIET feature"):
        plot.random_params("t5", 2, 8, SEED, segments=True)


def test_cli_unknown_method_exits_with_usage(capsys, tmp_path):
    with pytest.raises(SystemExit) as info:
        plot.main(["--method", "foo", "-o", str(tmp_path / "x.png")])
    assert info.value.code == 2
    assert "invalid choice: 'foo'" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()


def test_drawing_without_matplotlib_says_what_to_install(monkeypatch):
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    with pytest.raises(ImportError, match="needs matplotlib, which is not installed: pip install matplotlib"):
        plot.plot_heads(np.zeros((1, 4, 4)))
    with pytest.raises(ImportError, match="needs matplotlib, which is not installed: pip install matplotlib"):
        plot.plot_positional("t5", plot.random_params("t5", 1, 4, SEED), 4)


# ---------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------

@needs_matplotlib
@pytest.mark.parametrize("method", plot.POSITIONAL_METHODS)
def test_plot_positional_png(method, tmp_path):
    params = plot.random_params(method, 2, 16, SEED, d=8)
    path = tmp_path / f"{method}.png"
    fig = plot.plot_positional(method, params, 16, rng=SEED, path=path)
    assert len(fig.axes) >= 2
    _assert_png(path)


@needs_matplotlib
@pytest.mark.parametrize("method", CLI_METHODS)
def test_cli_renders_each_method(method, tmp_path, capsys):
    path = tmp_path / f"{method}.png"
    args = ["--method", method, "--random-params", "--heads", "2", "--n", "16",
            "--d-head", "8", "-o", str(path)]
    assert plot.main(args) == 0
    assert str(path) in capsys.readouterr().out
    _assert_png(path)


@needs_matplotlib
def test_cli_npz_and_raw(tmp_path):
    npz, first, second = tmp_path / "p.npz", tmp_path / "a.png", tmp_path / "b.png"
    assert plot.main(["--method", "diet_rel", "--n", "16", "--heads", "3",
                      "--save-params", str(npz), "-o", str(first)]) == 0
    assert plot.main(["--method", "diet_rel", "--npz", str(npz), "--n", "16", "--raw",
                      "-o", str(second)]) == 0
    _assert_png(first)
    _assert_png(second)
    with pytest.raises(SystemExit):
        plot.main(["--method", "t5", "--segments", "-o", str(first)])


@needs_matplotlib
def test_segment_attention_diet_fig6(tmp_path):
    path = tmp_path / "segments.png"
    fig = plot.plot_segment_attention(n=32, start=16, H=4, rng=SEED, path=path)
    assert len([ax for ax in fig.axes if ax.images]) == 4
    _assert_png(path)
    params = plot.random_params("diet_abs", 2, 32, SEED, d=8, segments=True)
    plot.plot_segment_attention(params, method="diet_abs", path=tmp_path / "abs.png")
    _assert_png(tmp_path / "abs.png")
    assert plot.main(["--method", "diet_rel", "--segments", "-o", str(tmp_path / "c.png")]) == 0
    _assert_png(tmp_path / "c.png")


@needs_matplotlib
def test_grid_of_heads_layout():
    fig = plot.plot_heads(np.random.default_rng(SEED).random((6, 5, 5)), ncols=4, raw=True)
    images = [ax for ax in fig.axes if ax.images]
    assert len(images) == 6                           # 2 x 4 grid, 2 panels off
    assert images[0].get_title() == "head 0"
