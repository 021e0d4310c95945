"""The house structure: inside each runner/ package, module-level imports run one way (no cycle)."""
from __future__ import annotations

import ast
import graphlib
from pathlib import Path

RUNNER = Path(__file__).resolve().parents[1] / "runner"


def module_name(path: Path) -> str:
    """runner/engine/step.py -> runner.engine.step; a package's __init__.py -> the package."""
    parts = path.relative_to(RUNNER.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def top_level_imports(path: Path, name: str) -> set[str]:
    """The runner modules `path` imports at module level (a function's own import runs late: no cycle)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from . import x / from .x import y
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}
    return {m for m in found if m.startswith("runner")}


def import_graph() -> dict[str, set[str]]:
    """Each runner module -> the runner modules of the SAME package it imports at module level."""
    files = {module_name(p): p for p in RUNNER.rglob("*.py")}
    graph = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        graph[name] = {m for m in top_level_imports(path, name) if m in files and m != name
                       and m.rsplit(".", 1)[0] == package and files[m].name != "__init__.py"}
    return graph


def test_no_import_cycle_inside_a_runner_package():
    graph = import_graph()
    assert "runner.engine.build" in graph and "runner.engine.step" in graph["runner.engine.build"]
    try:
        order = list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as e:
        raise AssertionError(f"import cycle: {' -> '.join(e.args[1])}") from None
    assert len(order) == len(graph)

