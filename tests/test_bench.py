"""Smoke test of the benchmark suite (posenc.bench): it runs at a tiny size and
writes its JSON, Markdown and PNG files. No timing is asserted anywhere: the
figures of a quick run on a shared machine mean nothing."""

import glob
import json
import os

import numpy as np
import pytest

import posenc
from posenc import _bench_cases as cases
from posenc import bench

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
    assert bench.main(["--quick", "--out", str(out)]) == 0
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
    headline = text.split("## Headline", 1)[1].split("## Issue 3 targets", 1)[0]
    rows = [line.split("|")[1].strip() for line in headline.splitlines()
            if line.startswith("| ") and not line.startswith("| method")]
    assert rows == list(posenc.METHODS)
    for section in ("## Machine", "## Machine limits", "## What was run", "## Issue 3 targets",
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
    code = bench.main(["--quick", "--no-torch", "--no-subprocess", "--methods", "content", "t5",
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
