"""examples/ddp.py: Hugging Face models patched onto posenc train under
torch.distributed (gloo, 2 spawned processes) with DistributedDataParallel;
the ranks stay bitwise identical and equal a one-process run on the
concatenated batches to float32 rounding.

One run of the script (a subprocess, as a user starts it: it spawns its own
2 workers) trains a tiny T5 and a tiny DeBERTa-v2 classifier for a few SGD
steps three ways: DDP as it should be (gradients averaged), DDP with a
communication hook that sums them, and no DDP at all (each rank on its own
shard).  The two wrong ones must be told apart from the right one by the
same comparisons, so the checks cannot pass trivially.

Tolerance, float32: DDP's gradient is the average of the ranks' gradients
of their shard means; the single process differentiates the mean over the
concatenated batch.  The two are equal in exact arithmetic (the loss is a
mean over examples and the shards are equal; dropout is off) and differ
only in the order of the float32 sums, a few ulps of each gradient.  Over
STEPS SGD steps with momentum (lr 0.05) that moves a parameter (|p| < 4,
where an ulp is at most 2.4e-7) by far less than TOLERANCE = 1e-5 (40 such
ulps); measured: 1.2e-7 (T5) and 4e-9 (DeBERTa).  Summed instead of averaged
gradients, or no sync, are off by more than 1e-2.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("torch.distributed")

ROOT = pathlib.Path(__file__).resolve().parent.parent
STEPS = 4
TOLERANCE = 1e-5
FUSED_NODES = {"t5": 2 + 2 * 2, "deberta": 2}       # attention layers: T5 encoder self, decoder self + cross


@pytest.fixture(scope="module")
def report(tmp_path_factory, posenc_home):
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with the gloo backend is not available")
    work = tmp_path_factory.mktemp("ddp")     # run outside the checkout, as conftest's python
    path = work / "report.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([posenc_home] + [p for p in [env.get("PYTHONPATH")] if p])
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "ddp.py"), "--model", "both",
                           "--steps", str(STEPS), "--world-size", "2", "--sync", "mean,sum,none",
                           "--report", str(path)],
                          env=env, cwd=work, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ranks bitwise identical: True" in done.stdout
    return json.loads(path.read_text())


@pytest.mark.parametrize("model", ["t5", "deberta"])
def test_ddp_ranks_identical_and_equal_to_one_process(report, model):
    result = report[model]
    assert result["world_size"] == 2 and result["steps"] == STEPS
    run, single = result["runs"]["mean"], result["single"]
    assert run["patched"] and run["fused_nodes"] == FUSED_NODES[model]     # posenc's fused attention ran
    assert run["ranks_identical"] and run["max_rank_difference"] == 0.0
    assert run["max_difference_vs_single"] <= TOLERANCE
    assert len(run["losses"]) == STEPS
    for got, want in zip(run["losses"], single["losses"]):
        assert abs(got - want) <= TOLERANCE * abs(want)
    assert result["initial_distance"] > 100 * TOLERANCE          # the steps moved the parameters


@pytest.mark.parametrize("model", ["t5", "deberta"])
def test_wrong_syncs_are_caught(report, model):
    """Gradients summed across the ranks (not averaged) keep the ranks equal
    but not equal to one process; no sync lets the ranks drift apart."""
    runs = report[model]["runs"]
    summed, unsynced = runs["sum"], runs["none"]
    assert summed["ranks_identical"]
    assert summed["max_difference_vs_single"] > 100 * TOLERANCE
    assert not unsynced["ranks_identical"] and unsynced["max_rank_difference"] > 100 * TOLERANCE
    assert unsynced["max_difference_vs_single"] > 100 * TOLERANCE
    first = {name: run["losses"][0] for name, run in runs.items()}     # same weights, same first batch
    assert max(first.values()) - min(first.values()) <= TOLERANCE * abs(first["mean"])
