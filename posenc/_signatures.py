"""Functions with a method's real signature, made from its registry entry.

Every namespace (posenc, posenc.reference, posenc.torch) exposes each method
as a function whose signature is the registry's one string, so that
`inspect.signature`, `help()`, tab completion and Python's own argument
errors are those of a hand-written function, while the body is the
namespace's one generic implementation.  As `collections.namedtuple` does,
the function is compiled from source; its body only forwards the arguments,
grouped as (tensors, parameters) in registry order.
"""

from __future__ import annotations

from ._registry import REGISTRY


def define(method: str, body, *, name: str, doc: str, grad: bool = False, out: bool = True,
           module: str = "posenc"):
    """A function `name` with `method`'s signature (`G` first when `grad`,
    `out=None` last when `out`) that calls body([G,] tensors, params, out)."""
    spec = REGISTRY[method]
    head = "G, " if grad else ""
    arguments = f"{head}q, k, {spec.signature}" + (", out=None" if out else "")
    tensors = "".join(f"{t}, " for t in spec.tensors)
    params = "".join(f"{p}, " for p, _ in spec.params)
    source = (f"def {name}({arguments}):\n"
              f"    return _body({head}({tensors}), ({params}), {'out' if out else 'None'})\n")
    namespace = {"_body": body}
    exec(compile(source, f"<posenc.{method} signature>", "exec"), namespace)
    function = namespace[name]
    function.__doc__ = doc
    function.__module__ = module
    return function
