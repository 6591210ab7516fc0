"""Smoke test of benchmarks/hf.py (HF models patched onto posenc against HF's
attention): its --quick mode runs every case in a worker process of its own,
writes its JSON and Markdown, states HF's refusals and issues 15's and 29's targets.  No
timing is asserted: the figures of a quick run on a shared machine mean nothing."""

import json
import runpy
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "hf.py"
if not SCRIPT.is_file():
    pytest.skip("needs the source tree (benchmarks/hf.py)", allow_module_level=True)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("hf-bench")
    module = runpy.run_path(str(SCRIPT), run_name="hf_bench")
    assert module["main"](["--quick", "--out", str(out)]) == 0
    (json_path,), (md_path,) = sorted(out.glob("hf-*.json")), sorted(out.glob("hf-*.md"))
    return module, json.loads(json_path.read_text()), md_path.read_text()


def test_every_case_is_timed_and_measured(quick_run):
    _, data, _ = quick_run
    assert data["quick"] is True and data["machine"]["threads"] == 2
    t5, deberta = data["models"]["t5"], data["models"]["deberta"]
    assert set(t5["cases"]) == {"posenc", "eager", "sdpa"}          # HF runs sdpa for T5
    assert set(deberta["cases"]) | set(deberta["refused"]) == {"posenc", "eager", "sdpa"}
    for model, commands in ((t5, ("train", "generate")), (deberta, ("train",))):
        for implementation, case in model["cases"].items():
            assert "error" not in case, case
            for command in commands:
                entry = case[command]
                assert len(entry["times_s"]) == model["repeats"][command] >= 1
                assert entry["min_s"] <= entry["median_s"] <= entry["max_s"] and entry["warmup_s"] > 0
                assert entry["peak_bytes"] >= 0
    # the patched cases run posenc on every attention module; the others do not
    assert t5["cases"]["posenc"]["patched_modules"] == 6 and deberta["cases"]["posenc"]["patched_modules"] == 2
    assert t5["cases"]["eager"]["patched_modules"] == 0 and t5["cases"]["sdpa"]["runs"] == "sdpa"
    # float32 greedy tokens of a tiny model: the same as HF eager's
    assert all(case["generate"]["same_tokens_as_eager"] for case in t5["cases"].values())
    # the decoder-only shapes: Llama on the interface (patched, and the interface alone), BLOOM patched
    llama, bloom = data["models"]["llama"], data["models"]["bloom"]
    assert set(llama["cases"]) == {"posenc", "posenc-attn", "eager", "sdpa"}
    assert llama["cases"]["posenc"]["runs"] == llama["cases"]["posenc-attn"]["runs"] == "posenc"
    assert bloom["cases"]["posenc"]["patched_modules"] == 2 and "sdpa" in bloom["refused"]
    assert all("error" not in case for model in (llama, bloom) for case in model["cases"].values())
    assert llama["train_flops"] > 0 and bloom["train_flops"] > 0 and data["fma_peak_gflops"] > 0


def test_targets_and_page(quick_run):
    _, data, text = quick_run
    names = [t["name"] for t in data["targets"]]
    assert any(n.startswith("T5 training step:") for n in names)
    assert any(n.startswith("T5 training step peak memory") for n in names)
    assert any(n.startswith("DeBERTa training step:") for n in names)
    for target in data["targets"]:
        assert target["ratio"] > 0
        assert target["verdict"] in (("PASS", "SHORT") if target["target"] else ("info",))
    assert any(n.startswith("Llama training step:") for n in names)
    assert any(n.startswith("BLOOM training step peak memory") for n in names)
    assert "## Targets (issues 15 and 29)" in text and "--quick: tiny shapes" in text
    assert "Float32 FMA peak measured in this run" in text and "TFLOP (6 x matmul" in text
    for reason in data["models"]["deberta"]["refused"].values():
        assert reason in text


def test_a_failing_worker_is_reported(quick_run, tmp_path):
    """A worker that dies (here: asked for a model that does not exist) becomes
    an error with its last line of stderr, not a hang or a silent gap."""
    module, _, _ = quick_run
    case = module["Case"]("nonexistent", "eager", True, 1, 2)
    with pytest.raises(RuntimeError, match="worker exited with status"):
        case.read()
    case.close()


def test_before_and_profile(quick_run, tmp_path):
    """--before PATH: each posenc case also on PATH's posenc ("@before", here this checkout
    itself), its ratios among the targets; --profile: a profiled step's copies per posenc case."""
    module, _, _ = quick_run
    from posenc._paths import package_home

    out = tmp_path / "before"
    assert module["main"](["--quick", "--models", "llama", "--before", package_home(), "--profile",
                           "--out", str(out)]) == 0
    (json_path,), (md_path,) = sorted(out.glob("hf-*.json")), sorted(out.glob("hf-*.md"))
    data, text = json.loads(json_path.read_text()), md_path.read_text()
    cases = data["models"]["llama"]["cases"]
    assert set(cases) == {"posenc", "posenc-attn", "eager", "sdpa", "posenc@before",
                          "posenc-attn@before"}
    for label in ("posenc", "posenc-attn", "posenc@before", "posenc-attn@before"):
        profile = cases[label]["profile"]
        assert profile["copy_calls"] >= 1 and profile["copy_ms"] >= 0 and profile["copy_shapes"]
        assert f"| {label} |" in text
    assert "eager" not in {k for k, v in cases.items() if "profile" in v}
    names = [t["name"] for t in data["targets"]]
    for label in ("posenc", "posenc-attn"):
        for command in ("train", "generate"):
            assert f"llama {label} {command}: time ÷ before's" in names
            assert f"llama {label} {command}: peak memory ÷ before's" in names
    assert "Copies in one profiled training step" in text
