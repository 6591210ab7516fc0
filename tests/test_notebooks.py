"""The example notebooks (examples/*.ipynb) run from start to end, each well
under a minute, in a Jupyter kernel of the Python running the tests; and they
are committed without outputs.

The kernel is an ipykernel started with ``sys.executable`` (a kernel spec
written to a temporary directory, so an installed ``python3`` kernel of
another environment is never picked), importing the posenc under test, in a
scratch working directory.  Skipped when nbclient is not installed
(``pip install -e ".[test]"`` installs it); a notebook that needs torch or
matplotlib is skipped without them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import re
import sys
import time

import pytest

import posenc

ROOT = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOKS = {"quickstart.ipynb": ("matplotlib", "torch"),
             "compare_encodings.ipynb": ("matplotlib",)}
# Each notebook runs in 5-25 s on 2 cores (kernel start included); a cell may take
# SECONDS, a notebook twice that, so that a machine loaded by other work does not fail it.
SECONDS = 60
KERNEL = "posenc-test-python"


def _cells(name: str) -> list:
    return json.loads((ROOT / "examples" / name).read_text(encoding="utf-8"))["cells"]


def test_the_examples_are_these():
    assert sorted(p.name for p in (ROOT / "examples").glob("*.ipynb")) == sorted(NOTEBOOKS)


@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_committed_without_outputs(name):
    for index, cell in enumerate(_cells(name)):
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [] and cell["execution_count"] is None, (
                f"{name} cell {index} has outputs: clear them before committing "
                "(jupyter nbconvert --clear-output --inplace examples/*.ipynb)")


@pytest.fixture(scope="module")
def kernel_specs(tmp_path_factory):
    """A KernelSpecManager that knows one kernel: ipykernel on sys.executable."""
    pytest.importorskip("nbclient", reason="running the notebooks needs nbclient "
                                           "(pip install -e \".[test]\")")
    from jupyter_client.kernelspec import KernelSpecManager

    directory = tmp_path_factory.mktemp("kernels")
    (directory / KERNEL).mkdir()
    (directory / KERNEL / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": f"Python ({sys.executable})", "language": "python"}))
    return KernelSpecManager(kernel_dirs=[str(directory)])


def _kernel_environment(scratch: pathlib.Path) -> dict:
    env = dict(os.environ)
    env.pop("MPLBACKEND", None)        # the notebooks draw inline (test_docs sets Agg)
    tested = str(pathlib.Path(posenc.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [tested, env.get("PYTHONPATH")]))
    env["IPYTHONDIR"] = str(scratch / "ipython")
    return env


def _outputs(notebook, mime: str) -> list:
    return [output["data"][mime] for cell in notebook.cells if cell.cell_type == "code"
            for output in cell.outputs if mime in output.get("data", {})]


def _text(notebook) -> str:
    return "".join(output.get("text", "") for cell in notebook.cells if cell.cell_type == "code"
                   for output in cell.outputs)


@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_notebook_runs(name, kernel_specs, tmp_path, monkeypatch):
    for module in NOTEBOOKS[name]:
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{name} needs {module}, which is not installed")
    import nbformat
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient

    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    notebook = nbformat.read(ROOT / "examples" / name, as_version=4)
    manager = KernelManager(kernel_name=KERNEL, kernel_spec_manager=kernel_specs)
    client = NotebookClient(notebook, km=manager, timeout=SECONDS, kernel_name=KERNEL,
                            resources={"metadata": {"path": str(tmp_path)}})
    start = time.perf_counter()
    client.execute(env=_kernel_environment(tmp_path))
    seconds = time.perf_counter() - start
    assert seconds < 2 * SECONDS, f"{name} took {seconds:.0f} s (limit {2 * SECONDS} s)"

    assert _outputs(notebook, "image/png"), f"{name} drew no picture"
    text = _text(notebook)
    if name == "quickstart.ipynb":
        pages = "".join(_outputs(notebook, "text/html"))
        from posenc._check import DTYPES

        rows = len(DTYPES) * 2 * len(posenc.capabilities())  # dtypes x (logits, attention) x ISAs
        assert "isa active" in pages and pages.count("PASS") == rows
        assert "logits of t5 (float64) differ from posenc.reference.t5 at (b, h, i, j)" in text
        assert "my_t5_backward agrees" in text and "posenc.torch.t5's gradients agree" in text
        losses = [float(v) for v in re.findall(r"loss (\d+\.\d+)", text)]
        assert losses[-1] < 0.5 * losses[0], f"the tiny model did not learn: {losses}"
    else:
        assert text.count(" ok ") == len(posenc.METHODS)
        assert "DIET Theorem 1: rank of n x n attention" in text
