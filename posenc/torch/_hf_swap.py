"""Any Hugging Face model's positional encoding swapped for any posenc method.

`swap_positional_encoding(model, method, share=None, **params)` takes a model on
HF's attention interface (Llama, Mistral, Qwen, Gemma, GPT-NeoX, BERT, GPT-2,
...), removes its own positional encoding -- the rotary embedding becomes the
identity rotation (cos 1, sin 0: q and k pass unchanged), absolute position
embeddings add zeros -- and gives every self-attention layer a
`posenc.torch.nn` encoding of `method` (the papers' ten and rope, alibi, kerple,
relative_bias; "content" for none), which the "posenc" attention function runs
fused.  Every other weight is kept.  The encodings live in one module,
`model.posenc_encodings` (so optimizers, state dicts and `save_pretrained` see
them): one encoding shared by all layers where the method's paper shares it
(T5, TUPE, DIET-ABS; `shared_across_layers` on the class) or where it has no
parameters, else one per layer; `share=` overrides.  The swap is recorded in
the config (`posenc_encoding`), and `from_pretrained(cls, path)` loads such a
checkpoint back with the same encoding.

The constructor arguments come from the model: num_heads, head_dim, d_model
(hidden_size), max_len (max_position_embeddings), the q.k scale of the model's
attention (`scaling`: only the positional term changes), `bidirectional` and
`reset_cls` off for a causal model; and by default max_distance=128 and
rank=head_dim (DIET-ABS).  `params` override any of them.
"""

from __future__ import annotations

import json
import os

import torch
from torch import nn

from . import nn as encodings
from ._encodings import PositionalEncoding

CONFIG_KEY = "posenc_encoding"

# method -> its posenc.torch.nn class, from the classes themselves
ENCODINGS = encodings.encoding_classes()

_ROTARY_SUFFIX = "RotaryEmbedding"
_ABSOLUTE_NAMES = ("position_embeddings", "wpe", "embed_positions")


class IdentityRotation(nn.Module):
    """The model's rotary embedding with every angle 0: cos 1, sin 0 (HF's rotation
    then leaves q and k exactly as they are).  Keeps the original as `rotary`."""

    def __init__(self, rotary: nn.Module):
        super().__init__()
        self.rotary = rotary

    def forward(self, x, *args, **kwargs):
        cos, sin = self.rotary(x, *args, **kwargs)
        return torch.ones_like(cos), torch.zeros_like(sin)


class NoPositions(nn.Module):
    """In place of absolute position embeddings: zeros of the embedding's width."""

    def __init__(self, embedding: nn.Embedding):
        super().__init__()
        self.embedding_dim = embedding.embedding_dim
        self.register_buffer("_like", embedding.weight.new_zeros(0), persistent=False)

    def forward(self, positions, *args, **kwargs):
        return self._like.new_zeros(*positions.shape, self.embedding_dim)


class PositionalEncodings(nn.Module):
    """The swapped model's encodings: `encodings[0]` shared by every layer, or one per layer."""

    def __init__(self, method: str, shared: bool, encodings_: list):
        super().__init__()
        self.method, self.shared = method, shared
        self.encodings = nn.ModuleList(encodings_)

    def for_layer(self, index: int) -> PositionalEncoding:
        return self.encodings[0 if self.shared else index]

    def extra_repr(self) -> str:
        return f"method={self.method!r}, shared={self.shared}"


def attention_layers(model) -> list:
    """The self-attention modules that call HF's attention interface, in order
    (modules with a `scaling` and a `config`; cross-attention left out)."""
    return [module for module in model.modules()
            if hasattr(module, "scaling") and hasattr(module, "config")
            and not getattr(module, "is_cross_attention", False)
            and not isinstance(module, (PositionalEncoding, PositionalEncodings))]


def _own_encodings(model) -> list:
    """(parent, name, module) of the model's own positional encodings."""
    found = []
    for parent in model.modules():
        for name, child in parent.named_children():
            if type(child).__name__.endswith(_ROTARY_SUFFIX) or (
                    name in _ABSOLUTE_NAMES and isinstance(child, nn.Embedding)):
                found.append((parent, name, child))
    return found


def _context(model, layer) -> dict:
    """The encoding's constructor arguments that come from the model (and its defaults)."""
    config = model.config
    heads = config.num_attention_heads
    head_dim = getattr(layer, "head_dim", None) or config.hidden_size // heads
    causal = bool(getattr(layer, "is_causal", True))
    return dict(num_heads=heads, head_dim=head_dim, d_model=config.hidden_size,
                max_len=config.max_position_embeddings,
                max_position_embeddings=config.max_position_embeddings,
                max_distance=128, rank=head_dim, scale=layer.scaling,
                bidirectional=not causal, reset_cls=not causal)


def _keep_input(layer, args, kwargs):
    """A forward pre-hook: the layer's hidden states kept for its attention call
    (posenc.torch._hf_interface._input_state), for an encoding that reads them."""
    layer.__dict__["_posenc_input"] = args[0] if args else kwargs["hidden_states"]


def swap_positional_encoding(model, method: str, *, share: bool | None = None, **params):
    """Replace `model`'s positional encoding by posenc's `method` (in place); returns
    `model`, now on attn_implementation="posenc".  See the module's text."""
    if method not in ENCODINGS:
        raise ValueError(f"unknown method {method!r}; choose one of {', '.join(sorted(ENCODINGS))}")
    if getattr(model, "posenc_encodings", None) is not None:
        raise ValueError("this model's positional encoding is already swapped "
                         f"({model.posenc_encodings.method}); swap a fresh model")
    try:
        json.dumps(params)
    except TypeError as error:
        raise TypeError(f"params must be JSON values (the config records them): {error}") from None
    layers = attention_layers(model)
    if not layers or not getattr(model, "_supports_attention_backend", False):
        raise ValueError(f"{type(model).__name__} does not call its attention through HF's "
                         "attention interface; posenc can swap the encoding of models that do "
                         "(Llama, Mistral, Qwen, Gemma, GPT-NeoX, BERT, GPT-2, ...)")
    own = _own_encodings(model)
    if not own:
        raise ValueError(f"found no rotary embedding or absolute position embeddings in "
                         f"{type(model).__name__} to replace")
    cls = ENCODINGS[method]
    dtype, device = next(model.parameters()).dtype, next(model.parameters()).device
    first = encodings.build_encoding(method, _context(model, layers[0]), params)
    if share is None:
        share = cls.shared_across_layers or not any(True for _ in first.parameters())
    built = [first] + ([] if share else [encodings.build_encoding(method, _context(model, layer),
                                                                  params) for layer in layers[1:]])
    container = PositionalEncodings(method, share, built).to(dtype=dtype, device=device)
    model.posenc_encodings = container
    for index, layer in enumerate(layers):
        object.__setattr__(layer, "_posenc_encoding", container.for_layer(index))
        if cls.reads_input:   # FoX's gates come from the layer's hidden states
            layer.register_forward_pre_hook(_keep_input, with_kwargs=True)
    for parent, name, child in own:
        setattr(parent, name, IdentityRotation(child) if isinstance(child, nn.Module)
                and not isinstance(child, nn.Embedding) else NoPositions(child))
    model._posenc_replaced = [type(child).__name__ + (f" ({name})" if isinstance(child, nn.Embedding) else "")
                              for _, name, child in own]
    setattr(model.config, CONFIG_KEY, {"method": method, "share": share, "params": params})
    model.set_attn_implementation("posenc")
    return model


def _checkpoint_tensors(path: str, prefix: str) -> dict:
    """The tensors of a save_pretrained folder whose names start with `prefix`."""
    from safetensors.torch import load_file

    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    found = {}
    for name in files:
        found.update({key: value for key, value in load_file(os.path.join(path, name)).items()
                      if key.startswith(prefix)})
    return found


def from_pretrained(model_class, path: str, **kwargs):
    """Load a `save_pretrained` folder of a swapped model: HF's `from_pretrained`
    for the model's own weights, the swap the config records, then the saved
    encodings' parameters (every one, or an error)."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(path)
    spec = getattr(config, CONFIG_KEY, None)
    if spec is None:
        raise ValueError(f"{path} holds no swapped model (its config has no {CONFIG_KEY!r})")
    transformers.logging.set_verbosity_error()      # the encodings' keys are loaded below
    try:
        model = model_class.from_pretrained(path, config=config, **kwargs)
    finally:
        transformers.logging.set_verbosity_warning()
    delattr(model.config, CONFIG_KEY)
    swap_positional_encoding(model, spec["method"], share=spec["share"], **spec["params"])
    saved = _checkpoint_tensors(path, "posenc_encodings.")
    state = {key[len("posenc_encodings."):]: value for key, value in saved.items()}
    missing, unexpected = model.posenc_encodings.load_state_dict(state, strict=False)
    persistent = {key for key in model.posenc_encodings.state_dict()}
    missing = [key for key in missing if key in persistent]
    if missing or unexpected:
        raise ValueError(f"{path}: the saved encodings do not fit the swap its config records "
                         f"(missing {missing}, unexpected {unexpected})")
    # HF leaves the weights where safetensors put them, at any address: the GEMMs
    # then take other paths than on freshly allocated weights and round otherwise
    # (1e-16 in float64).  In memory of their own, the loaded model computes the
    # saved one's numbers bit for bit.
    with torch.no_grad():
        for tensor in list(model.parameters()) + list(model.buffers()):
            tensor.data = tensor.data.clone()
    return model


def describe(model) -> str:
    """Which positional encoding and attention `model` runs, in words."""
    name = type(model).__name__
    implementation = getattr(model.config, "_attn_implementation", None)
    layers = attention_layers(model)
    lines = [f"{name}: {len(layers)} self-attention layers"
             + (f" ({type(layers[0]).__name__})" if layers else "")
             + (f", attn_implementation={implementation!r}" if implementation else "")]
    swapped = getattr(model, "posenc_encodings", None)
    patched = [module for module in model.modules()
               if getattr(type(module), "_posenc_original_class", None) is not None]
    if swapped is not None:
        encoding = swapped.encodings[0]
        count = "one shared by all layers" if swapped.shared else f"one per layer ({len(swapped.encodings)})"
        lines.append(f"positional encoding: posenc {swapped.method} ({type(encoding).__name__}, "
                     f"{count}; {sum(p.numel() for p in swapped.parameters())} parameters), "
                     f"replacing {', '.join(model._posenc_replaced)}")
    elif patched:
        original = type(patched[0])._posenc_original_class.__name__
        lines.append(f"patched by posenc.torch.hf.patch: {len(patched)} {original} modules run "
                     f"posenc's fused kernels with the model's own positional encoding")
    else:
        own = [type(child).__name__ + (f" ({child_name})" if isinstance(child, nn.Embedding) else "")
               for _, child_name, child in _own_encodings(model)]
        rope = getattr(model.config, "rope_parameters", None)
        if isinstance(rope, dict) and rope.get("rope_type"):
            own.append(f"rope_type {rope['rope_type']!r}")
        lines.append("positional encoding: the model's own" + (f": {', '.join(own)}" if own else
                                                                 " (none found outside the attention)"))
    if implementation == "posenc" or patched:
        lines.append("attention: posenc's fused kernels (" + ("C kernels on CPU" if
                     next(model.parameters()).device.type == "cpu" else "torch-native formula off the CPU")
                     + "); what they cannot serve falls back with a warning")
    return "\n".join(lines)
