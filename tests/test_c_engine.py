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


def _env(out_dir):
    env = dict(os.environ, POSENC_CTEST_DIR=str(out_dir))
    env.pop("LD_PRELOAD", None)   # a sanitizer run of the Python suite must not reach valgrind
    return env


def _check(mode, returncode, stdout, stderr):
    print(stdout[-4000:], stderr[-4000:])
    assert returncode == 0, f"{mode}: rc {returncode}\n" + stdout[-2000:] + stderr[-2000:]
    assert " 0 failures" in stdout
    return stdout


def _run(mode, tmp_path):
    result = subprocess.run([str(RUN), mode], cwd=ROOT, env=_env(tmp_path), capture_output=True,
                            text=True, timeout=900)
    return _check(mode, result.returncode, result.stdout, result.stderr)


# The emulated runs (qemu, valgrind) each keep one core busy for minutes: they start
# together, on the first test that asks for either, and each test waits for its own.
HAVE_NEON = shutil.which("aarch64-linux-gnu-gcc") is not None and shutil.which("qemu-aarch64") is not None
HAVE_VALGRIND = shutil.which("valgrind") is not None and platform.machine() == "x86_64"


@pytest.fixture(scope="module")
def emulated(request, tmp_path_factory):
    """mode -> the finished run's stdout (or its failure), for the modes available whose
    tests the session runs."""
    selected = {item.name for item in request.session.items}
    started = {}
    for mode, test in (("neon", "test_neon_under_qemu"), ("valgrind", "test_valgrind_memcheck")):
        if {"neon": HAVE_NEON, "valgrind": HAVE_VALGRIND}[mode] and test in selected:
            out_dir = tmp_path_factory.mktemp(mode)
            logs = (open(out_dir / "stdout", "w+"), open(out_dir / "stderr", "w+"))
            started[mode] = (subprocess.Popen([str(RUN), mode], cwd=ROOT, env=_env(out_dir),
                                              stdout=logs[0], stderr=logs[1], text=True), logs)

    def finish(mode):
        process, logs = started[mode]
        try:
            process.wait(timeout=900)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        outputs = []
        for log in logs:
            log.seek(0)
            outputs.append(log.read())
        return _check(mode, process.returncode, *outputs)

    yield finish
    for process, logs in started.values():
        if process.poll() is None:
            process.kill()
            process.wait()
        for log in logs:
            log.close()


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc not found")
def test_native(tmp_path):
    _run("native", tmp_path)


@pytest.mark.skipif(not HAVE_NEON,
                    reason="NEON check needs gcc-aarch64-linux-gnu, libgomp1-arm64-cross, qemu-user")
def test_neon_under_qemu(emulated):
    out = emulated("neon")
    assert "neon" in out.split("ISAs supported:")[1].splitlines()[0]


@pytest.mark.skipif(not HAVE_VALGRIND, reason="valgrind memcheck run needs valgrind on x86-64")
def test_valgrind_memcheck(emulated):
    emulated("valgrind")
