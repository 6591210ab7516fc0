"""Smoke test of the benchmark suite (benchmarks/posenc_bench): it runs at a tiny
size and writes its JSON, Markdown and PNG files; the committed run's page
regenerates from its JSON; the suite's modules import one way.  No timing is
asserted anywhere: the figures of a quick run on a shared machine mean nothing."""

import ast
import glob
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

import posenc

SUITE = Path(__file__).resolve().parent.parent / "benchmarks"
if not (SUITE / "posenc_bench").is_dir():
    pytest.skip("needs the source tree (benchmarks/posenc_bench)", allow_module_level=True)
sys.path.insert(0, str(SUITE))

from posenc_bench import cases, cli  # noqa: E402  (imported by path, as the suite's scripts do)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _outputs(directory):
    found = {ext: sorted(glob.glob(os.path.join(directory, f"*{ext}")))
             for ext in (".json", ".md", ".png")}
    assert len(found[".json"]) == 1 and len(found[".md"]) == 1, found
    with open(found[".json"][0]) as f:
        data = json.load(f)
    with open(found[".md"][0]) as f:
        text = f.read()
    return data, text, found[".png"]


def _timed(data, method, impl, direction):
    return [r for r in data["results"] if (r["method"], r["impl"], r["direction"])
            == (method, impl, direction) and "median_s" in r]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    assert cli.main(["--quick", "--out", str(out)]) == 0
    return _outputs(str(out))


def test_quick_run_measures_every_method(quick_run):
    data, _, _ = quick_run
    assert data["quick"] is True
    assert data["configuration"]["methods"] == list(posenc.METHODS)
    threads = data["configuration"]["threads"]
    for method in posenc.METHODS:
        for direction in ("fwd", "bwd"):
            runs = _timed(data, method, "posenc", direction)
            assert {r["threads"] for r in runs} >= set(threads), (method, direction)
            for r in runs:
                assert r["repeats"] >= 1 and len(r["times_s"]) == r["repeats"]
                assert r["min_s"] <= r["median_s"]
                assert r["flops"] == cases.flops(method, direction, *r["shape"])
                assert r["fraction_of_peak"] > 0
            assert _timed(data, method, "reference", direction), (method, direction)
    assert data["limits"]["fma"] and data["limits"]["store"]
    for r in _timed(data, "content", "posenc", "fwd"):
        assert 0 < r["fraction_of_store_floor"]


def test_quick_run_has_the_peers(quick_run):
    data, _, _ = quick_run
    pytest.importorskip("torch")
    for method in posenc.METHODS:
        for direction in ("fwd", "bwd"):
            assert _timed(data, method, "eager", direction), (method, direction)
    compiled = [r for r in data["results"] if r["impl"] == "compile"]
    assert compiled and all("compile_s" in r or "error" in r for r in compiled)
    assert {m["method"] for m in data["memory"] if "method" in m} >= {"shaw", "m4", "deberta"}
    variants = {r["variant"] for r in data["numpy_matmul"]}
    assert variants == {"OPENBLAS_CORETYPE=Haswell", "OPENBLAS_CORETYPE unset"}


def test_quick_run_reports_targets_and_table1(quick_run):
    data, text, _ = quick_run
    verdicts = {t["verdict"] for t in data["targets"]}
    assert verdicts <= {"PASS", "SHORT", "n/a", "info"}
    targeted = {t["method"] for t in data["targets"] if t["verdict"] != "info"}
    assert set(posenc.METHODS) - {"content"} <= targeted | set(cases.ADDITIVE)
    assert {r["method"] for r in data["table1"]} == set(posenc.METHODS) - {"content"}
    # the paper's figures are quoted, ours measured
    assert "+33%" in text and "+65%" in text and "Ke et al. (2020)" in text


def test_markdown_table_has_every_method(quick_run):
    _, text, _ = quick_run
    headline = text.split("## Headline", 1)[1].split("## Targets", 1)[0]
    rows = [line.split("|")[1].strip() for line in headline.splitlines()
            if line.startswith("| ") and not line.startswith("| method")]
    assert rows == list(posenc.METHODS)
    for section in ("## Machine", "## Machine limits", "## What was run", "## Targets",
                    "## DIET Table 1", "## Peak memory", "## Scaling in n", "## All timings"):
        assert section in text
    assert "OPENBLAS_CORETYPE" in text


def test_charts_are_png(quick_run):
    pytest.importorskip("matplotlib")
    _, text, pngs = quick_run
    names = {os.path.basename(p).rsplit("-", 1)[1] for p in pngs}
    assert {"n.png", "speedup.png", "peak.png"} <= names, pngs   # time-vs-n, speedup, peak
    for path in pngs:
        with open(path, "rb") as f:
            assert f.read(8) == PNG_MAGIC
        assert os.path.basename(path) in text


def test_runs_without_torch(tmp_path):
    """--no-torch: posenc and NumPy only, as where torch is not installed."""
    code = cli.main(["--quick", "--no-torch", "--no-subprocess", "--methods", "content", "t5",
                       "--out", str(tmp_path)])
    assert code == 0
    data, text, _ = _outputs(str(tmp_path))
    assert {r["impl"] for r in data["results"]} <= {"posenc", "posenc_out", "reference"}
    assert data["configuration"]["methods"] == ["content", "t5"]
    assert "not used" in text


def test_flop_counts():
    B, H, n, m, d = 2, 3, 40, 24, 8
    N = B * H * n * m
    assert cases.flops("content", "fwd", B, H, n, m, d) == 2 * N * d + N
    assert cases.flops("content", "bwd", B, H, n, m, d) == 4 * N * d + N
    R = n + m - 1       # fewer offsets than the 257 rows of max_distance 128
    assert cases.flops("shaw", "fwd", B, H, n, m, d) == 2 * N * d + 2 * B * H * n * R * d + 2 * N
    assert set(cases.FLOP_FORMULAS) == set(posenc.METHODS)


def test_memory_budget_shrinks_then_skips():
    shape = (8, 12, 2048, 2048, 64)
    need = cases.peer_bytes("shaw", "eager", *shape)
    assert cases.fit_shape("shaw", "eager", *shape, budget=2 * need) == (8, 12)
    B, H = cases.fit_shape("shaw", "eager", *shape, budget=need / 2)
    assert B * H < 96
    assert cases.fit_shape("shaw", "eager", *shape, budget=1) is None


def test_case_inputs_use_benchmark_parameters():
    args, kwargs = cases.case_inputs("deberta", 1, 2, 8, 8, 4)
    assert args[2].shape == (2, 512, 4) and kwargs["att_span"] == 256
    args, kwargs = cases.case_inputs("shaw", 1, 2, 8, 8, 4)
    assert args[2].shape == (1, 257, 4) and kwargs["max_distance"] == 128
    assert all(a.dtype == np.float32 for a in args)
    assert posenc.shaw(*args, **kwargs).shape == (1, 2, 8, 8)


def test_quick_run_measures_the_overhead(quick_run):
    data, text, _ = quick_run
    result = data["overhead"]
    assert result["threads"] == 1 and result["tiny"]["posenc.t5"]["median_s"] > 0
    whats = [row["what"] for row in result["rows"]]
    assert any(w.startswith("posenc.t5 per call") for w in whats)
    if "torch" in result:
        assert any(w.startswith("posenc.torch.t5 fwd+bwd") for w in whats)
        assert any(w.startswith("posenc.torch.t5_attention decoding step") for w in whats)
    assert "## Per-call overhead at small sizes" in text


def test_parameters_are_read_off_the_inputs():
    text = cases.describe("shaw")
    assert text.startswith("rel_k (1, 257, d) shared by the heads") and "max_distance=128" in text
    assert cases.describe("deberta").startswith("pos_key (H, 512, d), pos_query (H, 512, d)")
    assert "s = 1/sqrt(3d)" in cases.describe("deberta")
    assert set(cases.parameters()) == set(posenc.METHODS)


def test_committed_run_regenerates(tmp_path):
    """--report-only writes the committed run's Markdown, to the byte, from its JSON."""
    results = SUITE / "results"
    runs = sorted(results.glob("[0-9]*.json"))   # the suite's <date>-<host> runs (not attention-, hf-)
    if not runs:
        pytest.skip("no committed run under benchmarks/results")
    assert cli.main(["--report-only", str(runs[-1]), "--out", str(tmp_path)]) == 0
    name = runs[-1].with_suffix(".md").name
    assert (tmp_path / name).read_text() == (results / name).read_text()


def _suite_imports(path):
    """The posenc_bench modules a module of the suite imports (relative imports)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found |= {node.module} if node.module else {a.name for a in node.names}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""]
            found |= {n.split(".")[1] for n in names if n.startswith("posenc_bench.")}
    return found


def test_suite_imports_one_way():
    """Each module imports only those before it: no cycle, nothing upward."""
    order = ["cases", "machine", "measure", "worker", "overhead", "plan", "report", "markdown",
             "charts", "cli", "__main__"]
    modules = {p.stem for p in (SUITE / "posenc_bench").glob("*.py")} - {"__init__"}
    assert modules == set(order)
    for at, name in enumerate(order):
        upward = _suite_imports(SUITE / "posenc_bench" / f"{name}.py") - set(order[:at])
        assert not upward, f"posenc_bench.{name} imports {sorted(upward)}"
    assert not _suite_imports(SUITE / "posenc_bench" / "__init__.py")


def test_posenc_bench_without_a_suite_says_where_it_is(tmp_path, python):
    result = python("-m", "posenc", "bench", "--suite", str(tmp_path), timeout=120)
    assert result.returncode == 2
    assert result.stdout == "" and len(result.stderr.strip().splitlines()) == 1
    assert "benchmarks/run.py" in result.stderr and "Traceback" not in result.stderr


def test_low_precision_benchmark_runs(tmp_path):
    """benchmarks/low_precision.py (issue 16) end to end at its quick size:
    every table row it promises, with positive timings and the dtypes asked."""
    pytest.importorskip("ml_dtypes")
    import low_precision   # benchmarks/ is on sys.path (SUITE, above)

    assert low_precision.main(["--quick", "--no-torch", "--methods", "content", "t5",
                               "--out", str(tmp_path)]) == 0
    (json_file,) = tmp_path.glob("low-precision-*-quick.json")
    data = json.loads(json_file.read_text())
    assert {(r["impl"], r["dtype"]) for r in data["content"]} == {
        ("posenc", "float32"), ("posenc", "bfloat16"), ("posenc", "float16")}
    assert all(r["gflops"] > 0 for r in data["content"])
    for method in ("content", "t5"):
        for dtype in ("float32", "bfloat16", "float16"):
            for direction in low_precision.DIRECTIONS:
                assert data["methods"][method][dtype][direction]["median_s"] > 0
    # both peaks measured on every CPU, each naming what it was measured on (bfloat16's
    # the float32 FMA's where the CPU has no bfloat16 dot product)
    assert all(data["peaks"][k] > 0 and data["peak_sources"][k] for k in ("float32", "bfloat16"))
    text = (tmp_path / json_file.name.replace(".json", ".md")).read_text()
    assert "target ≥ 1.6×" in text and text.count("| t5 |") == len(low_precision.DIRECTIONS)
    assert data["peak_sources"]["bfloat16"] in text and "family" in text
    t5_rows = [line for line in text.splitlines() if line.startswith("| t5 |")]
    assert all(line.count("% |") == 2 for line in t5_rows), t5_rows   # float32's, bfloat16's


def test_positional_benchmark_runs(tmp_path):
    """benchmarks/positional.py (issue 27) end to end at its quick size: every
    comparison it promises, in both dtypes, with positive timings and fractions of
    the measured peak, and its page regenerated from the JSON alone."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("ml_dtypes")
    import positional   # benchmarks/ is on sys.path (SUITE, above)

    assert positional.main(["--quick", "--out", str(tmp_path)]) == 0
    (json_file,) = tmp_path.glob("positional-*-quick.json")
    data = json.loads(json_file.read_text())
    for dtype in positional.DTYPES:
        for direction in ("fwd", "fwd+bwd"):
            assert set(data["fused"][dtype][direction]) == set(positional.METHODS) | {
                positional.TOKEN}
            for label in ("rope", positional.TOKEN):
                assert data["hf_rope"][f"{dtype} {label}"][direction]["hf+sdpa"]["median_ms"] > 0
            for method in ("alibi", "kerple"):
                assert data["sdpa_bias"][dtype][method][direction]["sdpa+bias"]["median_ms"] > 0
    assert all("peak_bytes" in entry for entry in data["memory"].values())
    text = (tmp_path / json_file.name.replace(".json", ".md")).read_text()
    assert text.count("% |") > 10 and "family" in text
    assert positional.markdown(data) == text


def test_save_run_never_overwrites(tmp_path):
    """A second run of the day is saved beside the first (stem + b, then c), never over it."""
    from posenc_bench.report import save_run

    first = save_run(str(tmp_path), "x-2026-11-28", {"run": 1}, "one\n")
    second = save_run(str(tmp_path), "x-2026-11-28", {"run": 2}, "two\n")
    third = save_run(str(tmp_path), "x-2026-11-28", {"run": 3}, "three\n")
    assert [os.path.basename(p) for p in (first, second, third)] == [
        "x-2026-11-28", "x-2026-11-28b", "x-2026-11-28c"]
    assert json.loads(open(first + ".json").read()) == {"run": 1}
    assert open(first + ".md").read() == "one\n" and open(third + ".md").read() == "three\n"


def test_before_after_benchmark_runs(tmp_path, posenc_home):
    """benchmarks/before_after.py (issue 38) end to end at its quick size, the posenc
    under test against itself: a turn's two processes each import their own tree's
    posenc and time every method x dtype x direction; its page regenerates from the
    JSON; a --before that is not a checkout is refused in one line."""
    pytest.importorskip("ml_dtypes")
    import before_after   # benchmarks/ is on sys.path (SUITE, above)

    assert before_after.main(["--quick", "--before", posenc_home, "--out", str(tmp_path)]) == 0
    (json_file,) = tmp_path.glob("before-after-*-quick.json")
    data = json.loads(json_file.read_text())
    keys = {f"{dtype}/{method}" for dtype in before_after.DTYPES
            for method in before_after.METHODS}
    for side in ("before", "after"):
        (times,) = data["runs"][side]
        assert set(times) == keys and all(t > 0 for pair in times.values() for t in pair)
    text = (tmp_path / json_file.name.replace(".json", ".md")).read_text()
    assert before_after.markdown(data) == text and "÷ of the best turns" in text
    with pytest.raises(SystemExit, match="not a checkout of posenc"):
        before_after.main(["--quick", "--before", str(tmp_path), "--out", str(tmp_path)])


def test_shapes_benchmark_runs(tmp_path):
    """benchmarks/shapes.py (issue 28) end to end at its quick size: every case and
    contender it promises, forward and forward+backward (the decoding step forward
    only), the GQA peaks, and its page regenerated from the JSON alone."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import shapes   # benchmarks/ is on sys.path (SUITE, above)

    assert shapes.main(["--quick", "--out", str(tmp_path)]) == 0
    (json_file,) = tmp_path.glob("shapes-*-quick.json")
    data = json.loads(json_file.read_text())
    assert set(data["cases"]) == set(shapes.CASES)
    for case, entry in data["cases"].items():
        directions = ("fwd",) if case == "decode" else ("fwd", "fwd+bwd")
        assert tuple(entry["times"]) == directions, case
        for turns in entry["times"].values():
            assert len(turns) == 3 and all(r["median_ms"] > 0 for r in turns.values()), case
    assert all("peak_bytes" in data["memory"][name] for name in
               ("posenc GQA", "posenc, k, v repeated", "HF rotation + SDPA(enable_gqa)"))
    text = (tmp_path / json_file.name.replace(".json", ".md")).read_text()
    assert text.count("Target:") == len(shapes.CASES) and "family" in text
    assert shapes.markdown(data) == text


def test_decode_benchmark_runs(tmp_path):
    """benchmarks/decode.py (issue 30) at its quick size: every method's steps against
    SDPA and the read of K and V, the rows comparison, the overhead table and the busy
    core; its page regenerated from the JSON alone."""
    pytest.importorskip("torch")
    import decode   # benchmarks/ is on sys.path (SUITE, above)

    assert decode.main(["--quick", "--busy", "--out", str(tmp_path)]) == 0
    (json_file,) = tmp_path.glob("decode-*-quick.json")
    data = json.loads(json_file.read_text())
    assert {s["method"] for s in data["steps"]} == set(decode.METHODS)
    for entry in data["steps"] + data["busy"]:
        assert len(entry["times"]) == 3 and all(r["median_ms"] > 0 for r in entry["times"].values())
    assert len(data["busy"]) == len(decode.QUICK_STEPS) and len(data["rows"]["times"]) == 2
    assert set(data["overhead"]) == {"t5", "content"}
    text = (tmp_path / json_file.name.replace(".json", ".md")).read_text()
    assert text == decode.markdown(data) and "family" in text
