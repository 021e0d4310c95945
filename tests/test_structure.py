"""The house structure: inside each runner/ package, module-level imports run one way (no cycle); across runner/,
no layer imports a higher one; importing a runner module has no side effect on the process."""
from __future__ import annotations

import ast
import graphlib
import json
import subprocess
import sys
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



# The layers of runner/, lowest first (docs/ARCHITECTURE.md): a module imports only its own layer and those below,
# at module level or inside a function (an import under `if TYPE_CHECKING:` is a type's name only, not counted).
LAYERS = [
    ["runner", "runner.errors", "runner.compat", "runner.fsutil", "runner.process"],
    ["runner.config", "runner.optim"],
    ["runner.rundir"],
    ["runner.distributed", "runner.checkpoint", "runner.model", "runner.fsdp", "runner.distill", "runner.profiler",
     "runner.sinks", "runner.weights"],
    ["runner.data", "runner.preflight"],
    ["runner.engine"],
    ["runner.bench", "runner.sweep", "runner.export"],
]


def layer_of(module: str) -> int:
    """The layer of a runner module: that of its longest listed prefix."""
    best, found = "", None
    for i, units in enumerate(LAYERS):
        for unit in units:
            if (module == unit or module.startswith(unit + ".")) and len(unit) > len(best):
                best, found = unit, i
    assert found is not None, f"{module} is in no layer of tests/test_structure.py's LAYERS"
    return found


def every_import(path: Path, name: str) -> set[str]:
    """The runner modules `path` imports anywhere (functions too), except under `if TYPE_CHECKING:`."""
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for node in ast.walk(tree)
                   if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test) for n in ast.walk(node)}
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            found.add(base)
    return {m for m in found if m == "runner" or m.startswith("runner.")}


def test_no_layer_imports_a_higher_one():
    files = {module_name(p): p for p in RUNNER.rglob("*.py")}
    wrong = sorted(f"{name} (layer {layer_of(name)}) imports {m} (layer {layer_of(m)})"
                   for name, path in files.items() for m in every_import(path, name)
                   if layer_of(m) > layer_of(name))
    assert not wrong, "\n".join(wrong)


def test_the_layer_check_sees_a_wrong_import(tmp_path):
    """The check itself: config importing the engine is caught."""
    bad = tmp_path / "runner" / "config" / "bad.py"
    bad.parent.mkdir(parents=True)
    bad.write_text("def f():\n    from runner.engine import train\n")
    assert every_import(bad, "runner.config.bad") == {"runner.engine"}
    assert layer_of("runner.engine") > layer_of("runner.config.bad")


def third_party_imports() -> list[str]:
    """Every module outside runner/ that a runner module imports (anywhere), by its dotted name."""
    found = set()
    for path in RUNNER.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
            found |= {n for n in names if n.split(".")[0] not in ("runner", "__future__")}
    return sorted(found)


# what the libraries themselves do at their import (torch's inductor sets its cache folder, six adds its importer)
# happens first; what is left after importing every runner module is the runner's own doing
SIDE_EFFECT_PROBE = """
import importlib, json, os, sys
for name in sys.argv[2].split():
    try:
        importlib.import_module(name)
    except Exception:
        pass
import torch
env, hooks, n = dict(os.environ), list(sys.meta_path), torch.get_num_threads()
for name in sys.argv[1].split():
    importlib.import_module(name)
print(json.dumps({"env": sorted(set(os.environ.items()) ^ set(env.items())),
                  "hooks": [type(h).__name__ for h in sys.meta_path if h not in hooks],
                  "threads": torch.get_num_threads() == n}))
"""


def test_importing_every_runner_module_changes_nothing_in_the_process():
    """No side effect at import: the environment, the import hooks and torch's thread count stay as they were
    (runner.process.startup.prepare() is the entry points' to call)."""
    from runner.data.workerstart import SERVER_ONLY  # imported inside the loader workers' fork server only

    names = sorted(module_name(p) for p in RUNNER.rglob("*.py")
                   if "__main__" not in p.name and module_name(p) not in SERVER_ONLY)
    out = subprocess.run([sys.executable, "-c", SIDE_EFFECT_PROBE, " ".join(names), " ".join(third_party_imports())],
                         capture_output=True, text=True, timeout=300, cwd=RUNNER.parent)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.splitlines()[-1]) == {"env": [], "hooks": [], "threads": True}
