"""`python -m posenc info|check|bench|rank|plot` as a user types them."""

import pathlib

import pytest

BENCHMARKS = pathlib.Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture
def run(python):
    """`python -m posenc *args` as a user types it, outside the source tree."""
    return lambda *args, timeout=300: python("-m", "posenc", *args, timeout=timeout)


def test_info(run):
    result = run("info")
    assert result.returncode == 0, result.stderr
    for field in ("posenc", "compiler", "isa usable", "isa active", "threads"):
        assert field in result.stdout


def test_check_passes_and_prints_table(run):
    result = run("check", "--methods", "content", "t5", "--n", "9", "--m", "7", "--d", "5")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert any(line.startswith("content") and "PASS" in line for line in lines)
    assert "0 failed" in result.stdout


def test_check_rejects_unknown_method_and_isa(run):
    assert run("check", "--methods", "sinusoidal").returncode == 2
    result = run("check", "--isa", "sse9")
    assert result.returncode == 2 and "not available" in result.stderr


@pytest.mark.parametrize("command", ["bench", "rank", "plot"])
def test_passthrough_help(command, run):
    # the bench suite is the checkout's (or the sdist's) benchmarks/, not the package's
    result = run(command, *(["--suite", str(BENCHMARKS)] if command == "bench" else []), "--help")
    assert result.returncode == 0, result.stderr
    assert "usage" in result.stdout


def test_rank_runs(run):
    result = run("rank", "--n", "24", "--d-model", "32", "--d-head", "4")
    assert result.returncode == 0, result.stderr
    assert "Theorem 1" in result.stdout


def test_plot_writes_png(tmp_path, run):
    pytest.importorskip("matplotlib")
    target = tmp_path / "t5.png"
    result = run("plot", "--method", "t5", "--random-params", "--n", "16", "-o", str(target))
    assert result.returncode == 0, result.stderr
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_defaults_and_path_errors(tmp_path, run):
    """plot runs without flags (t5, posenc-t5.png here); a bad path is one line naming the
    flag and exit 2, not a traceback."""
    pytest.importorskip("matplotlib")
    result = run("plot", "--n", "8")                 # in tmp_path, as the python fixture runs
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "posenc-t5.png").read_bytes()[:4] == b"\x89PNG"
    for args, message in ((("-o", str(tmp_path / "missing" / "x.png")), "-o "),
                          (("--npz", str(tmp_path / "none.npz")), "--npz "),
                          (("--save-params", str(tmp_path / "missing" / "p.npz")), "--save-params ")):
        result = run("plot", *args)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        assert f"error: {message}" in result.stderr, result.stderr


def test_check_help_documents_every_flag(run):
    result = run("check", "--help")
    for flag, text in (("--B", "batch rows"), ("--H", "query heads"), ("--n", "queries per row"),
                       ("--m", "keys per row"), ("--d", "head width"), ("--seed", "random seed")):
        line = next(line for line in result.stdout.splitlines() if line.strip().startswith(flag + " "))
        assert text in line, result.stdout
