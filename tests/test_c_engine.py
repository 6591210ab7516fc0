"""The C engine's own test (tests/c/test_engine.c), built and run without
Python: natively, cross-compiled for AArch64 under qemu (the NEON kernels),
and under valgrind memcheck.  Skipped, with the reason shown, where the
compiler or emulator is missing; .ci/run installs them."""

import os
import platform
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RUN = ROOT / "tests" / "c" / "run.sh"

pytestmark = pytest.mark.skipif(not (ROOT / "csrc").is_dir(), reason="needs the source tree (csrc/)")


def _run(mode, tmp_path):
    env = dict(os.environ, POSENC_CTEST_DIR=str(tmp_path))
    env.pop("LD_PRELOAD", None)   # a sanitizer run of the Python suite must not reach valgrind
    result = subprocess.run([str(RUN), mode], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=900)
    print(result.stdout[-4000:], result.stderr[-4000:])
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert " 0 failures" in result.stdout
    return result.stdout


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc not found")
def test_native(tmp_path):
    _run("native", tmp_path)


@pytest.mark.skipif(shutil.which("aarch64-linux-gnu-gcc") is None or shutil.which("qemu-aarch64") is None,
                    reason="NEON check needs gcc-aarch64-linux-gnu, libgomp1-arm64-cross, qemu-user")
def test_neon_under_qemu(tmp_path):
    out = _run("neon", tmp_path)
    assert "neon" in out.split("ISAs supported:")[1].splitlines()[0]


@pytest.mark.skipif(shutil.which("valgrind") is None or platform.machine() != "x86_64",
                    reason="valgrind memcheck run needs valgrind on x86-64")
def test_valgrind_memcheck(tmp_path):
    _run("valgrind", tmp_path)
