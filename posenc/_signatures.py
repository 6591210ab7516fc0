"""Functions with a method's real signature, made from its registry entry.

Every namespace (posenc, posenc.reference, posenc.torch) exposes each method
as functions whose signatures come from the registry's one string, so that
`inspect.signature`, `help()`, tab completion and Python's own argument
errors are those of a hand-written function, while the body is the
namespace's one generic implementation.  As `collections.namedtuple` does,
the function is compiled from source; its body only forwards the arguments,
grouped as (tensors, parameters) in registry order.

The four forms (SPEC §3 and §6), for a method `m` with arguments `<args>`:

    logits              m(q, k, <args>, *, <keywords>, query_offset=0, out=None)
    logits_backward     m_backward(G, q, k, <args>, *, <keywords>, query_offset=0)
    attention           m_attention(q, k, v, <args>, *, <keywords>, causal=False,
                            key_padding_mask=None, window=None, document_q=None,
                            document_k=None, softcap=None, sinks=None, query_offset=0,
                            dropout_p=0.0, seed=0, out=None)
    attention_backward  m_attention_backward(d_out, q, k, v, <args>, out, lse, *, <keywords>,
                            causal=False, ..., seed=0, d_lse=None)

and the body is called as body([G | d_out,] tensors, params, [attention,]
[out | (out, lse, d_lse)]) (a parameter named as an attention option, cope's `causal`,
is that option in the attention forms: attention_option),
`params` ending with query_offset, `attention` = (v, then posenc._attention.ATTENTION_OPTIONS
in order: causal, key_padding_mask, window, document_q, document_k, softcap, sinks, dropout_p,
seed).
"""

from __future__ import annotations

from ._registry import REGISTRY

# The attention's arguments after v in the order every namespace passes them, with
# their defaults: SPEC §6's masks and dropout, §7's shapes.
ATTENTION_OPTIONS = (("causal", False), ("key_padding_mask", None), ("window", None),
                     ("document_q", None), ("document_k", None), ("softcap", None),
                     ("sinks", None), ("dropout_p", 0.0), ("seed", 0))

# the attention's keywords, query_offset (one of the logits' parameters) before the dropout's
ATTENTION_KEYWORDS = ", ".join(
    ("query_offset=0, " if name == "dropout_p" else "") + f"{name}={default!r}"
    for name, default in ATTENTION_OPTIONS)
FORMS = ("logits", "logits_backward", "attention", "attention_backward")


def attention_option(name: str) -> bool:
    """Whether a method's parameter `name` is, in the attention forms, the attention's
    option of that name (cope's logits take `causal`: its gates' keys; the fused
    attention's `causal` is it)."""
    return name in _OPTION_NAMES


_OPTION_NAMES = frozenset(name for name, _ in ATTENTION_OPTIONS)


def arguments(method: str, form: str) -> str:
    """The argument list of `method`'s function of `form` (see the module's docstring)."""
    spec = REGISTRY[method]
    positional, _, keywords = spec.signature.partition("*")
    positional = "".join(f", {name.strip()}" for name in positional.split(",") if name.strip())
    if form.startswith("attention"):      # the attention's own option stands for it
        keywords = ",".join(part for part in keywords.split(",")
                            if not attention_option(part.partition("=")[0].strip()))
    keywords = keywords.strip().lstrip(",").strip()
    if form.startswith("logits"):
        head = ("G, " if form == "logits_backward" else "") + "q, k"
        tail = f"{keywords}, query_offset=0"
        return f"{head}{positional}, *, {tail}" + (", out=None" if form == "logits" else "")
    if form == "attention":
        return f"q, k, v{positional}, *, {keywords}, {ATTENTION_KEYWORDS}, out=None"
    return f"d_out, q, k, v{positional}, out, lse, *, {keywords}, {ATTENTION_KEYWORDS}, d_lse=None"


def define(method: str, body, *, name: str, doc: str, form: str = "logits", out: bool = True,
           module: str = "posenc"):
    """A function `name` of `form` for `method`, calling `body` as the module's
    docstring says; `out=False` leaves out the `out=` keyword (posenc.torch)."""
    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, got {form!r}")
    spec = REGISTRY[method]
    tensors = "".join(f"{t}, " for t in spec.tensors)
    params = "".join(f"{p}, " for p, _ in spec.params)     # ends with query_offset
    call = [f"({tensors})", f"({params})"]
    if form.startswith("attention"):
        call.append("(v, " + ", ".join(name for name, _ in ATTENTION_OPTIONS) + ")")
    call.insert(0, {"logits_backward": "G", "attention_backward": "d_out"}.get(form, ""))
    call.append({"logits": "out", "attention": "out", "attention_backward": "(out, lse, d_lse)"}.get(
        form, "None") if out or form == "attention_backward" else "None")
    signature = arguments(method, form)
    if not out:
        signature = signature.replace(", out=None", "")
    source = (f"def {name}({signature}):\n"
              f"    return _body({', '.join(part for part in call if part)})\n")
    namespace = {"_body": body}
    exec(compile(source, f"<posenc.{name} signature>", "exec"), namespace)
    function = namespace[name]
    function.__doc__ = doc
    function.__module__ = module
    return function
