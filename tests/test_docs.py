"""Every ```python block of README.md and docs/*.md runs, so the docs cannot
drift from the code.

* The blocks of one page run in order in one namespace (a page builds on its
  earlier blocks), in a scratch directory of that page, with matplotlib's Agg
  backend.  Each block is its own test, ``test_block[docs/api.md:120]``; run
  alone, it first replays the page's earlier blocks.
* A block whose fence says ``python no-run`` is skipped (kept for what needs a
  GPU or a long run).  A block that needs torch -- it names ``torch``, or
  uses a name bound by such a block -- is skipped when torch is missing; a
  block from the first that names transformers on, when transformers is.
* A fence ``output`` right after a python block is what that block prints:
  the test compares it with the captured stdout (trailing spaces ignored).
* ``bash`` and other blocks are not executed; the ``python -m posenc``
  subcommands the docs quote are checked to accept their options, and
  relative links between the pages to point at existing files.
* ISA, thread count and ``posenc.torch.use_native`` are restored after every
  block, so a page that changes them leaves the rest of the suite alone.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import dataclasses
import importlib.util
import io
import os
import pathlib
import re
import sys

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")
if importlib.util.find_spec("matplotlib") is not None:
    import matplotlib

    matplotlib.use("Agg")

import posenc

ROOT = pathlib.Path(__file__).resolve().parent.parent
HAVE_TORCH = importlib.util.find_spec("torch") is not None
HAVE_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([^`]*)$")


def doc_files() -> list:
    """README.md, then docs/*.md in name order (performance.md once it exists)."""
    files = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
    return [f for f in files if f.exists()]


@dataclasses.dataclass
class Block:
    path: pathlib.Path
    line: int            # line of the opening fence, 1-based
    info: str            # the fence's info string: "python", "python no-run", "bash", ...
    code: str
    output: str | None = None    # the "output" block that follows, if any
    end: int = 0                 # line index just past the closing fence

    @property
    def language(self) -> str:
        return self.info.split()[0].lower() if self.info.split() else ""

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def fenced_blocks(path: pathlib.Path) -> list:
    """Every fenced block of a Markdown file, an ``output`` block attached to
    the python block right before it."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks, index = [], 0
    while index < len(lines):
        match = FENCE.match(lines[index])
        if not match:
            index += 1
            continue
        fence, info, start = match.group(1), match.group(2).strip(), index
        body = []
        index += 1
        while index < len(lines):
            closing = lines[index].strip()
            if closing.startswith(fence[0] * len(fence)) and not closing.strip(fence[0]):
                break
            body.append(lines[index])
            index += 1
        index += 1
        block = Block(path, start + 1, info, "\n".join(body) + "\n")
        previous = blocks[-1] if blocks else None
        between = lines[previous.end:start] if previous is not None else None
        if (block.language == "output" and previous is not None
                and previous.language == "python" and previous.output is None
                and not any(text.strip() for text in between)):
            previous.output = block.code
            continue
        block.end = index
        blocks.append(block)
    return blocks


def python_blocks(path: pathlib.Path) -> list:
    return [b for b in fenced_blocks(path) if b.language == "python"]


def _names(code: str) -> tuple:
    """(names the block binds, names it reads)."""
    tree = ast.parse(code)
    bound, read = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (bound if isinstance(node.ctx, (ast.Store, ast.Del)) else read).add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                bound.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
    return bound, read


def torch_blocks(blocks: list) -> set:
    """Indices of the blocks that need torch: they name it, or read a name
    that a torch block bound first (``import posenc.torch`` rebinds
    ``posenc``, which earlier blocks already had)."""
    needs, torch_names, plain_names = set(), set(), set()
    for index, block in enumerate(blocks):
        bound, read = _names(block.code)
        if re.search(r"\btorch\b", block.code) or read & torch_names:
            needs.add(index)
            torch_names |= bound - plain_names
        else:
            plain_names |= bound
    return needs


def skip_reason(blocks: list, index: int) -> str | None:
    block = blocks[index]
    if "no-run" in block.info.split():
        return f"{block.name}: marked no-run"
    if not HAVE_TORCH and index in torch_blocks(blocks):
        return f"{block.name}: needs torch, which is not installed"
    if not HAVE_TRANSFORMERS and any(re.search(r"\btransformers\b|posenc\.torch\.hf", b.code)
                                     for b in blocks[:index + 1]):
        return f"{block.name}: needs transformers (posenc[hf]), which is not installed"
    return None


# ------------------------------------------------------------------ running

@contextlib.contextmanager
def restored_settings():
    """ISA, threads and posenc.torch's backend as they were before the block."""
    isa, threads = posenc.get_isa(), posenc.get_num_threads()
    native = None
    if HAVE_TORCH and "posenc.torch" in sys.modules:
        import posenc.torch as pt
        native = pt.native_forced()
    try:
        yield
    finally:
        posenc.set_isa(isa)
        posenc.set_num_threads(threads)
        if native is not None:
            import posenc.torch as pt
            pt.use_native(native)
        if importlib.util.find_spec("matplotlib") is not None:
            import matplotlib.pyplot as plt
            plt.close("all")


def run_block(block: Block, namespace: dict, workdir: pathlib.Path) -> str:
    """Execute one block in `namespace` with `workdir` as the current directory;
    return what it printed."""
    code = compile(block.code, f"{block.name}", "exec")
    stdout = io.StringIO()
    cwd = os.getcwd()
    os.chdir(workdir)
    try:
        with restored_settings(), contextlib.redirect_stdout(stdout):
            exec(code, namespace)  # noqa: S102  (running the docs is the point)
    finally:
        os.chdir(cwd)
    return stdout.getvalue()


class Page:
    """One Markdown file's namespace and how many of its blocks have run."""

    def __init__(self, path: pathlib.Path, workdir: pathlib.Path):
        self.blocks = python_blocks(path)
        self.workdir = workdir
        self.namespace = {"__name__": "__docs__", "__builtins__": builtins}
        self.done = 0          # blocks 0 .. done-1 have run (or were skipped)
        self.broken = None     # name of the block that failed, if one did


_PAGES: dict = {}


def _page(path, tmp_path_factory) -> Page:
    page = _PAGES.get(path)
    if page is None:
        page = _PAGES[path] = Page(path, tmp_path_factory.mktemp(path.stem))
    return page


def _cases():
    for path in doc_files():
        for index, block in enumerate(python_blocks(path)):
            yield pytest.param(path, index, id=block.name)


def _compare_lines(text: str) -> list:
    return [line.rstrip() for line in text.strip("\n").splitlines()]


@pytest.mark.parametrize(("path", "index"), list(_cases()))
def test_block(path, index, tmp_path_factory):
    page = _page(path, tmp_path_factory)
    if page.done > index:           # selected again, or out of order: start the page over
        page = _PAGES[path] = Page(path, tmp_path_factory.mktemp(path.stem))
    while page.done < index:        # earlier blocks not run yet (this block was selected alone)
        if page.broken is None and skip_reason(page.blocks, page.done) is None:
            try:
                run_block(page.blocks[page.done], page.namespace, page.workdir)
            except BaseException:  # noqa: BLE001  (reported by that block's own test)
                page.broken = page.blocks[page.done].name
        page.done += 1
    page.done = index + 1
    reason = skip_reason(page.blocks, index)
    if reason:
        pytest.skip(reason)
    if page.broken is not None:
        pytest.fail(f"an earlier block of this page failed: {page.broken}", pytrace=False)
    block = page.blocks[index]
    try:
        printed = run_block(block, page.namespace, page.workdir)
    except BaseException:
        page.broken = block.name
        raise
    if block.output is not None:
        assert _compare_lines(printed) == _compare_lines(block.output), (
            f"{block.name} printed\n{printed}\nbut the page shows\n{block.output}")


# ------------------------------------------------------------------ the rest of the pages

def test_pages_have_python_blocks():
    """The parser finds the blocks (a broken fence would silently skip a page),
    and every ``output`` block is attached to a python block."""
    for name in ("index.md", "methods.md", "api.md", "torch.md", "validation.md"):
        path = ROOT / "docs" / name
        assert path.exists(), f"docs/{name} is missing"
        assert python_blocks(path), f"docs/{name} has no python block"
    for path in doc_files():
        stray = [b.name for b in fenced_blocks(path) if b.language == "output"]
        assert not stray, f"output blocks not right after a python block (unchecked): {stray}"


def test_validation_names_every_test_file():
    """docs/validation.md's table of the suite names every test file there is,
    and none that is not."""
    text = (ROOT / "docs" / "validation.md").read_text()
    named = set(re.findall(r"`(test_\w+\.py)`", text))
    files = {path.name for path in (ROOT / "tests").glob("test_*.py")}
    assert files - named == set(), f"not in docs/validation.md: {sorted(files - named)}"
    assert named - files == set(), f"docs/validation.md names no such file: {sorted(named - files)}"


def test_relative_links_point_at_files():
    """Links between the pages and into the repository resolve.  performance.md
    links to benchmark results that are generated and committed with it."""
    link = re.compile(r"\]\(([^)\s]+)\)")
    for path in doc_files():
        if path.name == "performance.md":
            continue
        text = path.read_text(encoding="utf-8")
        for target in link.findall(text):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            file_part = target.split("#", 1)[0]
            assert (path.parent / file_part).exists(), f"{path.name}: broken link {target}"


def _cli_commands() -> list:
    """`python -m posenc <sub> ...` lines of the pages' bash blocks, without
    comments, pipes and continuation lines."""
    commands = []
    for path in doc_files():
        for block in fenced_blocks(path):
            if block.language not in ("bash", "sh", "console"):
                continue
            for line in block.code.splitlines():
                line = line.split("#", 1)[0].split("|", 1)[0].strip()
                found = re.search(r"python -m posenc (\w+)(.*)$", line)
                if found and "&&" not in found.group(2) and "\\" not in found.group(2):
                    commands.append((path.name, found.group(1), found.group(2).split()))
    return commands


def test_cli_accepts_the_documented_options(tmp_path, monkeypatch, capsys):
    """Every `python -m posenc rank|plot ...` the docs quote parses and runs
    (at a small size: the sizes are overridden, the options kept)."""
    from posenc.__main__ import main

    monkeypatch.chdir(tmp_path)
    small = {"rank": ["--n", "16", "--d-model", "16", "--d-head", "4", "--d-p", "0,4,12"],
             "plot": ["--n", "8", "--heads", "2", "--d-head", "4"]}
    ran = 0
    for page, command, args in _cli_commands():
        if command not in small:
            continue
        args = [a for a in args if not a.startswith(("--n=", "--d-model=", "--d-head="))]
        for option in ("--n", "--d-model", "--d-head", "--d-p", "--heads"):
            if option in args:
                at = args.index(option)
                del args[at:at + 2]
        if command == "plot" and "--npz" in args:
            continue     # needs a file of the reader's
        args = [str(tmp_path / pathlib.Path(a).name) if a.endswith((".png", ".npz")) else a
                for a in args]
        assert main([command] + args + small[command]) == 0, f"{page}: {command} {args}"
        ran += 1
    capsys.readouterr()
    assert ran, "the docs quote no `python -m posenc rank|plot` command"
