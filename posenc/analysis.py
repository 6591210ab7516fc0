"""Rank and structure of positional attention, numerically (NumPy only).

Two results of the papers behind posenc, checked on concrete matrices:

* DIET (Chen et al. 2021), **Theorem 1**: attention with the position added to
  the input, ``A_a = (X + P) W_Q W_K^T (X + P)^T``, has ``rank(A_a) <= d_h``
  for any ``X, P, W_Q, W_K``; attention with a per-head position term,
  ``A_r = X W_Q W_K^T X^T + P_hat P_hat^T``, reaches
  ``rank(A_r) = min(d_h + d_p, n)`` for the construction of the paper's
  Appendix B (:func:`appendix_b_construction`).  :func:`rank_sweep` tabulates
  both over ``d_p`` in the manner of the paper's Figures 2 (whole attention)
  and 8 (positional attention only); :func:`rank_report` prints the table and
  optionally draws it; :func:`main` is ``python -m posenc rank``.
* TUPE (Ke et al. 2020), **Proposition 1**: the Toeplitz matrix
  ``B[j, k] = b_{k-j}`` of any relative table embeds in a ``2n x 2n``
  circulant ``B_hat`` (eq. 12), which a Vandermonde/DFT matrix diagonalises:
  ``B_hat = Q D Q^*`` and ``B = G D G^*`` with ``G`` the first ``n`` rows of
  ``Q`` (:func:`toeplitz_matrix`, :func:`circulant_embedding`,
  :func:`toeplitz_factorization`).

matplotlib is imported only when a PNG is asked for.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable, Iterable, NamedTuple, Sequence, Union

import numpy as np

__all__ = [
    "numerical_rank",
    "additive_attention",
    "per_head_attention",
    "appendix_b_construction",
    "RankRow",
    "rank_sweep",
    "format_rank_table",
    "rank_report",
    "main",
    "relative_values",
    "toeplitz_matrix",
    "circulant_embedding",
    "toeplitz_factorization",
    "reconstruct",
    "MethodRank",
    "method_ranks",
    "format_method_ranks",
]


# ---------------------------------------------------------------------------
# Numerical rank
# ---------------------------------------------------------------------------

def numerical_rank(A, tol=None):
    """Number of singular values of ``A`` above ``tol``, batched over leading axes.

    ``A`` has shape ``(..., M, N)``; the result is an ``int`` for a 2-D input
    and an integer array of shape ``A.shape[:-2]`` otherwise.  The default
    tolerance is the one of :func:`numpy.linalg.matrix_rank`:
    ``S.max() * max(M, N) * eps`` per matrix, ``eps`` of the dtype of the
    singular values (float64 for integer input).  ``tol`` may be a scalar or
    an array broadcastable to the leading shape (an absolute threshold, as in
    ``matrix_rank``).  An empty matrix (``M`` or ``N`` zero) has rank 0.
    """
    A = np.asarray(A)
    if A.ndim < 2:
        raise ValueError(f"A must have at least 2 dimensions (..., M, N), got shape {A.shape}")
    if not (np.issubdtype(A.dtype, np.floating) or np.issubdtype(A.dtype, np.complexfloating)):
        A = A.astype(np.float64)
    lead, (M, N) = A.shape[:-2], A.shape[-2:]
    if M == 0 or N == 0:
        ranks = np.zeros(lead, dtype=np.intp)
    else:
        S = np.linalg.svd(A, compute_uv=False)
        if tol is None:
            tol = S.max(axis=-1, keepdims=True) * max(M, N) * np.finfo(S.dtype).eps
        else:
            tol = np.asarray(tol)[..., np.newaxis]
        ranks = np.count_nonzero(S > tol, axis=-1)
    return int(ranks) if A.ndim == 2 else ranks


# ---------------------------------------------------------------------------
# DIET Theorem 1
# ---------------------------------------------------------------------------

def additive_attention(X, P, W_Q, W_K):
    """``A_a = (X + P) W_Q W_K^T (X + P)^T``: position added at the input (DIET Thm. 1).

    ``X, P: (n, D)``, ``W_Q, W_K: (D, d_h)``; returns ``(n, n)``.  Unscaled, as
    in the theorem (a scale does not change the rank).
    """
    H = np.asarray(X) + np.asarray(P)
    return (H @ W_Q) @ (H @ W_K).T


def per_head_attention(X, W_Q, W_K, P_hat):
    """``A_r = X W_Q W_K^T X^T + P_hat P_hat^T``: position per head (DIET Thm. 1).

    ``X: (n, D)``, ``W_Q, W_K: (D, d_h)``, ``P_hat: (n, d_p)``.  This is DIET-ABS
    (eq. 1) with ``P_Q = P_K = P_hat`` and scale 1, i.e.
    ``posenc.diet_abs(X W_Q, X W_K, P_hat, P_hat, scale=1)``.
    """
    return (X @ W_Q) @ (X @ W_K).T + P_hat @ P_hat.T


def appendix_b_construction(n: int, d_model: int, d_head: int, d_p: int):
    """The matrices of DIET Appendix B (proof of Theorem 1, second claim).

    Returns ``(X, W_Q, W_K, P_hat)`` with, as in the proof:

    * ``W_Q = W_K`` (``D x d_h``): first ``d_h`` rows the identity, the other
      ``D - d_h`` rows zero, so ``W_Q W_K^T = diag(I_{d_h}, 0)``;
    * ``X`` (``n x D``): "the first ``d`` rows form an identity matrix and rest
      are zeros", i.e. ``X = I_{n x D}`` (``numpy.eye(n, D)``; for ``n < D``
      the same rectangular identity, which the proof's ``n >= d_h + d_p > D``
      never needs), so ``X W_Q W_K^T X^T = diag(I_{d_h}, 0_{n-d_h})``;
    * ``P_hat`` (``n x d_p``): zero in its first ``n - d_p`` rows and the
      identity ``I_{d_p}`` in its last ``d_p`` rows, so
      ``P_hat P_hat^T = diag(0_{n-d_p}, I_{d_p})``.  The proof writes
      ``P_hat = [0_{d,n-d_p}, I_{d_p,d_p}]`` ("zeros in the first ``n - d_p``
      columns"), which only type-checks as this row-block matrix, and whose
      product ``P_hat P_hat^T`` is the one the proof shows.  For ``d_p >= n``
      (the proof's own first choice ``d_p = n, P_hat = I``) ``P_hat`` is
      ``[0_{n, d_p-n}, I_n]``, so ``P_hat P_hat^T = I_n``.

    The sum is diagonal with ones on the first ``d_h`` and the last ``d_p``
    positions (twos where they overlap), hence
    ``rank(A_r) = min(d_h + d_p, n)`` -- ``d_h + d_p`` when ``n >= d_h + d_p``
    as the theorem assumes.  Needs ``d_head <= d_model``.
    """
    n, d_model, d_head, d_p = (int(v) for v in (n, d_model, d_head, d_p))
    if min(n, d_model, d_head, d_p) < 0:
        raise ValueError(f"sizes must be >= 0, got n={n}, d_model={d_model}, "
                         f"d_head={d_head}, d_p={d_p}")
    if d_head > d_model:
        raise ValueError(f"d_head must be <= d_model, got d_head={d_head} > d_model={d_model}")
    W_Q = np.eye(d_model, d_head)
    W_K = W_Q.copy()
    X = np.eye(n, d_model)
    P_hat = np.zeros((n, d_p))
    rows = min(n, d_p)
    P_hat[n - rows:, d_p - rows:] = np.eye(rows)
    return X, W_Q, W_K, P_hat


class RankRow(NamedTuple):
    """One row of :func:`rank_sweep`: ranks of ``n x n`` attention matrices.

    ``additive``: ``(X+P) W_Q W_K^T (X+P)^T``, random (Theorem 1: ``<= d_h``).
    ``per_head``: ``X W_Q W_K^T X^T + P_hat P_hat^T`` of Appendix B.
    ``per_head_random``: the same sum for random ``X, W_Q, W_K, P_hat``.
    ``bound``: ``min(d_h + d_p, n)``, what ``per_head`` reaches.
    ``positional_additive``: ``P W_Q W_K^T P^T`` (Fig. 8, input position).
    ``positional_per_head``: ``P_Q P_K^T`` with ``P_Q, P_K: (n, d_p)`` random
    (Fig. 8, DIET-ABS: ``min(d_p, n)``).
    """

    d_p: int
    additive: int
    per_head: int
    per_head_random: int
    bound: int
    positional_additive: int
    positional_per_head: int


def default_d_p_values(n: int, d_head: int) -> list:
    """``d_p`` from 0 past ``n - d_h`` (where the bound saturates at ``n``)."""
    points = {0, 1, d_head // 2, d_head, n - d_head, n, n + d_head // 2}
    points |= {n * f // 8 for f in range(1, 8)}
    return sorted(p for p in points if p >= 0)


def rank_sweep(n: int = 128, d_model: int = 768, d_head: int = 64,
               d_p_values: Iterable[int] | None = None, seed: int = 0, tol=None) -> list:
    """Ranks of attention with input-additive vs per-head position, over ``d_p``.

    The table behind DIET's Figures 2 and 8 as exact numbers: for each ``d_p``
    a :class:`RankRow`.  Random matrices are standard normal (``seed``); the
    additive ranks do not depend on ``d_p`` and are drawn once.  Ranks use
    :func:`numerical_rank` with ``tol`` (default: ``matrix_rank``'s).
    Defaults: BERT-base widths (``D = 768``, ``d_h = 64``), ``n = 128``.
    """
    n, d_model, d_head = int(n), int(d_model), int(d_head)
    if d_p_values is None:
        d_p_values = default_d_p_values(n, d_head)
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d_model))
    P = rng.standard_normal((n, d_model))
    W_Q = rng.standard_normal((d_model, d_head)) / np.sqrt(d_model)
    W_K = rng.standard_normal((d_model, d_head)) / np.sqrt(d_model)
    additive = numerical_rank(additive_attention(X, P, W_Q, W_K), tol)
    positional_additive = numerical_rank((P @ W_Q) @ (P @ W_K).T, tol)
    rows = []
    for d_p in d_p_values:
        d_p = int(d_p)
        construction = per_head_attention(*appendix_b_construction(n, d_model, d_head, d_p))
        P_hat = rng.standard_normal((n, d_p))
        P_Q, P_K = rng.standard_normal((2, n, d_p))
        rows.append(RankRow(
            d_p=d_p,
            additive=additive,
            per_head=numerical_rank(construction, tol),
            per_head_random=numerical_rank(per_head_attention(X, W_Q, W_K, P_hat), tol),
            bound=min(d_head + d_p, n),
            positional_additive=positional_additive,
            positional_per_head=numerical_rank(P_Q @ P_K.T, tol),
        ))
    return rows


_COLUMNS = (
    ("d_p", "d_p"),
    ("additive", "additive"),
    ("per_head", "per-head (App. B)"),
    ("per_head_random", "per-head (random)"),
    ("bound", "min(d_h+d_p, n)"),
    ("positional_additive", "pos. additive"),
    ("positional_per_head", "pos. per-head"),
)


def format_rank_table(rows: Sequence[RankRow], n: int, d_model: int, d_head: int) -> str:
    """The sweep as a plain-text table with a header naming the sizes."""
    widths = [max(len(title), 5) for _, title in _COLUMNS]
    lines = [
        f"DIET Theorem 1: rank of n x n attention, n={n}, D={d_model}, d_h={d_head}",
        "  additive = (X+P) W_Q W_K^T (X+P)^T (<= d_h); "
        "per-head = X W_Q W_K^T X^T + P_hat P_hat^T;",
        "  pos. additive = P W_Q W_K^T P^T; pos. per-head = P_Q P_K^T (DIET Fig. 8)",
        "  ".join(title.rjust(w) for (_, title), w in zip(_COLUMNS, widths)),
    ]
    for row in rows:
        lines.append("  ".join(str(getattr(row, field)).rjust(w)
                               for (field, _), w in zip(_COLUMNS, widths)))
    return "\n".join(lines)


def _plot_rank_rows(rows: Sequence[RankRow], n: int, d_model: int, d_head: int, png: str):
    """Ranks against d_p: one panel per DIET figure (2: attention, 8: positional)."""
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:   # pragma: no cover - depends on the environment
        from posenc.plot import INSTALL_HINT

        raise ImportError(f"saving a PNG: {INSTALL_HINT}") from exc
    d_p = [r.d_p for r in rows]
    fig = Figure(figsize=(10, 4), layout="constrained")
    left, right = fig.subplots(1, 2)
    left.plot(d_p, [r.bound for r in rows], "k--", label="min(d_h + d_p, n)")
    left.plot(d_p, [r.per_head for r in rows], "o-", label="per-head, App. B")
    left.plot(d_p, [r.per_head_random for r in rows], "x:", label="per-head, random")
    left.plot(d_p, [r.additive for r in rows], "s-", label="input-additive")
    left.axhline(d_head, color="grey", lw=0.8)
    left.set_title("attention (DIET Fig. 2, Thm. 1)")
    right.plot(d_p, [min(v, n) for v in d_p], "k--", label="min(d_p, n)")
    right.plot(d_p, [r.positional_per_head for r in rows], "o-", label="P_Q P_K^T (DIET-ABS)")
    right.plot(d_p, [r.positional_additive for r in rows], "s-", label="P W_Q W_K^T P^T")
    right.set_title("positional attention (DIET Fig. 8)")
    for ax in (left, right):
        ax.set_xlabel("d_p")
        ax.set_ylabel("numerical rank")
        ax.legend(fontsize=8)
    fig.suptitle(f"n={n}, D={d_model}, d_h={d_head}")
    fig.savefig(png, dpi=100)
    return png


def rank_report(n: int = 128, d_model: int = 768, d_head: int = 64,
                d_p_values: Iterable[int] | None = None, seed: int = 0,
                png: str | None = None, file=None) -> list:
    """Print the :func:`rank_sweep` table (to ``file``, default stdout) and
    save it as a PNG plot when ``png`` is a path.  Returns the rows."""
    rows = rank_sweep(n, d_model, d_head, d_p_values, seed)
    print(format_rank_table(rows, n, d_model, d_head), file=file or sys.stdout)
    if png:
        _plot_rank_rows(rows, n, d_model, d_head, png)
        print(f"saved {png}", file=file or sys.stdout)
    return rows


class MethodRank(NamedTuple):
    """Numerical ranks of one head's n x n logits of a method and of its positional
    term (the logits minus the content term s q.k^T), for random inputs."""

    method: str
    logits: int
    positional: int


def method_ranks(methods: Sequence[str] | None = None, n: int = 128, d_head: int = 64,
                 seed: int = 0, tol=None) -> list:
    """Theorem 1 across posenc's methods: the rank of one head's logits A (n x n,
    random q, k of width d_h and the method's example parameters, through the C
    kernels) and of its positional term A - s q k^T.  Plain attention and RoPE (a
    rotation of q and k: A = (R q)(R k)^T) stay at most d_h; a per-head positional
    term lifts the logits past it -- DIET-ABS's by its rank d_p, a bias of the
    offset (T5, DIET-REL, ALiBi, KERPLE, relative_bias) up to n."""
    import posenc
    from ._examples import make_inputs
    from ._registry import REGISTRY

    methods = list(REGISTRY) if methods is None else list(methods)
    rows = []
    for method in methods:
        if method not in REGISTRY:
            raise ValueError(f"unknown method {method!r}; expected one of {', '.join(REGISTRY)}")
        args, kwargs = make_inputs(method, 1, 1, n, n, d_head, rng=np.random.default_rng(seed),
                                   max_distance=n, t5_max_distance=2 * n,
                                   num_buckets=32, att_span=n)
        logits = getattr(posenc, method)(*args, **kwargs)[0, 0]
        scale = REGISTRY[method].default_scale(d_head)
        positional = logits - posenc.content(args[0], args[1], scale=scale)[0, 0]
        rows.append(MethodRank(method, int(numerical_rank(logits, tol)),
                               int(numerical_rank(positional, tol))))
    return rows


def format_method_ranks(rows: Sequence[MethodRank], n: int, d_head: int) -> str:
    width = max(len("method"), *(len(r.method) for r in rows))
    lines = [f"rank of one head's n x n logits A and positional term A - s q k^T, n={n}, "
             f"d_h={d_head} (random q, k; DIET Theorem 1: q.k alone, or rotated, <= d_h)",
             f"{'method'.ljust(width)}  {'logits':>6}  {'positional':>10}"]
    lines += [f"{r.method.ljust(width)}  {r.logits:>6}  {r.positional:>10}" for r in rows]
    return "\n".join(lines)


def _int_list(text: str) -> list:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")


def main(argv=None) -> int:
    """``python -m posenc rank``: DIET Theorem 1 on random and constructed matrices."""
    parser = argparse.ArgumentParser(
        prog="python -m posenc rank",
        description="Rank of attention with input-additive vs per-head position "
                    "(DIET Theorem 1, Appendix B, Figures 2 and 8).")
    parser.add_argument("--n", type=int, default=128, help="sequence length (default 128)")
    parser.add_argument("--d-model", type=int, default=768, help="model width D (default 768)")
    parser.add_argument("--d-head", type=int, default=64, help="head width d_h (default 64)")
    parser.add_argument("--d-p", type=_int_list, default=None, metavar="LIST",
                        help="comma-separated d_p values (default: 0 .. n + d_h/2)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--png", metavar="PATH", default=None, help="also save a plot here")
    parser.add_argument("--methods", nargs="*", default=None, metavar="METHOD",
                        help="also the ranks of these methods' logits (no name: every method)")
    args = parser.parse_args(argv)
    for name in ("n", "d_model", "d_head"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.d_head > args.d_model:
        parser.error("--d-head must be <= --d-model")
    if args.d_p is not None and any(v < 0 for v in args.d_p):
        parser.error("--d-p values must be >= 0")
    rank_report(args.n, args.d_model, args.d_head, args.d_p, args.seed, args.png)
    if args.methods is not None:
        try:
            rows = method_ranks(args.methods or None, args.n, args.d_head, args.seed)
        except ValueError as error:
            parser.error(str(error))
        print()
        print(format_method_ranks(rows, args.n, args.d_head))
    return 0


# ---------------------------------------------------------------------------
# TUPE Proposition 1
# ---------------------------------------------------------------------------

RelativeTable = Union[Callable, np.ndarray, Sequence, dict]


def relative_values(table: RelativeTable, n: int) -> np.ndarray:
    """``b_o`` for the offsets ``o = -(n-1) .. n-1`` (``o = j - i``), shape ``(2n-1,)``.

    ``table`` is one of: a callable mapping an int64 offset array to values
    (e.g. ``lambda o: bias[posenc.buckets.t5(o)]``); a dict ``{offset: value}``
    (missing offsets are an error); or an array of the ``2n - 1`` values in
    offset order.
    """
    n = int(n)
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    offsets = np.arange(-(n - 1), n, dtype=np.int64)
    if callable(table):
        values = np.asarray(table(offsets))
    elif isinstance(table, dict):
        missing = [int(o) for o in offsets if int(o) not in table]
        if missing:
            raise ValueError(f"table has no value for offsets {missing[:5]}"
                             f"{' ...' if len(missing) > 5 else ''} (needs -{n - 1} .. {n - 1})")
        values = np.asarray([table[int(o)] for o in offsets])
    else:
        values = np.asarray(table)
    if values.shape != offsets.shape:
        raise ValueError(f"table must give one value per offset -(n-1)..n-1: expected shape "
                         f"({2 * n - 1},), got {values.shape}")
    return values


def toeplitz_matrix(table: RelativeTable, n: int) -> np.ndarray:
    """``B[i, j] = b_{j-i}`` (``n x n``): TUPE's ``B_{i,j} = b_{j-i}``, SPEC's offset ``j - i``."""
    values = relative_values(table, n)
    i, j = np.indices((n, n))
    return values[j - i + n - 1]


def circulant_embedding(table: RelativeTable, n: int) -> np.ndarray:
    """The ``2n x 2n`` circulant ``B_hat`` of TUPE eq. (12), top-left block ``B``.

    ``B_hat[j, k] = b_{k-j}`` for ``|k-j| <= n``, ``b_{k-j-2n}`` for ``k-j > n``,
    ``b_{k-j+2n}`` for ``k-j < -n``, with ``b_{-n} = b_n = b_0``.  Each row is
    the previous one rotated right by one.
    """
    values = relative_values(table, n)
    # c[r] = B_hat[j, j + r mod 2n]: b_0 .. b_{n-1}, then b_n := b_0, then b_{-(n-1)} .. b_{-1}
    c = np.concatenate([values[n - 1:], values[n - 1:n], values[:n - 1]])
    j, k = np.indices((2 * n, 2 * n))
    return c[(k - j) % (2 * n)]


def toeplitz_factorization(table: RelativeTable, n: int):
    """TUPE Proposition 1: ``(G, D, Q)`` with ``B = G diag(D) G^*`` and ``B_hat = Q diag(D) Q^*``.

    ``Q[j, k] = exp(i pi (j+1) k / n) / (2n)`` (``2n x 2n``, the paper's
    Vandermonde/DFT matrix; its row ``j`` is position ``j + 1``), ``G = Q[:n]``
    (``n x 2n``), and ``D`` (length ``2n``) the eigenvalues of the circulant
    ``B_hat`` times ``2n`` (the ``1/(2n)`` on both ``G`` and ``G^*`` leave one
    factor to undo): ``D = 2n * fft(B_hat[:, 0])``, the FFT of the circulant's
    first column.  Complex; ``D`` is real when the table is symmetric.
    """
    n = int(n)
    B_hat_first_column = circulant_embedding(table, n)[:, 0]
    D = 2 * n * np.fft.fft(B_hat_first_column)
    position = np.arange(1, 2 * n + 1)[:, None]      # j + 1
    frequency = np.arange(2 * n)[None, :]             # k
    Q = np.exp(1j * np.pi * position * frequency / n) / (2 * n)
    return Q[:n], D, Q


def reconstruct(G: np.ndarray, D: np.ndarray) -> np.ndarray:
    """``G diag(D) G^*``."""
    return (G * D) @ G.conj().T


if __name__ == "__main__":
    raise SystemExit(main())
