"""The client package imports the standard library and itself, nothing else: it installs
alone and cannot reach a database (an AST walk, no processes)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

CLIENT = Path(__file__).resolve().parents[2] / "client"


def test_the_client_imports_only_the_standard_library_and_itself():
    outside = []
    for path in [*sorted((CLIENT / "retention_client").glob("*.py")), CLIENT / "build_backend.py"]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top != "retention_client":
                    outside.append(f"{path.name}: {name}")
    assert outside == []
