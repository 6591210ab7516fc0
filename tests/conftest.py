"""Shared fixtures: a seeded random generator; one posenc and one torch thread;
posenc.torch.hf's fallbacks as errors.

The seed comes from the environment variable POSENC_TEST_SEED (default 0) and
is shown in the header of every run and in the report of every failing test
that used `rng`, so a failure can be replayed:

    POSENC_TEST_SEED=17 python -m pytest tests/test_reference.py
"""

import os
import subprocess
import sys
import warnings
import zlib

import numpy as np
import pytest

from posenc.testing import seed_from_env

SEED = seed_from_env()
collect_ignore = ["user_project"]    # a user's project, run by test_testing.py from outside
# posenc's own fixtures (posenc_isa, posenc_inputs): the installed entry point registers
# them; named here too, so that a build in place (`python setup.py build_ext --inplace`,
# posenc not installed) tests the same.  The same name: one registration either way.
pytest_plugins = ["posenc._pytest_plugin"]


def pytest_report_header(config):
    return f"POSENC_TEST_SEED={SEED}"


@pytest.fixture
def rng(request):
    """A NumPy Generator seeded from POSENC_TEST_SEED and the test's id.

    Mixing in the test id keeps tests independent: adding or reordering tests
    does not change the numbers another test draws."""
    test_key = zlib.crc32(request.node.nodeid.encode())
    return np.random.default_rng([SEED, test_key])


@pytest.fixture(scope="session")
def posenc_home():
    """The directory that holds the posenc under test (an in-place build's checkout,
    or site-packages): what a Python started by a test puts first on PYTHONPATH, so
    that it never imports the sources of the directory pytest runs in, which in an
    unpacked sdist are not built."""
    from posenc._paths import package_home

    return package_home()


@pytest.fixture
def python(tmp_path, posenc_home):
    """``python(*args, env=None, blocked=None, blocked_error="ImportError")``: runs
    ``python *args`` in tmp_path, importing the posenc under test (posenc_home first
    on PYTHONPATH), with ``import <blocked>`` failing as if it were not installed."""
    home = posenc_home

    def run(*args, env=None, blocked=None, blocked_error="ImportError", timeout=300):
        paths = [home]
        if blocked:
            blocker = tmp_path / "blocked" / blocked
            blocker.mkdir(parents=True)
            (blocker / "__init__.py").write_text(
                f"raise {blocked_error}('{blocked} is blocked for this test', name='{blocked}')\n")
            paths.insert(0, str(blocker.parent))
        environment = {**os.environ, **(env or {})}
        paths += [path for path in environment.get("PYTHONPATH", "").split(os.pathsep) if path]
        environment["PYTHONPATH"] = os.pathsep.join(paths)
        return subprocess.run([sys.executable, *args], cwd=tmp_path, env=environment,
                              capture_output=True, text=True, timeout=timeout)

    return run


@pytest.fixture
def threads():
    """posenc.set_num_threads, the previous count restored after the test (1 against
    2 threads bitwise)."""
    import posenc
    previous = posenc.get_num_threads()
    yield posenc.set_num_threads
    posenc.set_num_threads(previous)


@pytest.fixture
def no_hf_fallback():
    """A posenc.torch.hf call that falls back warns: turn that into an error, so a
    test proves posenc served it (the fallback tests catch the warning with
    pytest.warns), and forget the warnings already given once."""
    from posenc.torch import hf

    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="posenc.torch.hf")
        hf._WARNED.clear()
        yield
        hf._WARNED.clear()


@pytest.fixture(scope="module")
def one_thread():
    """One posenc and one torch thread for a module of tiny problems
    (`pytestmark = pytest.mark.usefixtures("one_thread")`).  On a machine whose
    cores are shared, every OpenMP parallel region ends at a barrier that waits
    for a descheduled thread, which turns microseconds into milliseconds per call."""
    import posenc
    import torch
    threads = posenc.get_num_threads(), torch.get_num_threads()
    posenc.set_num_threads(1)
    torch.set_num_threads(1)
    yield
    posenc.set_num_threads(threads[0])
    torch.set_num_threads(threads[1])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and "rng" in getattr(item, "fixturenames", ()):
        report.sections.append((
            "random seed",
            f"POSENC_TEST_SEED={SEED}; replay with: "
            f"POSENC_TEST_SEED={SEED} python -m pytest '{item.nodeid}'"))
