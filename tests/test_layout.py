"""The package's shape: no import cycle among posenc's modules (an import of a
module's own parent package, which Python performs first anyway, is not an
edge), and no benchmark code inside the package."""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "posenc"

pytestmark = pytest.mark.skipif(not PACKAGE.is_dir(), reason="needs the source tree")


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: pathlib.Path, name: str, modules: set) -> set:
    """posenc modules `path` imports (anywhere in the file), by absolute name."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            base = (base + "." + node.module if node.module else base) if node.level else node.module
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        found |= {t for t in targets if t in modules}
    parents = {name.rsplit(".", k)[0] for k in range(1, name.count(".") + 1)}
    return found - parents - {name}


def test_no_import_cycle():
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {name: _imports(path, name, set(paths)) for name, path in paths.items()}
    state = {}

    def visit(name, stack):
        state[name] = "open"
        for target in sorted(graph[name]):
            if state.get(target) == "open":
                cycle = stack[stack.index(target):] + [target]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target, stack + [target])
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


def test_no_benchmark_in_the_package():
    assert not [p.name for p in PACKAGE.rglob("*bench*.py") if p.name != "__main__.py"]
