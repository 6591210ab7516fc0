"""The C engine's shape (csrc/engine/): every header compiles on its own and
includes what it uses, so no file depends on the order another includes it
in; no file declares a function that another defines (a forward declaration
across files is a circle of calls between them); the includes form no
circle; and docs/internals.md's map of the engine names every file there is.
"""

import pathlib
import re
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
ENGINE = ROOT / "csrc" / "engine"

pytestmark = pytest.mark.skipif(not ENGINE.is_dir(), reason="needs the source tree")

HEADERS = sorted(p.name for p in ENGINE.glob("*.h")) if ENGINE.is_dir() else []
SOURCES = sorted(p.name for p in ENGINE.glob("*.c")) if ENGINE.is_dir() else []
# The templates, compiled once per REAL by engine_f32.c and engine_f64.c.
TEMPLATES = [h for h in HEADERS if h.endswith("_impl.h")]

DTYPES = {"float": ("float", "POSENC_F32"), "double": ("double", "POSENC_F64")}


def _strip_comments(text: str) -> str:
    return re.sub(r"/\*.*?\*/|//[^\n]*", " ", text, flags=re.S)


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc not found")
@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("header", HEADERS)
def test_header_compiles_alone(header, dtype):
    """The header as the only thing in a translation unit (a template with its
    REAL set, as engine_<dtype>.c sets it): every name it uses is declared by
    what it includes."""
    real, real_dtype = DTYPES[dtype]
    command = ["gcc", "-fsyntax-only", "-std=c11", "-fopenmp", "-Wall",
               "-Werror=implicit-function-declaration", "-Wno-unused-function",
               "-I", str(ROOT / "csrc"), f"-DREAL={real}", f"-DREAL_DTYPE={real_dtype}",
               "-x", "c", str(ENGINE / header)]
    run = subprocess.run(command, capture_output=True, text=True)
    assert run.returncode == 0 and "warning" not in run.stderr, run.stderr


def _includes(name: str) -> list:
    text = _strip_comments((ENGINE / name).read_text())
    found = re.findall(r'^\s*#\s*include\s+"([^"]+)"', text, re.M)
    return [f for f in found if (ENGINE / f).exists()]


def test_includes_form_no_circle():
    graph = {name: _includes(name) for name in HEADERS + SOURCES}
    state = {}

    def visit(node, path):
        state[node] = "open"
        for nxt in graph.get(node, ()):
            if state.get(nxt) == "open":
                raise AssertionError("include circle: " + " -> ".join(path + [node, nxt]))
            if nxt not in state:
                visit(nxt, path + [node])
        state[node] = "done"

    for node in graph:
        if node not in state:
            visit(node, [])


def test_headers_are_guarded():
    for name in HEADERS:
        text = _strip_comments((ENGINE / name).read_text())
        guard = re.search(r"#\s*ifndef\s+(\w+)\s*\n\s*#\s*define\s+\1\b", text)
        assert guard, f"{name}: no include guard"


def test_no_forward_declaration_of_a_static_function():
    """A template declares no static function without its body: each function
    is defined before its callers, in its own file or one it includes."""
    pattern = re.compile(r"^static\s[^;{}=]*?\b(\w+)\s*\([^;{}]*\)\s*;", re.M)
    found = []
    for name in TEMPLATES:
        for match in pattern.finditer(_strip_comments((ENGINE / name).read_text())):
            found.append(f"{name}: {match.group(1)}")
    assert not found, found


def test_internals_names_every_engine_file():
    """docs/internals.md's map of the engine (its section 0) names every file
    of csrc/engine/ and no file that is not there."""
    text = (ROOT / "docs" / "internals.md").read_text()
    section = text[text.index("## 0."):text.index("## 1.")]
    named = set(re.findall(r"`([\w./<>]+\.[ch])`", section))
    files = set(HEADERS + SOURCES)
    missing = sorted(files - named)
    assert not missing, f"docs/internals.md section 0 does not name {missing}"
    anywhere = {p.name for p in (ROOT / "csrc").rglob("*.[ch]")}
    unknown = sorted(n for n in named if pathlib.PurePath(n).name not in anywhere)
    assert not unknown, f"docs/internals.md section 0 names files that do not exist: {unknown}"
