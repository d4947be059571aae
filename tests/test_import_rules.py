"""Imports go one way (docs/engine.md, "Layers and imports").

An AST walk over the packages' own ``.py`` files (no Django, no database):

- ``signatures`` (signed decisions) imports none of the product's packages: ``core`` and
  every layer above sign and verify through it;
- ``core`` imports no app (``database``, ``targets``, ``retention``, ``runs``, ``demo``);
- ``database`` imports only ``core``; ``targets`` only ``core`` and ``database``;
- ``retention`` imports neither ``archive``, ``runs`` nor ``demo``; ``archive`` imports
  neither ``runs`` nor ``demo``; ``runs`` does not import ``demo``;
- no app imports ``api`` (the HTTP API, an entry point); ``api`` does not import ``demo``;
- no import cycle between modules of the packages (function-level imports count);
- an import inside a function has a comment on its line or the line above saying why
  (Django's app registry at start-up, a heavy optional dependency), never to dodge a cycle.

Migrations are checked for the layer rules only: their data functions must import inside
the function, from the historical app registry.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = (
    "signatures",
    "core",
    "database",
    "targets",
    "retention",
    "archive",
    "runs",
    "demo",
    "config",
    "api",
)
# package -> the packages it must not import
FORBIDDEN = {
    "signatures": {"core", "database", "targets", "retention", "archive", "runs", "demo", "api"},
    "core": {"database", "targets", "retention", "archive", "runs", "demo", "api"},
    "database": {"targets", "retention", "archive", "runs", "demo", "api"},
    "targets": {"retention", "archive", "runs", "demo", "api"},
    "retention": {"archive", "runs", "demo", "api"},
    "archive": {"runs", "demo", "api"},
    "runs": {"demo", "api"},
    "api": {"demo"},  # the HTTP API is an entry point, like config/urls.py
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found[_module_name(path)] = path
    return found


MODULES = _modules()


def _resolve(target: str) -> str | None:
    """The module of ours that importing ``target`` executes, or None if it is not ours."""
    while target:
        if target in MODULES:
            return target
        target = target.rpartition(".")[0]
    return None


class Import:
    def __init__(self, path: Path, node: ast.AST, target: str, in_function: bool, lines):
        self.path, self.line, self.target, self.in_function = path, node.lineno, target, in_function
        self._lines = lines

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def commented(self) -> bool:
        """A comment on the import's line, or just above it or above its block of imports."""
        if "#" in self._lines[self.line - 1]:
            return True
        above = self.line - 2
        while above >= 0 and self._lines[above].strip().startswith(("from ", "import ")):
            above -= 1
        return above >= 0 and self._lines[above].strip().startswith("#")


def _imports(module: str, path: Path) -> list[Import]:
    source = path.read_text()
    lines = source.splitlines()
    tree = ast.parse(source, filename=str(path))
    found: list[Import] = []
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                for alias in child.names:
                    found.append(Import(path, child, alias.name, in_function, lines))
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - (child.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                for alias in child.names:
                    # ``from core import locks`` imports the module core.locks
                    sub = f"{base}.{alias.name}"
                    found.append(
                        Import(path, child, sub if sub in MODULES else base, in_function, lines)
                    )
            else:
                visit(
                    child,
                    in_function
                    or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda),
                )

    visit(tree, False)
    return found


IMPORTS = {module: _imports(module, path) for module, path in MODULES.items()}


def _is_migration(module: str) -> bool:
    return ".migrations." in f"{module}."


def test_layers_import_only_downwards():
    broken = []
    for module, imports in IMPORTS.items():
        forbidden = FORBIDDEN.get(module.split(".")[0], set())
        for imp in imports:
            if imp.target.split(".")[0] in forbidden:
                broken.append(
                    f"{imp.where}: {module.split('.')[0]} imports {imp.target}"
                    f" ({module.split('.')[0]} must not import {', '.join(sorted(forbidden))})"
                )
    assert not broken, "imports against the layers:\n" + "\n".join(dict.fromkeys(broken))


def test_function_level_imports_say_why():
    silent = [
        f"{imp.where}: function-level import of {imp.target} without a comment saying why"
        " (move it to the top of the module; if that makes a cycle, move the shared piece"
        " down a layer)"
        for module, imports in IMPORTS.items()
        if not _is_migration(module)
        for imp in imports
        if imp.in_function and not imp.commented
    ]
    assert not silent, "\n".join(dict.fromkeys(silent))


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return components


def test_no_import_cycles():
    graph: dict[str, set[str]] = {}
    edges: dict[tuple[str, str], Import] = {}
    for module, imports in IMPORTS.items():
        if _is_migration(module):
            continue
        for imp in imports:
            target = _resolve(imp.target)
            if target and target != module and not _is_migration(target):
                graph.setdefault(module, set()).add(target)
                edges.setdefault((module, target), imp)
    report = []
    for component in _cycles(graph):
        members = set(component)
        report.append("cycle between " + ", ".join(component) + ":")
        report += [
            f"  {imp.where}: {a} imports {b}"
            for (a, b), imp in sorted(edges.items(), key=lambda e: e[1].where)
            if a in members and b in members
        ]
    assert not report, "\n".join(report)


def test_the_walk_sees_the_packages():
    # guards the test itself: an empty walk would pass every rule above
    assert {"core.models", "retention.models", "runs.models", "runs.engine.worker"} <= set(MODULES)
    assert any(imp.target == "retention.models" for imp in IMPORTS["runs.models"])
