"""Threads that cannot be created degrade the team, never the process.

An OpenMP runtime cannot fail a parallel region: GNU libgomp prints "Thread
creation failed" and calls exit(1).  The engine probes a team's threads
before the runtime needs them (csrc/engine/threads.c) and lowers the team to
what can start; results are bitwise identical for any team.  Each case runs
in a subprocess, since a resource limit (or a death) is process-wide.
"""

import os
import subprocess
import sys

import pytest

import posenc

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux") or not posenc.build_info()["openmp"],
                       reason="needs Linux resource limits and an OpenMP build"),
    # under a preloaded ASan runtime its shadow memory and allocator, not libgomp, meet the
    # limits first; these run in the plain pass
    pytest.mark.skipif("libasan" in os.environ.get("LD_PRELOAD", ""),
                       reason="resource limits measure libgomp, not the ASan runtime"),
]

_SCRIPT = r"""
import os, resource, sys
import numpy as np
import posenc
from posenc._examples import make_inputs

limit, extra, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
threads = threads or posenc.get_num_threads()      # 0: the default (OMP_NUM_THREADS)
calls = []
for method in ("content", "shaw", "diet_abs"):
    args, kw = make_inputs(method, 4, 8, 256, 256, 32, rng=np.random.default_rng(0))
    args = [a.astype(np.float32) if isinstance(a, np.ndarray) and a.dtype == np.float64 else a
            for a in args]
    kw = {k: v.astype(np.float32) if isinstance(v, np.ndarray) and v.dtype == np.float64 else v
          for k, v in kw.items()}
    calls.append((method, args, kw))
posenc.set_num_threads(1)
want = []
for method, args, kw in calls:
    A = getattr(posenc, method)(*args, **kw)
    want.append((A, getattr(posenc, method + "_backward")(np.ones_like(A), *args, **kw)))


def user_threads():
    count = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            status = open(f"/proc/{pid}/status").read().splitlines()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status if ":" in line)
        if int(fields["Uid"].split()[0]) == os.getuid():
            count += int(fields["Threads"])
    return count


if limit == "as":        # extra: MiB of address space beyond what the process maps now
    vm = int([l for l in open("/proc/self/status") if l.startswith("VmSize")][0].split()[1]) << 10
    resource.setrlimit(resource.RLIMIT_AS, (vm + (extra << 20), resource.RLIM_INFINITY))
elif limit == "nproc":   # extra: threads beyond what this user runs now
    resource.setrlimit(resource.RLIMIT_NPROC, (user_threads() + extra, resource.RLIM_INFINITY))
posenc.set_num_threads(threads)
try:
    for round in range(4):          # forward and backward alternate teams: the pool shrinks and regrows
        for (method, args, kw), (A, grads) in zip(calls, want):
            got = getattr(posenc, method)(*args, **kw)
            assert np.array_equal(got, A), method
            got = getattr(posenc, method + "_backward")(np.ones_like(A), *args, **kw)
            assert all(g is None and w is None or np.array_equal(g, w)
                       for g, w in zip(got, grads)), method
except MemoryError as exc:          # a limit tight enough leaves no room for the results
    print("MemoryError", exc)
else:
    print("ok", threads)
"""


def _run(tmp_path, *argv, env=None, timeout=300):
    script = tmp_path / "threads_script.py"
    script.write_text(_SCRIPT)
    return subprocess.run([sys.executable, str(script), *map(str, argv)], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


def _check(result):
    assert "Thread creation failed" not in result.stderr, result.stderr[-2000:]
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith(("ok", "MemoryError")), result.stdout + result.stderr[-2000:]


@pytest.mark.parametrize("extra_mb", [60, 150, 400, 1000, 2000, 4000])
def test_address_space_limit_lowers_the_team(tmp_path, extra_mb):
    """200 threads of 8 MiB stacks do not fit in the address space left:
    the calls run on fewer threads, with the same results, and the process
    ends normally (a MemoryError is allowed where not even the results fit)."""
    result = _run(tmp_path, "as", extra_mb, 200)
    _check(result)
    if extra_mb >= 400:
        assert result.stdout.startswith("ok"), result.stdout


def test_address_space_limit_with_omp_stacksize(tmp_path):
    """Threads of OMP_STACKSIZE=64M: the probe creates them with that stack."""
    result = _run(tmp_path, "as", 1000, 200, env={"OMP_STACKSIZE": "64M"})
    _check(result)
    assert result.stdout.startswith("ok"), result.stdout


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0,
                    reason="root is exempt from RLIMIT_NPROC")
@pytest.mark.parametrize("spare", [3, 20])
def test_process_limit_lowers_the_team(tmp_path, spare):
    _check(_run(tmp_path, "nproc", spare, 200))


def test_thousands_of_threads_from_the_environment(tmp_path):
    """OMP_NUM_THREADS=100000: clamped to posenc.MAX_THREADS, and a call large
    enough for a team of hundreds runs with the one-thread results."""
    result = _run(tmp_path, "none", 0, 0, env={"OMP_NUM_THREADS": "100000"})
    _check(result)
    assert result.stdout.split() == ["ok", str(posenc.MAX_THREADS)], result.stdout
