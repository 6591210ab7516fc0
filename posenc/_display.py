"""``posenc.info()`` and ``posenc.check()``: what ``python -m posenc info`` and
``python -m posenc check`` print, as objects that show themselves as that text
in a terminal and as HTML tables in a notebook; and the progress bar of long
runs (tqdm when installed, else one line of text; shown in a terminal or a
notebook, not when the output is captured, unless asked)."""

from __future__ import annotations

import html
import platform
import sys
import time

__all__ = ["Info", "CheckResult", "Progress", "info", "check"]


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") or line.startswith("Model"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _html_table(header, rows, *, caption: str = "", footer: str = "", styles=None) -> str:
    """A small HTML table; `styles[r]` is the CSS of row r's last cell."""
    cell = "<td style='text-align:left'>{}</td>".format
    lines = ["<table>"]
    if caption:
        lines.append(f"<caption style='text-align:left'>{html.escape(caption)}</caption>")
    if header:
        lines.append("<tr>" + "".join(f"<th style='text-align:left'>{html.escape(h)}</th>"
                                      for h in header) + "</tr>")
    for r, row in enumerate(rows):
        cells = [cell(html.escape(str(value))) for value in row]
        if styles and styles[r]:
            cells[-1] = cells[-1].replace("<td style='", f"<td style='{styles[r]};", 1)
        lines.append("<tr>" + "".join(cells) + "</tr>")
    lines.append("</table>")
    if footer:
        lines.append(f"<p>{html.escape(footer)}</p>")
    return "\n".join(lines)


class Info:
    """The build and what runs: ``rows`` of (field, value); a mapping by field."""

    def __init__(self, rows):
        self.rows = list(rows)

    def __getitem__(self, field: str) -> str:
        return dict(self.rows)[field]

    def __repr__(self) -> str:
        return "\n".join(f"{field:<12}{value}" for field, value in self.rows)

    def _repr_html_(self) -> str:
        return _html_table((), self.rows)


def info() -> Info:
    """Version, Python, NumPy, compiler, OpenMP, CPU, ISAs built / usable /
    active and threads: what ``python -m posenc info`` prints (that text is
    the object's repr; an HTML table in a notebook)."""
    import numpy as np

    import posenc

    build = posenc.build_info()
    return Info([
        ("posenc", posenc.__version__),
        ("python", f"{platform.python_version()} ({sys.executable})"),
        ("numpy", np.__version__),
        ("compiler", build["compiler"]),
        ("openmp", build["openmp"] or "not built with OpenMP"),
        ("cpu", f"{_cpu_model()} ({platform.machine()})"),
        ("isa built", ", ".join(build["compiled_isas"])),
        ("isa usable", ", ".join(posenc.capabilities())),
        ("isa active", f"{posenc.get_isa()}   (POSENC_ISA or posenc.set_isa to choose)"),
        ("bfloat16", "every GEMM on vdpbf16ps (AVX512-BF16), softmax and terms in float32"
                     if posenc._C.bf16_dot() else "float32 kernels with conversions"),
        ("threads", f"{posenc.get_num_threads()} of {build['max_threads']} "
                    "(OMP_NUM_THREADS or posenc.set_num_threads to choose)"),
    ])


# ------------------------------------------------------------------ progress

def _interactive() -> bool:
    """A person watches: stderr is a terminal, or this runs in a Jupyter kernel."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is not None and getattr(shell, "kernel", None) is not None:
        return True
    return bool(getattr(sys.stderr, "isatty", lambda: False)())


class Progress:
    """Progress over ``total`` steps: ``update()`` after each.

    ``enabled=None``: on when :func:`_interactive`; ``True``/``False`` force
    it.  tqdm draws it when installed, else one line of text on stderr,
    rewritten in place and cleared at the end.  Use as a context manager.
    """

    def __init__(self, total: int, description: str, enabled: bool | None = None):
        self.total, self.description, self.done = total, description, 0
        self.enabled = _interactive() if enabled is None else bool(enabled)
        self.start = time.perf_counter()
        self._bar = None
        if self.enabled:
            try:
                from tqdm import tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None:
                self._bar = tqdm(total=total, desc=description, leave=False, file=sys.stderr)

    def update(self, note: str = "") -> None:
        self.done += 1
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.set_postfix_str(note, refresh=False)
            self._bar.update(1)
            return
        width = 24
        filled = width * self.done // max(self.total, 1)
        sys.stderr.write(f"\r{self.description} [{'#' * filled}{'.' * (width - filled)}] "
                         f"{self.done}/{self.total} {time.perf_counter() - self.start:.1f} s "
                         f"{note:<24}")
        sys.stderr.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self.enabled:
            sys.stderr.write("\r" + " " * (len(self.description) + 70) + "\r")
            sys.stderr.flush()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ------------------------------------------------------------------ check

_LEGEND = ("err: float64 = max|posenc - reference| / max|reference| (limit {rtol:g}); "
           "float32 = max |posenc - reference| / bound, bound = (depth + 8) eps32 x "
           "(method on |inputs|), carried through the softmax for the attention "
           "(docs/validation.md) (limit 1); bfloat16, float16: the float32 bound E32 and "
           "one rounding, u |reference| + (1 + u) E32, u = 2^-8, 2^-11, E32 + 2^-8 M for "
           "bfloat16's gradients and attention out, and rope's logits (GEMM operands rounded) "
           "(limit 1)")


class CheckResult:
    """The rows of a check (``posenc._check.CheckRow``), ``passed``, and the
    text of ``python -m posenc check`` as repr (HTML in a notebook)."""

    def __init__(self, rows, methods, isas, dtypes, shape: dict, seconds: float,
                 skipped: tuple = ()):
        self.rows, self.methods, self.isas, self.dtypes = list(rows), methods, isas, dtypes
        self.shape, self.seconds, self.skipped = shape, seconds, tuple(skipped)

    @property
    def passed(self) -> bool:
        return all(row.ok for row in self.rows)

    @property
    def failed(self) -> list:
        return [row for row in self.rows if not row.ok]

    @property
    def header(self) -> str:
        import posenc

        from ._registry import REGISTRY

        s = self.shape
        among = [m for m in self.methods if m in REGISTRY and REGISTRY[m].queries_among_keys]
        keys = (f"; {', '.join(among)}: m at least query_offset + n, every query among the keys"
                if among else "")
        return (f"posenc {posenc.__version__} check: every method x ISA x dtype, logits and "
                f"fused attention, against "
                f"posenc.reference (B={s['B']} H={s['H']} n={s['n']} m={s['m']} d={s['d']}"
                f"{' shared parameters' if s['shared'] else ''}, seed {s['seed']}{keys})")

    @property
    def summary(self) -> str:
        from ._check import FORMS

        forms = sum(name in FORMS for name in self.methods)
        counted = f"{len(self.methods) - forms} methods" + (f" + {forms} form" + "s" * (forms > 1)
                                                           if forms else "")
        return (f"{len(self.rows) - len(self.failed)} passed, {len(self.failed)} failed "
                f"({counted} x {len(self.isas)} ISAs x {len(self.dtypes)} "
                f"dtypes x logits and fused attention, forward and backward) in "
                f"{self.seconds:.1f} s" + "".join(f"; skipped: {why}" for why in self.skipped))

    def __repr__(self) -> str:
        from ._check import F64_RTOL, format_table

        return "\n".join((self.header, format_table(self.rows), "",
                          _LEGEND.format(rtol=F64_RTOL), self.summary))

    def _repr_html_(self) -> str:
        from ._check import F64_RTOL, HEADER, table_rows


        header, rows = HEADER, table_rows(self.rows)
        styles = ["color:green" if r.ok else "color:red;font-weight:bold" for r in self.rows]
        return _html_table(header, rows, caption=self.header, styles=styles,
                           footer=f"{self.summary}. {_LEGEND.format(rtol=F64_RTOL)}")


def check(methods=None, isas=None, *, dtypes=None, B: int = 2, H: int = 3,
          n: int = 33, m: int = 17, d: int = 16, shared: bool = False, seed: int = 0,
          progress: bool | None = None) -> CheckResult:
    """Every method x ISA x dtype, forward and backward, against
    posenc.reference: ``python -m posenc check`` as a function.

    ``methods``, ``isas``: names (a str or a list; default all, all usable);
    the methods' names may include a form of a method (``rope/token``: rope with
    per-token tables); ValueError for an unknown method or an ISA this CPU lacks.  ``dtypes``:
    names, default float32, float64, bfloat16 (when ml_dtypes is installed;
    ``.skipped`` and the summary say so when it is not) and float16.  The sizes,
    ``shared`` (head axis 1) and ``seed`` are those of the command.  Returns a
    :class:`CheckResult`: ``.passed``, ``.rows``, ``.failed``; its repr is
    the command's output, an HTML table in a notebook.  ``progress``: a bar
    while it runs (default: in a terminal or a notebook).
    """
    import posenc
    from posenc import _check, _dtypes

    methods = [methods] if isinstance(methods, str) else list(methods or _check.CASES)
    isas = [isas] if isinstance(isas, str) else list(isas or posenc.capabilities())
    unknown = [name for name in methods if name not in _check.CASES]
    if unknown:
        raise ValueError(f"unknown method(s) {', '.join(unknown)}; choose from "
                         f"{', '.join(_check.CASES)}")
    for isa in isas:
        if isa not in posenc.capabilities():
            raise ValueError(f"ISA {isa!r} is not available here; available: "
                             f"{', '.join(posenc.capabilities())}")
    skipped = ()
    if not dtypes and _dtypes.BFLOAT16 is None:
        skipped = (f"bfloat16 ({_dtypes.BFLOAT16_MISSING})",)
    dtypes = [dtypes] if isinstance(dtypes, str) else list(dtypes or _check.DTYPES)
    for dtype in dtypes:
        _dtypes.by_name(dtype)          # ValueError for an unknown one, or bfloat16 without ml_dtypes
    shape = dict(B=B, H=H, n=n, m=m, d=d, shared=shared, seed=seed)
    start = time.perf_counter()
    total = len(methods) * len(isas) * len(dtypes) * len(_check.OPS)
    with Progress(total, "posenc check", progress) as bar:
        rows = _check.run_check(methods, isas, dtypes, **shape,
                                progress=lambda row: bar.update(f"{row.method} {row.isa}"))
    return CheckResult(rows, methods, isas, tuple(dtypes), shape, time.perf_counter() - start,
                       skipped)
