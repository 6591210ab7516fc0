"""posenc.lab at its seconds-long preset: the data split is deterministic, the
perplexity is a plain evaluation loop's, every encoding trains a step and
evaluates, the same seed gives the same JSON, the tasks and the command line
(JSON, PNG, SVG, re-plotting) work, and --hf runs the same through the swap."""

from __future__ import annotations

import json
import math
import os
import zlib
from dataclasses import replace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from posenc import lab  # noqa: E402

SMOKE = replace(lab.PRESETS["smoke"], steps=2)


@pytest.fixture(scope="module")
def text_folder(tmp_path_factory):
    """40 small text files: a corpus the split sends 4 or so to validation."""
    folder = tmp_path_factory.mktemp("text")
    rng = np.random.default_rng(0)
    for index in range(40):
        words = rng.choice(["def", "return", "self", "x", "(", ")", ":", "\n", "    ", "1"], 400)
        (folder / f"file{index:02d}.py").write_text(" ".join(words))
    return str(folder)


def test_split_is_by_file_name_and_deterministic(text_folder):
    paths = sorted(os.path.join(text_folder, name) for name in os.listdir(text_folder))
    train, valid, info = lab.split_corpus(paths)
    again = lab.split_corpus(list(reversed(paths)) and paths)
    assert np.array_equal(train, again[0]) and np.array_equal(valid, again[1])
    held = [p for p in paths if zlib.crc32(os.path.basename(p).encode()) % 10 == 0]
    assert held and len(valid) == sum(os.path.getsize(p) + 2 for p in held)
    assert info["train_bytes"] + info["validation_bytes"] == sum(os.path.getsize(p) + 2
                                                                  for p in paths)
    with pytest.raises(ValueError, match="no training or no validation"):
        lab.split_corpus([p for p in paths if p not in held])


def test_stdlib_corpus_is_the_standard_library():
    files = lab.stdlib_files()
    assert len(files) > 100 and all(f.endswith(".py") for f in files)
    assert not any("site-packages" in f for f in files)


def test_perplexity_is_a_plain_evaluation_loop():
    torch.manual_seed(0)
    model = lab.build_model("alibi", SMOKE, 256)
    valid = np.random.default_rng(1).integers(0, 256, 400).astype(np.uint8)
    length, tokens = 32, 200

    def plain(stride):
        nll = []
        with torch.no_grad():
            for start in range(0, tokens - length + 1, stride or length):
                window = torch.from_numpy(valid[start:start + length + 1].astype(np.int64))
                logits = model(window[None, :-1])[0].double()
                losses = torch.nn.functional.cross_entropy(logits, window[1:], reduction="none")
                first = 0 if stride is None or start == 0 else length - stride
                nll += losses[first:].tolist()
        return math.exp(sum(nll) / len(nll))

    for stride in (None, 16):
        assert lab.perplexity(model, valid, length, tokens, stride=stride, batch=3) == \
            pytest.approx(plain(stride), rel=1e-12)
    with pytest.raises(ValueError, match="fewer than"):
        lab.perplexity(model, valid[:20], length, tokens)


def test_every_encoding_trains_and_evaluates(text_folder):
    result = lab.extrapolate(preset=SMOKE, data=[text_folder], quiet=True, log=lambda _: None)
    assert list(result["results"]) == list(lab.ENCODINGS)
    for row in result["results"].values():
        assert len(row["train_loss"]) == 1 and math.isfinite(row["train_loss"][0])
        for column in ("nonoverlapping", "sliding"):
            values = [row[column][str(n)] for n in result["lengths"]]
            assert all(1 < v < 1000 for v in values)       # near log 256 untrained
    assert "| nope |" in lab.table(result) and "(train)" in lab.table(result, "sliding")


def test_the_same_seed_gives_the_same_json(text_folder):
    runs = [json.dumps(lab.extrapolate(["rope", "t5"], SMOKE, [text_folder], seed=3, quiet=True,
                                       log=lambda _: None), sort_keys=True) for _ in range(2)]
    assert runs[0] == runs[1]
    other = lab.extrapolate(["rope"], SMOKE, [text_folder], seed=4, quiet=True, log=lambda _: None)
    assert other["results"]["rope"] != json.loads(runs[0])["results"]["rope"]


@pytest.mark.parametrize("task", lab.TASKS)
def test_task_batches_hold_their_answers(task):
    tokens, targets = lab.task_batch(task, 6, 5, 32, np.random.default_rng(0))
    row = torch.cat([tokens, targets[:, -1:]], 1)
    scored = targets != -100
    if task == "recall":
        assert scored.sum(1).tolist() == [1] * 5
        pairs = row[:, :6].reshape(5, 3, 2)
        query, answer = row[:, 7], row[:, 8]
        for b in range(5):
            assert answer[b] == pairs[b][pairs[b][:, 0] == query[b]][0, 1]
    else:
        items, answer = row[:, :6], row[:, 7:]
        want = {"copy": items, "reverse": items.flip(1), "sort": items.sort(1).values}[task]
        assert torch.equal(answer, want) and scored.sum(1).tolist() == [6] * 5


def test_tasks_train_and_measure_accuracy():
    result = lab.tasks(["nope", "alibi"], ["copy", "recall"], SMOKE, quiet=True, log=lambda _: None)
    for task in ("copy", "recall"):
        for row in result["results"][task].values():
            for value in row["accuracy"].values():
                assert 0 <= value["sequence"] <= value["token"] <= 1
    assert "| recall | alibi |" in lab.table(result)


def test_command_line_writes_json_and_plots_and_replots(text_folder, tmp_path, python):
    pytest.importorskip("matplotlib")
    out = str(tmp_path / "run")
    command = ["-m", "posenc", "lab", "extrapolate", "--preset", "smoke",
               "--steps", "2", "--encodings", "nope", "alibi", "--data", text_folder,
               "--quiet", "--out", out]
    done = python(*command)
    assert done.returncode == 0, done.stderr
    assert "| alibi |" in done.stdout and "sliding windows" in done.stdout
    for extension in (".json", ".png", ".svg"):
        assert os.path.getsize(out + extension) > 100
    again = python("-m", "posenc", "lab", "plot", out + ".json", out + ".json",
                   "--out", str(tmp_path / "both"))
    assert again.returncode == 0, again.stderr
    assert os.path.exists(str(tmp_path / "both.png")) and "| nope |" in again.stdout
    bad = python(*command[:4], "--encodings", "fire")
    assert bad.returncode == 2 and "invalid choice: 'fire'" in bad.stderr


def test_hf_runs_the_same_through_the_swap(text_folder):
    pytest.importorskip("transformers")
    result = lab.extrapolate(["kerple"], SMOKE, [text_folder], hf=True, quiet=True,
                             log=lambda _: None)
    assert result["hf"] and all(1 < v < 1000 for v in result["results"]["kerple"]["sliding"].values())
