"""posenc.analysis: numerical rank, DIET Theorem 1, TUPE Proposition 1."""

import io
import os

import numpy as np
import pytest

import posenc
from posenc import analysis, buckets

SEED = int(os.environ.get("POSENC_TEST_SEED", "0"))


# ---------------------------------------------------------------------------
# numerical_rank
# ---------------------------------------------------------------------------

def _low_rank_batch(rng, lead, M, N, dtype=np.float64):
    """Matrices (*lead, M, N) with random ranks in [0, min(M, N)]."""
    ranks = rng.integers(0, min(M, N) + 1, size=lead)
    out = np.empty(lead + (M, N), dtype=dtype)
    for index in np.ndindex(*lead):
        r = ranks[index]
        out[index] = rng.standard_normal((M, r)) @ rng.standard_normal((r, N))
    return out, ranks


@pytest.mark.parametrize("lead, M, N", [((5,), 6, 9), ((2, 3), 12, 7), ((4,), 16, 16)])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_numerical_rank_matches_matrix_rank_batched(lead, M, N, dtype):
    rng = np.random.default_rng(SEED)
    A, ranks = _low_rank_batch(rng, lead, M, N, dtype)
    got = analysis.numerical_rank(A)
    assert got.shape == lead
    assert np.issubdtype(got.dtype, np.integer)
    np.testing.assert_array_equal(got, np.linalg.matrix_rank(A))
    np.testing.assert_array_equal(got, ranks)


def test_numerical_rank_2d_returns_int_and_takes_tol():
    rng = np.random.default_rng(SEED)
    A = rng.standard_normal((8, 3)) @ rng.standard_normal((3, 10))
    assert analysis.numerical_rank(A) == 3
    assert isinstance(analysis.numerical_rank(A), int)
    S = np.linalg.svd(A, compute_uv=False)
    for tol in (0.0, S[1] * 0.999, S[0] * 2):
        assert analysis.numerical_rank(A, tol) == np.linalg.matrix_rank(A, tol)
    # a per-matrix tolerance broadcasts over the leading axes
    batch = np.stack([A, A])
    tols = np.array([1e-8, S[0] * 2])
    np.testing.assert_array_equal(analysis.numerical_rank(batch, tols), [3, 0])


def test_numerical_rank_edge_cases():
    assert analysis.numerical_rank(np.zeros((4, 4))) == 0
    assert analysis.numerical_rank(np.eye(3, dtype=np.int64)) == 3
    np.testing.assert_array_equal(analysis.numerical_rank(np.zeros((2, 0, 5))), [0, 0])
    z = np.array([[1, 1j], [1j, -1]])                  # rank 1 complex
    assert analysis.numerical_rank(z) == np.linalg.matrix_rank(z) == 1
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        analysis.numerical_rank(np.ones(3))


# ---------------------------------------------------------------------------
# DIET Theorem 1
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("n, D, d_h", [(32, 48, 8), (40, 16, 16), (24, 96, 30), (20, 10, 4)])
@pytest.mark.parametrize("seed", [SEED, SEED + 1])
def test_theorem1_additive_rank_at_most_d_head(n, D, d_h, seed):
    rng = np.random.default_rng(seed)
    X, P = rng.standard_normal((2, n, D))
    W_Q, W_K = rng.standard_normal((2, D, d_h))
    A_a = analysis.additive_attention(X, P, W_Q, W_K)
    rank = analysis.numerical_rank(A_a)
    assert rank <= d_h
    assert rank == min(n, D, d_h)                     # generic random: the bound is reached


@pytest.mark.parametrize("n, D, d_h", [(32, 48, 8), (16, 64, 4), (24, 24, 12), (10, 40, 6)])
def test_theorem1_appendix_b_reaches_min_dh_plus_dp_n(n, D, d_h):
    for d_p in range(0, n + 6):
        X, W_Q, W_K, P_hat = analysis.appendix_b_construction(n, D, d_h, d_p)
        assert X.shape == (n, D) and W_Q.shape == (D, d_h) and P_hat.shape == (n, d_p)
        np.testing.assert_array_equal(W_Q, W_K)
        A_r = analysis.per_head_attention(X, W_Q, W_K, P_hat)
        # diagonal: ones on the first d_h and the last d_p positions (App. B)
        expected = np.zeros(n)
        expected[:d_h] += 1
        expected[n - min(d_p, n):] += 1
        np.testing.assert_array_equal(A_r, np.diag(expected))
        assert analysis.numerical_rank(A_r) == min(d_h + d_p, n)
        if d_h < d_p and d_h < D and n >= d_h + d_p:     # the theorem's hypotheses
            assert analysis.numerical_rank(A_r) == d_h + d_p > d_h


def test_appendix_b_rejects_bad_sizes():
    with pytest.raises(ValueError, match="d_head must be <= d_model"):
        analysis.appendix_b_construction(8, 4, 6, 2)
    with pytest.raises(ValueError, match=">= 0"):
        analysis.appendix_b_construction(8, 4, 2, -1)


def test_per_head_attention_is_diet_abs_kernel():
    """A_r is DIET-ABS with P_Q = P_K = P_hat and scale 1, computed by the C kernel."""
    rng = np.random.default_rng(SEED)
    n, D, d_h, d_p = 20, 24, 6, 5
    X = rng.standard_normal((n, D))
    W_Q, W_K = rng.standard_normal((2, D, d_h))
    P_hat = rng.standard_normal((n, d_p))
    q, k = (X @ W_Q)[None, None], (X @ W_K)[None, None]
    kernel = posenc.diet_abs(q, k, P_hat[None], P_hat[None], scale=1.0)[0, 0]
    np.testing.assert_allclose(analysis.per_head_attention(X, W_Q, W_K, P_hat), kernel,
                               rtol=1e-12, atol=1e-12)


def test_additive_attention_matches_reference_absolute_input():
    reference = pytest.importorskip("posenc.reference", reason="posenc.reference not available")
    if not hasattr(reference, "absolute_input"):
        pytest.skip("posenc.reference.absolute_input not written yet")
    rng = np.random.default_rng(SEED)
    n, D, d_h = 12, 16, 4
    X, P = rng.standard_normal((2, n, D))
    W_Q, W_K = rng.standard_normal((2, D, d_h))
    ref = reference.absolute_input(X[None], P[None], W_Q[None], W_K[None], scale=1.0)[0, 0]
    np.testing.assert_allclose(analysis.additive_attention(X, P, W_Q, W_K), ref,
                               rtol=1e-12, atol=1e-12)


def test_rank_sweep_table():
    n, D, d_h = 48, 96, 8
    d_ps = [0, 1, 4, 8, 16, 40, 41, 48, 60]
    rows = analysis.rank_sweep(n, D, d_h, d_ps, seed=SEED)
    assert [r.d_p for r in rows] == d_ps
    for r in rows:
        assert r.additive <= d_h and r.positional_additive <= d_h
        assert r.bound == min(d_h + r.d_p, n)
        assert r.per_head == r.bound
        assert r.per_head_random == r.bound
        assert r.positional_per_head == min(r.d_p, n)
    assert analysis.rank_sweep(n, D, d_h, d_ps, seed=SEED) == rows   # seeded


def test_rank_report_and_main_print_the_table(capsys):
    buffer = io.StringIO()
    rows = analysis.rank_report(32, 40, 4, [0, 4, 28, 40], seed=SEED, file=buffer)
    text = buffer.getvalue()
    assert "DIET Theorem 1" in text and "min(d_h+d_p, n)" in text
    assert len(text.splitlines()) == 4 + len(rows)
    assert analysis.main(["--n", "24", "--d-model", "32", "--d-head", "4", "--d-p", "0,8,30"]) == 0
    out = capsys.readouterr().out
    assert "n=24, D=32, d_h=4" in out
    with pytest.raises(SystemExit):
        analysis.main(["--d-head", "100", "--d-model", "10"])


def test_rank_report_png(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib not installed: pip install matplotlib")
    png = tmp_path / "rank.png"
    analysis.main(["--n", "32", "--d-model", "48", "--d-head", "8", "--png", str(png)])
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


# ---------------------------------------------------------------------------
# TUPE Proposition 1
# ---------------------------------------------------------------------------

def _tables(n, rng):
    t = 5
    rel = rng.standard_normal(2 * t + 1)
    bias = rng.standard_normal(32)
    return {
        "clipped": lambda o: rel[buckets.clipped(o, t)],
        "t5": lambda o: bias[buckets.t5(o, 32, 128, True)],
        "t5_unidirectional": lambda o: bias[buckets.t5(o, 32, 128, False)],
        "random": rng.standard_normal(2 * n - 1),
        "random_complex": rng.standard_normal(2 * n - 1) + 1j * rng.standard_normal(2 * n - 1),
    }


@pytest.mark.parametrize("n", [1, 2, 3, 8, 17, 64])
@pytest.mark.parametrize("kind", ["clipped", "t5", "t5_unidirectional", "random", "random_complex"])
def test_proposition1_factorization(n, kind):
    table = _tables(n, np.random.default_rng(SEED + n))[kind]
    B = analysis.toeplitz_matrix(table, n)
    B_hat = analysis.circulant_embedding(table, n)
    G, D, Q = analysis.toeplitz_factorization(table, n)
    assert B.shape == (n, n) and B_hat.shape == (2 * n, 2 * n)
    assert G.shape == (n, 2 * n) and D.shape == (2 * n,) and Q.shape == (2 * n, 2 * n)
    # Toeplitz: B[i, j] depends on j - i only; B_hat is circulant with B top-left (eq. 12)
    values = analysis.relative_values(table, n)
    for i in range(n):
        np.testing.assert_array_equal(B[i], values[n - 1 - i:2 * n - 1 - i])
    np.testing.assert_array_equal(B_hat[:n, :n], B)
    np.testing.assert_array_equal(B_hat, np.roll(np.roll(B_hat, 1, axis=0), 1, axis=1))
    # G is the first n rows of the Vandermonde Q, G_{j,k} = exp(i pi (j+1) k / n) / 2n
    j, k = np.indices((n, 2 * n))
    np.testing.assert_allclose(G, np.exp(1j * np.pi * (j + 1) * k / n) / (2 * n), atol=1e-15)
    np.testing.assert_array_equal(G, Q[:n])
    np.testing.assert_allclose(analysis.reconstruct(G, D), B, rtol=0, atol=1e-10)
    np.testing.assert_allclose(analysis.reconstruct(Q, D), B_hat, rtol=0, atol=1e-10)
    # D: 2n times the eigenvalues of B_hat, from the FFT of its first column
    np.testing.assert_allclose(D, 2 * n * np.fft.fft(B_hat[:, 0]), atol=1e-10)


def test_toeplitz_matches_kernels_positional_terms():
    """The Toeplitz convention (offset j - i) is the one of posenc's kernels."""
    rng = np.random.default_rng(SEED)
    n, t = 20, 4
    zeros = np.zeros((1, 1, n, 3))
    bias = rng.standard_normal((1, 32))
    kernel = posenc.t5(zeros, zeros, bias, num_buckets=32, max_distance=128)[0, 0]
    np.testing.assert_array_equal(
        analysis.toeplitz_matrix(lambda o: bias[0, buckets.t5(o)], n), kernel)
    rel = rng.standard_normal((1, 2 * t + 1))
    kernel = posenc.diet_rel(zeros, zeros, rel, max_distance=t)[0, 0]
    # DIET-REL reads R_{i-j}: the offset j - i reversed
    np.testing.assert_array_equal(
        analysis.toeplitz_matrix(lambda o: rel[0, buckets.clipped(-o, t)], n), kernel)


def test_relative_values_forms_and_errors():
    n = 4
    offsets = np.arange(-(n - 1), n)
    as_dict = {int(o): float(o) ** 2 for o in offsets}
    np.testing.assert_array_equal(analysis.relative_values(as_dict, n), offsets ** 2)
    np.testing.assert_array_equal(analysis.relative_values(lambda o: 2 * o, n), 2 * offsets)
    np.testing.assert_array_equal(analysis.relative_values(list(offsets), n), offsets)
    with pytest.raises(ValueError, match="no value for offsets"):
        analysis.relative_values({0: 1.0}, n)
    with pytest.raises(ValueError, match=r"expected shape \(7,\)"):
        analysis.relative_values(np.zeros(5), n)
    with pytest.raises(ValueError, match="n must be >= 1"):
        analysis.toeplitz_matrix(np.zeros(1), 0)


def test_method_ranks_theorem_1_across_methods():
    """Plain attention and RoPE (a rotation of q and k) stay at d_h; the biases of the
    offset -- T5's, ALiBi's, KERPLE's, any relative_bias -- lift the logits to n."""
    from posenc import analysis
    rows = {row.method: row for row in analysis.method_ranks(n=48, d_head=8)}
    assert rows["content"].logits == rows["rope"].logits == 8
    assert rows["content"].positional == 0
    for method in ("t5", "alibi", "kerple", "relative_bias", "diet_rel"):
        assert rows[method].logits == rows[method].positional == 48, method
    text = analysis.format_method_ranks(list(rows.values()), 48, 8)
    assert "rope" in text and "alibi" in text
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        analysis.method_ranks(["nope"], n=8, d_head=4)
