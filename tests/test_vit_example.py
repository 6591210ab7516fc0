"""examples/vit_digits.py (issue 38's ViT-shaped example): a small ViT of posenc
attention layers on scikit-learn's digits, once per 2-D encoding -- its quick run
trains every encoding through the fused kernels and prints the table; a model's
encodings are the ones named (a [CLS] global token of the 2-D bias, the rotary
encodings' prefix token unrotated)."""

import importlib.util
import pathlib

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")

ROOT = pathlib.Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("vit_digits", ROOT / "examples" / "vit_digits.py")
vit = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(vit)


def test_quick_run_prints_every_encoding(capsys):
    assert vit.main(["--quick"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert [row.split(" | ")[0][2:] for row in rows[1:]] == list(vit.ENCODINGS)
    for row in rows[1:]:
        accuracy = float(row.split(" | ")[1])
        assert 0.0 <= accuracy <= 1.0


def test_the_models_encodings():
    from posenc.torch import nn as pnn

    model = vit.ViT("relative_bias_2d")
    encoding = model.blocks[0]["attention"].encoding
    assert isinstance(encoding, pnn.RelativeBias2D) and encoding.cls_token
    assert encoding.table.shape == (4, 7 * 7 + 3)
    rope = vit.ViT("rope_mixed").blocks[1]["attention"].encoding
    assert isinstance(rope, pnn.RoPEMixed) and rope.prefix_tokens == 1
    cos, sin = rope.tables(torch.arange(17))
    assert torch.equal(cos[:, :, 0], torch.ones_like(cos[:, :, 0]))     # [CLS] unrotated
    with pytest.raises(ValueError, match="unknown encoding"):
        vit.encoding("absolute", 4, 16)
