"""The wings' import boundaries hold: the router and the load generator never load torch, and neither
wing imports the other."""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _modules(package: str, folder: Path) -> list[str]:
    return [f"{package}.{m.name}" for m in pkgutil.iter_modules([str(folder)])]


TORCH_FREE = (
    _modules("tandem.worker.router", ROOT / "worker" / "router")
    + _modules("tandem.loadgen", ROOT / "tandem" / "loadgen")
    + _modules("tandem.worker.api", ROOT / "worker" / "api")
    + _modules("tandem.worker.hf", ROOT / "worker" / "hf")
    # the router's handshake reads the KV transport registry
    + ["tandem.worker.kv_transport.handshake", "tandem.worker.kv_transport.transports"]
    + _modules("tandem.worker.kv_transport.transports", ROOT / "worker" / "kv_transport" / "transports")
)


@pytest.mark.parametrize("module", TORCH_FREE)
def test_module_never_imports_torch(module):
    code = f"import sys, importlib; importlib.import_module({module!r}); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False", f"{module} pulls in torch"


def _imports(folder: Path) -> set[tuple[str, str]]:
    found = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                found.add((str(path.relative_to(ROOT)), node.module))
            elif isinstance(node, ast.Import):
                found.update((str(path.relative_to(ROOT)), a.name) for a in node.names)
    return found


def test_wings_do_not_import_each_other():
    worker_to_operator = {
        (f, m)
        for f, m in _imports(ROOT / "worker")
        if m.startswith(("tandem.operator", "kopf", "kubernetes"))
    }
    operator_to_worker = {(f, m) for f, m in _imports(ROOT / "operator") if m.startswith("tandem.worker")}
    assert not worker_to_operator, worker_to_operator
    assert not operator_to_worker, operator_to_worker


def test_every_package_folder_is_declared_at_any_depth():
    """A folder missing from pyproject's list is left out of a wheel (an image's `pip install .`) though an
    editable install still finds it."""
    import tomllib

    declared = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {
        ".".join(("tandem", wing, *p.parent.relative_to(ROOT / wing).parts))
        for wing in ("worker", "operator")
        for p in (ROOT / wing).rglob("*/__init__.py")
    } | {
        ".".join(("tandem", *p.parent.relative_to(ROOT / "tandem").parts))
        for p in (ROOT / "tandem").rglob("*/__init__.py")
    }
    assert folders - {"tandem.testing"} <= declared, folders - declared


def test_the_test_harnesses_stay_out_of_the_wheel():
    """`tandem.testing` runs from a checkout (tests/ and bench/ share it); a wheel carries none of it."""
    import tomllib

    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "tandem.testing" not in setuptools["packages"]
    assert "testing/*" in setuptools["exclude-package-data"]["tandem"]


def test_benchmarks_do_not_import_the_tests():
    """Shared harnesses live in `tandem.testing`; a benchmark that imports `tests` breaks when tests move."""
    into_tests = {(f, m) for f, m in _imports(ROOT / "bench") if m == "tests" or m.startswith("tests.")}
    assert not into_tests, into_tests


def test_the_engine_does_not_import_the_transports():
    """What both need of a KV block is in worker/kv/layout.py; the engine knows nothing of how KV travels."""
    into_transport = {
        (f, m) for f, m in _imports(ROOT / "worker" / "engine") if m.startswith("tandem.worker.kv_transport")
    }
    assert not into_transport, into_transport
