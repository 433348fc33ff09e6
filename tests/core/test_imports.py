"""The shape of oasr-core's imports: no module cycle, and an engine that names no decode head."""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

import oasr

CORE = Path(oasr.__file__).resolve().parent


def _modules(root: Path) -> dict[str, Path]:
    out = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


class _Imports(ast.NodeVisitor):
    """Every module an import statement names, anywhere in the file (function-local imports too),
    except under ``if TYPE_CHECKING:``, which never runs."""

    def __init__(self, name: str, is_package: bool, known: set[str]):
        self.package = name if is_package else name.rpartition(".")[0]
        self.known = known
        self.found: set[str] = set()

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
                isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"):
            for child in node.orelse:
                self.visit(child)
            return
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        self.found.update(a.name for a in node.names if a.name in self.known)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = self.package.split(".")[: len(self.package.split(".")) - node.level + 1]
            module = ".".join(base + ([node.module] if node.module else []))
        else:
            module = node.module or ""
        for alias in node.names:
            if f"{module}.{alias.name}" in self.known:
                self.found.add(f"{module}.{alias.name}")
            elif module in self.known:
                self.found.add(module)


def _packages(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the modules importing it runs: each one it names, and the ``__init__`` of every
    package above those (Python runs them first) except its own packages, already running."""
    modules = _modules(root)
    graph = {}
    for name, path in modules.items():
        visitor = _Imports(name, path.name == "__init__.py", set(modules))
        visitor.visit(ast.parse(path.read_text(), str(path)))
        own = set(_packages(name))
        found = set(visitor.found)
        for target in visitor.found:
            found.update(p for p in _packages(target) if p in modules and p not in own)
        graph[name] = found - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_walker_finds_a_cycle_through_a_function_local_import(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.b import thing\n")
    (pkg / "b.py").write_text(textwrap.dedent("""
        from typing import TYPE_CHECKING
        if TYPE_CHECKING:
            from pkg import c
        def thing():
            from . import a
    """))
    (pkg / "c.py").write_text("import pkg.b\n")
    assert cycles(import_graph(pkg)) == [["pkg.a", "pkg.b"]]


def test_the_walker_counts_the_package_init_an_import_runs(tmp_path):
    for sub in ("pkg", "pkg/one", "pkg/two"):
        (tmp_path / sub).mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "one" / "__init__.py").write_text("from pkg.one.reg import thing\n")
    (tmp_path / "pkg" / "one" / "reg.py").write_text("from pkg.two.conv import Conv\n")
    (tmp_path / "pkg" / "one" / "base.py").write_text("")
    (tmp_path / "pkg" / "two" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "two" / "conv.py").write_text("from pkg.one.base import Base\n")
    assert cycles(import_graph(tmp_path / "pkg")) == [["pkg.one", "pkg.one.reg", "pkg.two.conv"]]


def test_oasr_core_has_no_import_cycle():
    graph = import_graph(CORE)
    assert len(graph) > 50 and "oasr.engine.streaming" in graph["oasr.engine.engine"]
    assert cycles(graph) == []


def test_the_engine_names_no_decode_head():
    """The engine package drives strategies and streaming backends only through their contracts:
    no CTC member (or any other head) is named in it."""
    offenders = []
    for path in sorted((CORE / "engine").rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"ctc|log_probs|joiner|predictor", line, re.IGNORECASE):
                offenders.append(f"{path.relative_to(CORE)}:{number}: {line.strip()}")
    assert offenders == []
