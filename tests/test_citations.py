"""The docs and the source comments cite only what the repository holds.

A user sees the repository and nothing else, so every file, section and C
name that README.md, docs/*.md and the comments and docstrings of the code
cite must be in it.  One test per scanned file, ``test_citations[csrc/cpu.c]``;
its failure lists ``file:line: what is cited, and why it is stale``.

What is scanned (the "text" of a file):

* README.md and docs/*.md: the whole page, code blocks included.
* C (csrc/**/*.c, *.h; tests/c/*.c, *.h): the comments.
* Python (posenc/, benchmarks/, examples/*.py, tests/, setup.py): the comments
  and the docstrings.  Other strings are code (paths built in f-strings,
  output folders), not citations.

The rules, each applied to every text:

1. Paths.  A token ``<dir>/<rest>`` whose first part is a top-level folder
   (csrc, posenc, docs, tests, benchmarks, examples), a folder of csrc
   (engine, isa, machine: C comments cite ``isa/avx2.c``) or
   benchmarks/posenc_bench, and is not itself inside a longer path or URL,
   must be a file or folder of the repository (tracked, or untracked and not
   ignored).  A token with ``<...>``, ``{...}`` or ``*`` (``csrc/isa/<x>.c``,
   ``engine_<dtype>.c``) is a pattern: it must match one.  What a command
   writes at run time is exempt only through ``GENERATED``.
2. Bare file names.  ``<name>.c`` / ``<name>.h`` not inside a path must be
   the name of a file under csrc/ or tests/c/ (C comments name a sibling
   without its folder; a system header is written ``<immintrin.h>``);
   ``<name>.md`` must be the name of a Markdown file of the repository, so
   nothing cites a page users do not have.
3. Sections.  ``SPEC §n`` (also ``spec §n``, ``spec.md §n``, ``SPEC n.m``,
   and lists and ranges ``§6, §7``, ``§3.13-3.15``) must be a numbered heading
   of docs/spec.md (``## 7.``, ``### 3.4``); ``<page>.md §n`` one of that
   page; a bare ``§n`` on a page with numbered headings (spec.md,
   internals.md, low_precision.md) one of that page.  Other bare ``§n`` are
   papers' sections and are not checked.
4. C names, in csrc's comments.  A name written as a call (``posenc_validate()``,
   ``round_up(kc, 2)``) or written bare, in this code's style -- lower case,
   words of two or more characters joined by ``_`` (``forward_unit``; not the
   math's ``q_i``, ``sum_j``) -- must be named by csrc's code.  A bare one may
   instead be a name of the other code (comments name Python arguments such
   as ``num_buckets``).  Compiler builtins (``__builtin_*``) are exempt.
5. C names, in docs/internals.md (its names are the code's, "so grep finds
   them").  Every backticked call of a C-style name (lower case:
   ``fill_table()``, ``row_gather(op, ...)``; or a macro: ``STORE_FENCE()``),
   every backticked ``posenc_*`` name (its ``.field`` parts too) and every
   other backticked lower-case name with a ``_`` that carries an engine
   prefix (``ENGINE_PREFIXES``) or that no other code uses must be named by
   csrc's code.

"The other code" is the Python files (posenc/, tests/, benchmarks/,
setup.py) and tests/c/ (its C and run.sh), read as plain identifiers.

"Named by csrc's code" is an identifier of csrc/**/*.{c,h} with comments and
string literals stripped.  That stands in for a grep of definitions: a C
name the code uses is defined by it (a function, macro, type, field, enum
constant -- some only through X-macros such as POSENC_ARRAYS) or by a system
header, and the names checked are the engine's own style.
"""

from __future__ import annotations

import ast
import functools
import io
import os
import pathlib
import re
import subprocess
import tokenize

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent

# Rule 1's exemptions: paths that a command writes, which no checkout holds.
GENERATED = {
    "posenc/_C",                  # the extension `setup.py build_ext --inplace` builds
    "benchmarks/results/tmp",     # benchmarks' scratch output folder (.gitignore'd)
}

# Rule 5: backticked names with these prefixes are the engine's, never Python's.
ENGINE_PREFIXES = ("posenc_", "attention_", "forward_", "backward_", "gemm_", "term_",
                   "tile_", "scatter_", "pack_", "exact_")

# Rule 5: C library calls internals.md quotes (libgomp's `exit(1)`).
C_LIBRARY = {"exit"}

TOP_DIRS = ("csrc", "posenc", "docs", "tests", "benchmarks", "examples")
SHORT_DIRS = {"engine": "csrc/engine", "isa": "csrc/isa", "machine": "csrc/machine",
              "posenc_bench": "benchmarks/posenc_bench"}

_SEGMENT = r"(?:[\w.*-]|<[^<>\s]*>|\{[^{}\s]*\})+"
PATH = re.compile(r"(?<![\w./<>*{}$-])((?:%s)/%s(?:/%s)*/?)"
                  % ("|".join(TOP_DIRS + tuple(SHORT_DIRS)), _SEGMENT, _SEGMENT))
BARE_FILE = re.compile(r"(?<![\w./<>*{}-])((?:[\w*]|<[^<>\s]*>)+\.(?:c|h|md))(?![\w/])")
NUMBER = r"(\d+(?:\.\d+)*)"
# A list or range of section numbers after its first: ", §7", " and §7", "-3.15", "–3".
MORE = re.compile(r"\s*(?:(?:,|and)\s*§\s*|[-–]\s*§?\s*)" + NUMBER)
SPEC_REF = re.compile(r"\b(?:SPEC|[Ss]pec)(?:\.md)?\b[`\])]*(?:\(spec\.md\))?[,:]?\s*"
                      r"(?:§\s*" + NUMBER + r"|(\d+\.\d+(?:\.\d+)*))")
PAGE_REF = re.compile(r"\b(\w+)\.md\b[`\])]*(?:\(\w+\.md\))?[,:]?\s*§\s*" + NUMBER)
BARE_SECTION = re.compile(r"§\s*" + NUMBER)
HEADING = re.compile(r"^#{1,6}\s+" + NUMBER + r"\.?\s", re.M)
C_STYLE = r"[a-z][a-z0-9]*(?:_[a-z0-9]{2,})+"
C_CALL = re.compile(r"(?<![\w.>$-])(%s)\(|(?<![\w.>$-])([A-Za-z_]\w*)\(\)" % C_STYLE)
C_BARE = re.compile(r"(?<![\w./>$-])(%s)(?![\w(]|\.[A-Za-z])" % C_STYLE)
C_COMMENT_OR_STRING = re.compile(
    r"//[^\n]*|/\*.*?\*/|\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*'", re.S)


# ------------------------------------------------------------------ the repository

@functools.lru_cache(maxsize=None)
def repository() -> frozenset:
    """Every file of the repository and every folder above one, relative to
    ROOT: git's tracked and untracked-but-not-ignored files, or outside a
    checkout every file but caches and build outputs."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT, capture_output=True, text=True, check=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", "__pycache__", "build", "dist", ".pytest_cache", ".hypothesis"}
        listed = []
        for folder, dirs, files in os.walk(ROOT):
            dirs[:] = [d for d in dirs if d not in skip and not d.startswith(".venv")]
            rel = pathlib.Path(folder).relative_to(ROOT)
            listed += [(rel / f).as_posix() for f in files]
    paths = set()
    for name in listed:
        if (ROOT / name).exists():
            parts = name.split("/")
            paths.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
    return frozenset(paths)


def _files(*patterns: str) -> list:
    found = set()
    for pattern in patterns:
        found.update(p.relative_to(ROOT).as_posix() for p in ROOT.glob(pattern))
    return sorted(f for f in found if f in repository())


def scanned_files() -> list:
    return _files("README.md", "docs/*.md", "csrc/**/*.c", "csrc/**/*.h", "tests/c/*.c",
                  "tests/c/*.h", "posenc/**/*.py", "benchmarks/**/*.py", "examples/*.py",
                  "tests/**/*.py", "setup.py")


def _glob_regex(pattern: str) -> re.Pattern:
    """A path pattern as a regex: <...>, {...} and * stand for any name part."""
    parts = re.split(r"(<[^<>]*>|\{[^{}]*\}|\*)", pattern)
    return re.compile("".join("[^/]+" if i % 2 else re.escape(p) for i, p in enumerate(parts)))


def path_exists(path: str) -> bool:
    path = path.rstrip("/")
    if path in GENERATED:
        return True
    if re.search(r"[<>{}*]", path):
        regex = _glob_regex(path)
        return any(regex.fullmatch(p) for p in repository())
    return path in repository()


@functools.lru_cache(maxsize=None)
def file_names(*folders: str) -> frozenset:
    return frozenset(p.rsplit("/", 1)[-1] for p in repository()
                     if any(p.startswith(f + "/") for f in folders))


def bare_file_exists(name: str) -> bool:
    if name.endswith(".md"):
        names = frozenset(p.rsplit("/", 1)[-1] for p in repository() if p.endswith(".md"))
    else:
        names = file_names("csrc", "tests/c")
    if re.search(r"[<>*]", name):
        regex = _glob_regex(name)
        return any(regex.fullmatch(n) for n in names)
    return name in names


@functools.lru_cache(maxsize=None)
def sections(page: str) -> frozenset:
    """The numbers of a page's numbered headings, "7" for "## 7. ..."."""
    path = ROOT / "docs" / page
    if not path.exists():
        return frozenset()
    return frozenset(HEADING.findall(path.read_text(encoding="utf-8")))


def strip_c(text: str) -> str:
    """C code without its comments and string literals (newlines kept)."""
    return C_COMMENT_OR_STRING.sub(
        lambda m: re.sub(r"[^\n]", " ", m.group(0)) if m.group(0)[0] in "/\"'" else m.group(0),
        text)


@functools.lru_cache(maxsize=None)
def c_names() -> frozenset:
    names = set()
    for path in _files("csrc/**/*.c", "csrc/**/*.h"):
        names.update(re.findall(r"[A-Za-z_]\w*", strip_c((ROOT / path).read_text())))
    return frozenset(names)


@functools.lru_cache(maxsize=None)
def other_names() -> frozenset:
    """The identifiers of the code outside csrc that docs and comments name
    (but this file's, whose examples of stale names are no code)."""
    names = set()
    for path in _files("posenc/**/*.py", "tests/**/*.py", "benchmarks/**/*.py", "setup.py",
                       "tests/c/*"):
        if ROOT / path == pathlib.Path(__file__).resolve():
            continue
        names.update(re.findall(r"[A-Za-z_]\w*", (ROOT / path).read_text(encoding="utf-8")))
    return frozenset(names)


# ------------------------------------------------------------------ the texts of a file

def texts(path: str) -> list:
    """[(first line, text)] of a file: what its citations are read from."""
    source = (ROOT / path).read_text(encoding="utf-8")
    if path.endswith(".md"):
        return [(1, source)]
    if path.endswith((".c", ".h")):
        found = []
        for match in C_COMMENT_OR_STRING.finditer(source):
            if match.group(0).startswith("/"):
                # " * " at the start of a comment's lines is decoration, not text
                text = re.sub(r"(?m)^[ \t]*\*(?!/)", " ", match.group(0))
                found.append((source.count("\n", 0, match.start()) + 1, text))
        return found
    found, comments = [], []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            line = token.start[0]
            if comments and comments[-1][0] + comments[-1][1].count("\n") == line - 1:
                comments[-1] = (comments[-1][0], comments[-1][1] + "\n" + token.string[1:])
            else:
                comments.append((line, token.string[1:]))
    found += comments
    lines = source.splitlines()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                found.append((first.lineno, "\n".join(lines[first.lineno - 1:first.end_lineno])))
    return found


# ------------------------------------------------------------------ the rules

def check_paths(text: str) -> list:
    stale = []
    for match in PATH.finditer(text):
        token = match.group(1).rstrip(".")
        first, _, rest = token.partition("/")
        path = f"{SHORT_DIRS[first]}/{rest}" if first in SHORT_DIRS else token
        if not path_exists(path):
            stale.append((match.start(), f"cites {token}, which the repository does not hold"))
    for match in BARE_FILE.finditer(text):
        if not bare_file_exists(match.group(1)):
            where = "Markdown file" if match.group(1).endswith(".md") else \
                "file of csrc/ or tests/c/"
            stale.append((match.start(), f"cites {match.group(1)}, the name of no {where}"))
    return stale


def _numbers(match: re.Match, text: str) -> tuple:
    """The section numbers of a reference: its first, then the list or range after it."""
    numbers = [next(g for g in match.groups()[-2:] if g)] if match.re is SPEC_REF \
        else [match.groups()[-1]]
    end = match.end()
    while (more := MORE.match(text, end)):
        numbers.append(more.group(1))
        end = more.end()
    return numbers, end


def check_sections(path: str, text: str) -> list:
    stale, covered = [], []
    refs = [(m, "spec.md") for m in SPEC_REF.finditer(text)]
    refs += [(m, m.group(1) + ".md") for m in PAGE_REF.finditer(text)
             if m.group(1).lower() != "spec"]
    for match, page in refs:
        numbers, end = _numbers(match, text)
        covered.append((match.start(), end))
        for number in numbers:
            if number not in sections(page):
                stale.append((match.start(), f"cites §{number} of docs/{page}, which has no such "
                                             f"heading"))
    own = pathlib.PurePath(path).name
    if path.startswith("docs/") and sections(own):
        for match in BARE_SECTION.finditer(text):
            if any(start <= match.start() < end for start, end in covered):
                continue
            numbers, end = _numbers(match, text)
            covered.append((match.start(), end))
            for number in numbers:
                if number not in sections(own):
                    stale.append((match.start(), f"cites §{number} of this page, which has no "
                                                 f"such heading"))
    return stale


def check_c_comment_names(text: str) -> list:
    stale = []
    for match in C_CALL.finditer(text):
        name = match.group(1) or match.group(2)
        if name not in c_names() and not name.startswith("__builtin_"):
            stale.append((match.start(), f"cites {name}(...), which csrc's code does not name"))
    for match in C_BARE.finditer(text):
        name = match.group(1)
        if name not in c_names() and name not in other_names():
            stale.append((match.start(), f"cites {name}, which no code names"))
    return stale


def check_internals_names(text: str) -> list:
    stale = []
    for match in re.finditer(r"`([^`\n]+)`", text):
        span = match.group(1)
        call = re.match(r"([A-Za-z_]\w*)\(", span)
        if call:
            name = call.group(1)
            if not re.fullmatch(r"[a-z_][a-z0-9_]*|[A-Z][A-Z0-9_]+", name) or name in C_LIBRARY:
                continue     # a Python class (`Dense()`, `Method(...)`), math (`O(n)`)
            names = [name]
        elif re.fullmatch(r"posenc_\w+(?:\.\w+)*", span):
            names = span.split(".")
        elif re.fullmatch(r"[a-z][a-z0-9]*(?:_[a-z0-9]+)+", span):
            if not span.startswith(ENGINE_PREFIXES) and span in other_names():
                continue
            names = [span]
        else:
            continue
        for name in names:
            if name not in c_names():
                stale.append((match.start(), f"cites `{name}`, which csrc's code does not name"))
    return stale


def stale_citations(path: str) -> list:
    """['file:line: ...'] of every stale citation of a scanned file."""
    found = []
    for first_line, text in texts(path):
        stale = check_paths(text) + check_sections(path, text)
        if path.startswith("csrc/"):
            stale += check_c_comment_names(text)
        if path == "docs/internals.md":
            stale += check_internals_names(text)
        found += [(first_line + text.count("\n", 0, at), message) for at, message in stale]
    return [f"{path}:{line}: {message}" for line, message in sorted(set(found))]


@pytest.mark.parametrize("path", scanned_files())
def test_citations(path):
    stale = stale_citations(path)
    assert not stale, "stale citations:\n" + "\n".join(stale)


def test_the_scan_sees_the_citations():
    """The rules find what they are meant to: a known good and a known stale
    citation of each kind (a rule that matches nothing would pass vacuously)."""
    assert check_paths("see csrc/engine/runs.c and isa/avx2.c, csrc/isa/vectors_<x>.h") == []
    assert len(check_paths("see csrc/engine/gone.c, isa/gone.c, STYLE.md, gone_impl.h")) == 4
    assert check_sections("posenc/x.py", "SPEC §6, §7 and spec §3.13-3.15, SPEC 3.3") == []
    assert len(check_sections("posenc/x.py", "SPEC §9, §7.5; docs/low_precision.md §8")) == 3
    assert check_c_comment_names("posenc_validate() and forward_unit, q_i, sum_j(x)") == []
    assert len(check_c_comment_names("gone_function() and round_up(kc, 2), gone_name")) == 3
    assert check_internals_names("`fill_table` `posenc_validate()` `diagonal_map`") == []
    assert len(check_internals_names("`posenc_gone` `gone_one()` `unit_gone`")) == 3
