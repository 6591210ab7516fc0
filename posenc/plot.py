"""Pictures of positional attention: per-head heatmaps, segment patterns.

What is drawn.  The *positional term* of a method is its logits with the
content term removed, computed through posenc's own kernels::

    positional = posenc.<method>(q, k, **params, scale=s) - posenc.content(q, k, scale=s)

with ``s`` the method's scale (given, or its SPEC default).  For the methods
whose positional term does not involve ``q`` or ``k`` -- ``t5``, ``tupe``,
``diet_abs``, ``diet_rel`` (:data:`CONTENT_FREE`) -- ``q = k = 0`` by default,
so the content term is zero and the picture is the learned bias itself
(TUPE Fig. 6, DIET Figs. 4, 6, 7).  For ``shaw``, ``m4``, ``deberta`` (and the
multiplicative ``m2``, ``m4m``) the positional term depends on the content:
``s q_i.a_ij`` (Shaw), ``s (q_i.a_ij + k_j.a_ij)`` (M4), the c2p + p2c terms
(DeBERTa), ``s q_i.k_j (rel_ij - 1)`` (M2), ``s q_i.k_j ((q_i.a_ij)(k_j.a_ij) - 1)``
(M4M); these are drawn for the ``q``, ``k`` given in the parameters, else for
standard-normal random ``q``, ``k`` (one sample, batch 0), and the titles say so.

Each head shows either ``softmax(positional)`` over keys (the default, the
position-only attention) or the raw positional term (``raw=True``).

matplotlib is optional (``pip install matplotlib``, or the ``plot`` extra): the functions that
compute (:func:`random_params`, :func:`load_params`, :func:`positional_term`,
...) work without it; the ones that draw raise an ImportError saying how to
install it.  Figures are built with ``matplotlib.figure.Figure`` directly, no
pyplot state; :func:`main` is ``python -m posenc plot``.
"""

from __future__ import annotations

import argparse
import inspect
import os
from typing import Optional, Sequence

import numpy as np

import posenc
from posenc._kinds import Picture
from posenc._registry import REGISTRY, Segments

__all__ = [
    "POSITIONAL_METHODS",
    "CONTENT_FREE",
    "method_arguments",
    "random_params",
    "save_params",
    "load_params",
    "positional_term",
    "softmax",
    "positional_attention",
    "two_segments",
    "plot_heads",
    "plot_positional",
    "plot_segment_attention",
    "main",
]

#: Methods with a positional term (``content`` has none).
POSITIONAL_METHODS = tuple(name for name, spec in REGISTRY.items() if spec.terms)
#: Methods whose positional term does not depend on q or k: a sum with no
#: query- or key-side vector table.
CONTENT_FREE = tuple(name for name in POSITIONAL_METHODS if not REGISTRY[name].product
                     and not any(term.reads_qk for term in REGISTRY[name].terms))
_SEGMENT_METHODS = tuple(name for name, spec in REGISTRY.items() if spec.term(Segments))
INSTALL_HINT = ('plotting needs matplotlib, which is not installed: pip install matplotlib, '
                'or pip install ".[plot]" in posenc\'s checkout')


def _check_method(method: str) -> str:
    if method not in POSITIONAL_METHODS:
        hint = " (plain attention has no positional term)" if method == "content" else ""
        raise ValueError(f"unknown method {method!r}{hint}; expected one of "
                         f"{', '.join(POSITIONAL_METHODS)}")
    return method


def method_arguments(method: str) -> list:
    """The argument names of ``posenc.<method>`` besides ``q``, ``k``, ``out``."""
    signature = inspect.signature(getattr(posenc, _check_method(method)))
    return [name for name in signature.parameters if name not in ("q", "k", "out")]


# ---------------------------------------------------------------------------
# Parameters: random, saved, loaded
# ---------------------------------------------------------------------------

def random_params(method: str, H: int, n: int, rng=None, *, d: int = 64,
                  segments: bool = False) -> dict:
    """Random parameters of ``method`` for ``H`` heads and length ``n``.

    Returns a dict of the method's arguments (arrays and keywords, float64),
    ready for ``posenc.<method>(q, k, **params)`` with ``q, k: (B, H, n, d)``.
    Standard normal, scaled so that each head's positional logits have a
    standard deviation of about 1-2 (so a softmax shows a pattern).
    Relative methods get ``max_distance = min(16, n - 1)`` (``att_span`` for
    DeBERTa); T5 its defaults (32 buckets, distance 128); TUPE is TUPE-A with
    the [CLS] reset ``theta`` (its Fig. 6).  ``segments=True`` adds a random
    ``segment_table (H, 2, 2)`` for ``diet_abs`` / ``diet_rel`` (DIET Fig. 6).
    """
    _check_method(method)
    rng = np.random.default_rng(rng)
    H, n, d = int(H), int(n), int(d)
    if H < 1 or n < 1 or d < 1:
        raise ValueError(f"H, n, d must be >= 1, got H={H}, n={n}, d={d}")
    spec = REGISTRY[method]
    t = max(1, min(16, n - 1))
    params, rows = {}, None
    if spec.map is not None and any(term.uses_map and set(term.tensors) & set(spec.plot_init)
                                    for term in spec.terms):
        # a clipped distance or DeBERTa's span is t; T5 keeps its defaults
        defaults = dict(spec.params)
        params = spec.map.picture(t, {name: defaults[name] for name in spec.map.params})
        rows = spec.map.rows({**defaults, **params})
    ctx = Picture(rng, H, n, d, rows, spec.product, spec.plot_init)
    for term in spec.terms:
        params.update(term.picture(ctx, spec, params))
    if segments:
        if method not in _SEGMENT_METHODS:
            raise ValueError(f"segments are a DIET feature ({', '.join(_SEGMENT_METHODS)}), "
                             f"not {method!r}")
        params["segment_table"] = 3.0 * rng.standard_normal((H, 2, 2))
    return params


def save_params(path, params: dict) -> None:
    """Write ``params`` to an ``.npz`` (keywords as 0-d arrays; ``None`` left out)."""
    np.savez(path, **{name: np.asarray(value) for name, value in params.items()
                      if value is not None})


def _infer_keywords(method: str, params: dict) -> None:
    """Fill keywords that the table shapes determine, when the file lacks them."""
    spec = REGISTRY[method]
    if spec.map is None:
        return
    for term in spec.terms:
        table = params.get(term.tensors[0])
        if term.uses_map and table is not None and np.ndim(table) >= 2:
            for name, value in spec.map.infer(np.shape(table)[1]).items():
                params.setdefault(name, value)
            return


def load_params(path, method: str) -> dict:
    """Parameters of ``method`` from an ``.npz`` whose array names are its arguments.

    Besides the method's arguments (``rel``, ``bias``, ``pos_q``, ...,
    keywords such as ``max_distance`` as 0-d arrays), the file may hold ``q``
    and ``k`` to draw the positional term of a content-dependent method for
    those inputs.  ``max_distance`` (clipped tables), ``att_span`` (DeBERTa)
    and ``num_buckets`` are inferred from the table shapes when absent.  An
    unknown or missing name is a ValueError.
    """
    allowed = method_arguments(method) + ["q", "k"]
    keywords = {name for name, _ in REGISTRY[method].params}
    with np.load(path, allow_pickle=False) as data:
        unknown = sorted(set(data.files) - set(allowed))
        if unknown:
            raise ValueError(f"{path}: unknown array names {unknown} for {method}; "
                             f"expected among {allowed}")
        params = {}
        for name in data.files:
            value = data[name]
            if value.ndim == 0:            # a keyword saved as a 0-d array
                value = value.item()
            elif value.ndim == 1 and name in keywords:   # a pair (a 2-D max_distance)
                value = tuple(value.tolist())
            params[name] = value
    _infer_keywords(method, params)
    required = [name for name, p in inspect.signature(getattr(posenc, method)).parameters.items()
                if p.default is inspect.Parameter.empty and name not in ("q", "k")]
    missing = [name for name in required if name not in params]
    if missing:
        raise ValueError(f"{path}: {method} needs {missing}, the file has {sorted(data.files)}")
    return params


# ---------------------------------------------------------------------------
# The positional term
# ---------------------------------------------------------------------------

def _heads_and_length(method: str, params: dict, n: Optional[int]) -> tuple:
    """(H, n) from the parameter arrays (head axis: H or 1) and the requested n."""
    spec = REGISTRY[method]
    heads = [np.shape(v)[spec.head_axis(name)] for name, v in params.items()   # with a head axis
             if isinstance(v, np.ndarray) and v.ndim > spec.head_axis(name)
             and name in spec.grad_fields and name not in spec.constant
             and name not in ("q", "k")]
    heads += [np.shape(params[name])[-3] for name in ("q", "k")    # given q, k: (B,) H, n, d
              if np.ndim(params.get(name)) >= 3]
    H = max(heads, default=1)
    dense = params.get("pos_q")
    if dense is not None:
        n_dense = np.shape(dense)[1]
        if n is not None and int(n) != n_dense:
            raise ValueError(f"n={n} but pos_q has length {n_dense} ({method} is absolute)")
        n = n_dense
    if n is None:
        n = 64
    return H, int(n)


def _vector_width(method: str, params: dict, d: Optional[int]) -> int:
    """d: the width of the method's parameters of q's depth (its terms' depth_tensors),
    else the given d, else 64."""
    for term in REGISTRY[method].terms:
        for name in term.depth_tensors:
            if name in params:
                return int(np.shape(params[name])[-1])
    return 64 if d is None else int(d)


def _inputs(method, params, H, n, d, rng):
    """q, k of shape (1, H, n, d): given, zero (content-free methods) or random."""
    q, k = params.get("q"), params.get("k")
    if q is not None or k is not None:
        if q is None or k is None:
            raise ValueError("give both q and k, or neither")
        q, k = (np.asarray(a, dtype=np.float64) for a in (q, k))
        q, k = (a[np.newaxis] if a.ndim == 3 else a for a in (q, k))
        return q[:1], k[:1], "given q, k"
    shape = (1, H, n, d)
    if method in CONTENT_FREE:
        return np.zeros(shape), np.zeros(shape), None
    rng = np.random.default_rng(rng)
    return rng.standard_normal(shape), rng.standard_normal(shape), "random q, k"


def positional_term(method: str, params: dict, n: Optional[int] = None, *,
                    d: Optional[int] = None, rng=None,
                    segment_q=None, segment_k=None, return_note: bool = False):
    """The positional term ``(H, n, n)`` of ``method`` (module docstring: what it is).

    ``params`` as from :func:`random_params` / :func:`load_params` (may hold
    ``q``, ``k``, ``scale``).  ``n`` is the length for relative methods
    (default 64; absolute ones take it from ``pos_q``); ``d`` the width of
    zero/random ``q``, ``k`` (default: the parameters' vector width, else 64);
    ``rng`` seeds the random ``q``, ``k`` of content-dependent methods.  With a
    ``segment_table``, segment ids default to :func:`two_segments` (second
    segment at ``n // 2``).  ``return_note=True`` also returns what ``q, k``
    were (``None``, ``"random q, k"`` or ``"given q, k"``).
    """
    _check_method(method)
    H, n = _heads_and_length(method, params, n)
    q, k, note = _inputs(method, params, H, n, _vector_width(method, params, d), rng)
    kwargs = {name: value for name, value in params.items()
              if name not in ("q", "k", "segment_q", "segment_k")}
    scale = kwargs.pop("scale", None)
    if scale is None:
        scale = REGISTRY[method].default_scale(q.shape[-1])
    if kwargs.get("segment_table") is not None:
        default_q, default_k = two_segments(n)
        segment_q = params.get("segment_q", default_q) if segment_q is None else segment_q
        segment_k = params.get("segment_k", default_k) if segment_k is None else segment_k
        kwargs["segment_q"] = np.asarray(segment_q).reshape(-1, n)[:1]
        kwargs["segment_k"] = np.asarray(segment_k).reshape(-1, n)[:1]
    logits = getattr(posenc, method)(q, k, **kwargs, scale=scale)
    term = (logits - posenc.content(q, k, scale=scale))[0]
    term = np.broadcast_to(term, (H, n, n)).copy()
    return (term, note) if return_note else term


def softmax(logits: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically stable softmax along ``axis``."""
    shifted = logits - logits.max(axis=axis, keepdims=True)
    weights = np.exp(shifted)
    return weights / weights.sum(axis=axis, keepdims=True)


def positional_attention(method: str, params: dict, n: Optional[int] = None, **kwargs):
    """``softmax(positional_term(...))`` over keys: the position-only attention ``(H, n, n)``."""
    return softmax(positional_term(method, params, n, **kwargs))


def two_segments(n: int = 32, start: Optional[int] = None) -> tuple:
    """Segment ids ``(1, n)`` for query and key: 0 before ``start``, 1 from it (DIET Fig. 6)."""
    start = n // 2 if start is None else int(start)
    if not 0 <= start <= n:
        raise ValueError(f"segment start must be in [0, {n}], got {start}")
    ids = (np.arange(n) >= start).astype(np.int64)[np.newaxis]
    return ids, ids.copy()


# ---------------------------------------------------------------------------
# Drawing
# ---------------------------------------------------------------------------

def _figure_class():
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError(INSTALL_HINT) from exc
    return Figure


def plot_heads(matrices, *, titles: Optional[Sequence[str]] = None, ncols: Optional[int] = None,
               raw: bool = False, suptitle: str = "", boundaries: Sequence[float] = ()):
    """A grid of heatmaps, one per head of ``matrices (H, n, m)``; returns a Figure.

    ``raw=False``: attention weights, colour scale [0, max]; ``raw=True``: a
    diverging scale centred on 0.  ``boundaries`` draws lines (e.g. a segment
    start) on both axes.
    """
    Figure = _figure_class()
    matrices = np.asarray(matrices)
    if matrices.ndim == 2:
        matrices = matrices[np.newaxis]
    H = matrices.shape[0]
    ncols = min(H, 4) if ncols is None else max(1, int(ncols))
    nrows = -(-H // ncols)
    fig = Figure(figsize=(3.2 * ncols + 0.8, 3.0 * nrows + 0.6), layout="constrained")
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
    if raw:
        bound = float(np.abs(matrices).max()) or 1.0
        style = {"cmap": "RdBu_r", "vmin": -bound, "vmax": bound}
    else:
        style = {"cmap": "viridis", "vmin": 0.0, "vmax": float(matrices.max()) or 1.0}
    image = None
    for h, ax in enumerate(axes):
        if h >= H:
            ax.axis("off")
            continue
        image = ax.imshow(matrices[h], interpolation="nearest", **style)
        for b in boundaries:
            ax.axhline(b - 0.5, color="white", lw=0.8)
            ax.axvline(b - 0.5, color="white", lw=0.8)
        ax.set_title(titles[h] if titles else f"head {h}", fontsize=9)
        ax.set_xlabel("key j", fontsize=8)
        ax.set_ylabel("query i", fontsize=8)
        ax.tick_params(labelsize=7)
    if image is not None:
        fig.colorbar(image, ax=list(axes[:H]), shrink=0.8,
                     label="positional logit" if raw else "softmax weight")
    if suptitle:
        fig.suptitle(suptitle, fontsize=10)
    return fig


def plot_positional(method: str, params: dict, n: Optional[int] = None, *, raw: bool = False,
                    heads: Optional[int] = None, ncols: Optional[int] = None, path=None,
                    **kwargs):
    """Heatmaps of the position-only attention (or raw term) of ``method``, one per head.

    ``heads``: draw only the first ``heads`` heads.  ``kwargs`` go to
    :func:`positional_term` (``d``, ``rng``, segment ids).  Saves to ``path``
    when given; returns the Figure.
    """
    _figure_class()
    term, note = positional_term(method, params, n, return_note=True, **kwargs)
    if heads is not None:
        term = term[:max(1, int(heads))]
    shown = term if raw else softmax(term)
    what = "positional logits" if raw else "softmax(positional term)"
    title = f"{method}: {what}, n={term.shape[-1]}" + (f" ({note})" if note else "")
    boundaries = ()
    if params.get("segment_table") is not None:
        segment_q = kwargs.get("segment_q", params.get("segment_q"))
        ids = two_segments(term.shape[-1])[0] if segment_q is None else np.asarray(segment_q)
        boundaries = tuple(np.flatnonzero(np.diff(ids.reshape(-1, term.shape[-1])[0])) + 1)
    fig = plot_heads(shown, raw=raw, ncols=ncols, suptitle=title, boundaries=boundaries)
    if path is not None:
        fig.savefig(path, dpi=100)
    return fig


def plot_segment_attention(params: Optional[dict] = None, *, method: str = "diet_rel",
                           n: int = 32, start: int = 16, H: int = 4, rng=None,
                           raw: bool = False, path=None):
    """DIET Fig. 6: position + segment attention without token-to-token attention.

    Two segments, the second from ``start`` (paper: ``n = 32``, ``start = 16``);
    ``q = k = 0`` so only ``rel`` (or ``pos_q pos_k^T``) plus ``E_S`` remain.
    ``params`` default to :func:`random_params` with a segment table.
    """
    if method not in _SEGMENT_METHODS:
        raise ValueError(f"segment attention is drawn for diet_abs or diet_rel, not {method!r}")
    if params is None:
        params = random_params(method, H, n, rng, segments=True)
    elif params.get("segment_table") is None:
        raise ValueError("params need a segment_table (H|1, 2, 2) for a segment picture")
    segment_q, segment_k = two_segments(n, start)
    return plot_positional(method, params, n, raw=raw, path=path,
                           segment_q=segment_q, segment_k=segment_k)


# ---------------------------------------------------------------------------
# python -m posenc plot
# ---------------------------------------------------------------------------

def main(argv=None) -> int:
    """``python -m posenc plot``: per-head positional attention of one method to a PNG."""
    parser = argparse.ArgumentParser(
        prog="python -m posenc plot",
        description="Heatmaps of the position-only attention softmax(positional term) per "
                    "head (DIET Figs. 4, 6; TUPE Fig. 6).")
    parser.add_argument("--method", default="t5", choices=POSITIONAL_METHODS,
                        help="the method (default t5)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--random-params", action="store_true",
                        help="random parameters (the default)")
    source.add_argument("--npz", metavar="FILE",
                        help="parameters from an .npz whose array names are the method's arguments")
    parser.add_argument("--heads", type=int, default=4,
                        help="heads (random: how many to draw from; npz: the first H shown)")
    parser.add_argument("--n", type=int, default=None,
                        help="sequence length (default 64; 32 with --segments)")
    parser.add_argument("--d-head", type=int, default=64, help="head width d (default 64)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--raw", action="store_true", help="the raw positional logits, no softmax")
    parser.add_argument("--segments", action="store_true",
                        help="diet_abs/diet_rel: two segments with a segment table (DIET Fig. 6)")
    parser.add_argument("--segment-start", type=int, default=None,
                        help="start of the second segment (default n // 2)")
    parser.add_argument("--save-params", metavar="FILE",
                        help="also write the parameters used to this .npz")
    parser.add_argument("-o", "--output", metavar="PNG",
                        help="the image to write (default posenc-METHOD.png here)")
    args = parser.parse_args(argv)
    args.output = args.output or f"posenc-{args.method}.png"
    for flag, path in (("-o", args.output), ("--save-params", args.save_params)):
        folder = os.path.dirname(os.path.abspath(path)) if path else None
        if folder and not os.path.isdir(folder):
            parser.error(f"{flag} {path}: the folder {folder} does not exist")
        if folder and not os.access(folder, os.W_OK):
            parser.error(f"{flag} {path}: the folder {folder} is not writable")
    if args.npz and not os.path.isfile(args.npz):
        parser.error(f"--npz {args.npz}: no such file")
    if args.heads < 1 or args.d_head < 1 or (args.n is not None and args.n < 1):
        parser.error("--heads, --n and --d-head must be >= 1")
    if args.segments and args.method not in _SEGMENT_METHODS:
        parser.error("--segments needs --method diet_abs or diet_rel")
    n = args.n if args.n is not None else (32 if args.segments else 64)
    rng = np.random.default_rng(args.seed)
    if args.npz:
        params = load_params(args.npz, args.method)
        if args.segments and params.get("segment_table") is None:
            parser.error(f"--segments: {args.npz} has no segment_table")
    else:
        params = random_params(args.method, args.heads, n, rng, d=args.d_head,
                               segments=args.segments)
    if args.save_params:
        save_params(args.save_params, params)
    segment_ids = {}
    if params.get("segment_table") is not None:
        segment_ids = dict(zip(("segment_q", "segment_k"),
                               two_segments(n if "pos_q" not in params
                                            else np.shape(params["pos_q"])[1],
                                            args.segment_start)))
    n_arg = None if "pos_q" in params else n
    plot_positional(args.method, params, n_arg, raw=args.raw, heads=args.heads,
                    d=args.d_head, rng=rng, path=args.output, **segment_ids)
    print(f"saved {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
