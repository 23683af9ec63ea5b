"""The modules of tandem/, worker/ and operator/ import each other without a circle, and the shared ground
floor (the spec types, names, the SLO) imports nothing from either wing.

Every `import` and `from ... import` that runs counts, at the top of a module or inside a function (a
deferred import still ties the two modules together); one under `if TYPE_CHECKING:` never runs and does not
count, nor do the parent packages an import runs implicitly."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {"tandem": "tandem", "operator": "tandem.operator", "worker": "tandem.worker"}
GROUND_FLOOR = ("tandem.spec", "tandem.spec_*", "tandem.names", "tandem.slo")


def _modules() -> dict[str, Path]:
    found = {}
    for folder, package in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package, *parts))] = path
    return found


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The module of ours that a dotted name lands in (`pkg.mod.attr` -> `pkg.mod`), if any."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _type_checking_only(tree: ast.Module) -> set[ast.AST]:
    """The statements inside `if TYPE_CHECKING:` blocks (annotations only; they never run)."""
    guarded = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            guarded.update(n for stmt in node.body for n in ast.walk(stmt))
    return guarded


def _imports(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    skip = _type_checking_only(tree)
    out = set()
    for node in ast.walk(tree):
        if node in skip:
            continue
        if isinstance(node, ast.Import):
            named = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            # `from pkg import mod` imports the submodule; `from mod import name` the module itself
            named = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        out.update(m for m in map(lambda n: _resolve(n, modules), named) if m and m != module)
    return out


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {m: _imports(m, p, modules) for m, p in modules.items()}


def test_the_graph_sees_function_level_and_relative_imports():
    graph = import_graph()
    assert (
        "tandem.operator.autoscale.backends.local.loop" in graph["tandem.operator.local.cli"]
    )  # inside a function
    assert "tandem.operator.runtime.kube" in graph["tandem.operator.handlers"]
    assert (
        "tandem.worker.engine.runner.engine" not in graph["tandem.worker.engine.speculative.draft_model"]
    )  # types only


def test_no_module_imports_itself_through_others():
    try:
        graphlib.TopologicalSorter(import_graph()).prepare()
    except graphlib.CycleError as e:
        raise AssertionError("import circle: " + " -> ".join(reversed(e.args[1]))) from None


def test_the_ground_floor_imports_neither_wing():
    """What every part shares (spec types, names, the SLO) stands on its own, directly and through others."""
    import fnmatch

    graph = import_graph()
    floor = [m for m in graph if any(fnmatch.fnmatch(m, pattern) for pattern in GROUND_FLOOR)]
    assert "tandem.spec" in floor and "tandem.names" in floor
    for module in floor:
        reached, todo = set(), [module]
        while todo:
            for m in graph[todo.pop()] - reached:
                reached.add(m)
                todo.append(m)
        wings = sorted(m for m in reached if m.startswith(("tandem.operator", "tandem.worker")))
        assert not wings, f"{module} reaches {wings}"
