"""posenc's pytest plugin: fixtures for testing code against posenc.

Registered by the package's ``pytest11`` entry point, named as this module,
so every pytest run in an environment where posenc is installed has it;
``-p posenc._pytest_plugin`` (or ``pytest_plugins = ["posenc._pytest_plugin"]``
in a conftest.py) loads it where posenc is not installed, and is harmless
where it is; ``-p no:posenc._pytest_plugin`` turns it off.  posenc itself is
imported only by a test that uses a fixture.

* ``posenc_isa``: the test runs once per ISA of this CPU
  (``posenc.capabilities()``, ids ``[scalar]``, ``[avx2]``, ...), with
  ``posenc.set_isa`` set to it; the fixture's value is the ISA's name, and the
  previous ISA is restored after the test.  A test may choose its own with
  ``@pytest.mark.parametrize("posenc_isa", ["scalar"], indirect=True)``.
* ``posenc_inputs``: a factory, ``posenc_inputs(method, B=2, H=3, n=7, m=5,
  d=4, dtype=np.float64, seed=POSENC_TEST_SEED, **options)`` ->
  :func:`posenc.testing.random_inputs`; the default seed is the environment
  variable ``POSENC_TEST_SEED`` (default 0), shown with the replay command in
  the report of a failing test that used a fixture.
"""

from __future__ import annotations

import functools
import os

import pytest

FIXTURES = ("posenc_isa", "posenc_inputs")


def _parametrized_by_test(metafunc, name: str) -> bool:
    for marker in metafunc.definition.iter_markers("parametrize"):
        names = marker.args[0] if marker.args else marker.kwargs.get("argnames", ())
        if isinstance(names, str):
            names = [part.strip() for part in names.split(",")]
        if name in names:
            return True
    return False


def pytest_generate_tests(metafunc):
    if "posenc_isa" in metafunc.fixturenames and not _parametrized_by_test(metafunc, "posenc_isa"):
        import posenc

        isas = posenc.capabilities()
        metafunc.parametrize("posenc_isa", isas, indirect=True, ids=isas)


@pytest.fixture
def posenc_isa(request):
    """The ISA this test runs posenc's kernels with (parametrised over the CPU's)."""
    import posenc

    previous = posenc.get_isa()
    isa = getattr(request, "param", previous)
    posenc.set_isa(isa)
    try:
        yield isa
    finally:
        posenc.set_isa(previous)


@pytest.fixture
def posenc_inputs():
    """``posenc_inputs(method, B=2, H=3, n=7, m=5, d=4, dtype=..., seed=..., **options)``:
    random inputs of a method (posenc.testing.random_inputs), seeded from
    POSENC_TEST_SEED unless ``seed`` is given."""
    from posenc.testing import random_inputs, seed_from_env

    # read here, not at import: a bad value fails the tests that use the fixture, naming
    # the variable, and no other test of the run
    return functools.partial(random_inputs, seed=seed_from_env())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    used = [name for name in FIXTURES if name in getattr(item, "fixturenames", ())]
    if report.failed and used:
        callspec = getattr(item, "callspec", None)
        isa = callspec.params.get("posenc_isa") if callspec is not None else None
        seed = os.environ.get("POSENC_TEST_SEED", "0")
        report.sections.append((
            "posenc",
            f"fixtures {', '.join(used)}; POSENC_TEST_SEED={seed}"
            + (f"; ISA {isa}" if isa else "")
            + f"; replay with: POSENC_TEST_SEED={seed} python -m pytest '{item.nodeid}'"))
