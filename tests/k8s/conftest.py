"""Session fixtures for the k8s suite: a real control plane on loopback, the CRDs, and the operator."""

from __future__ import annotations

import functools
import json
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import yaml

from tandem.testing.cluster import ControlPlane, find_binaries
from tandem.testing.operator_process import Operator

HERE = Path(__file__).resolve().parent
CHART = HERE.parents[1] / "charts/tandem"
PSS_ENFORCE = "pod-security.kubernetes.io/enforce"


def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.k8s)


@functools.cache
def _binaries() -> Path | RuntimeError:
    """The control plane's bin folder, built (or a running build waited for) once per session."""
    try:
        return find_binaries()
    except RuntimeError as e:
        return e


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """Before the first k8s test and outside its timeout: the binaries (on a fresh machine CI builds them in
    the background while the tests before tests/k8s run, and this waits for that build to finish)."""
    if HERE in Path(str(item.fspath)).resolve().parents:
        _binaries()
    yield


@pytest.fixture(scope="session")
def control_plane():
    bin_dir = _binaries()
    if isinstance(bin_dir, RuntimeError):
        pytest.skip(str(bin_dir))
    cp = ControlPlane(bin_dir)
    try:
        cp.start()
        cp.install_crds_and_rbac()
        yield cp
    finally:
        cp.stop()


@pytest.fixture(scope="session")
def operator(control_plane):
    op = Operator(control_plane).start().wait_leading()
    yield op
    op.stop()


@pytest.fixture(scope="session")
def helm(control_plane) -> str:
    """The helm binary built beside the control plane (skips without it)."""
    path = control_plane.bin / "helm"
    if not path.exists():
        pytest.skip("helm not built: TANDEM_BUILD_HELM=1 bash tests/k8s/build-controlplane.sh")
    return str(path)


def helm_template(helm: str, release: str, *args: str) -> list[dict]:
    """The chart's objects as `helm template` renders them with `args` (values, --namespace, --show-only)."""
    out = subprocess.run(
        [helm, "template", release, str(CHART), *args], check=True, capture_output=True, text=True, timeout=60
    )
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@pytest.fixture
def namespace(control_plane):
    name = f"t-{uuid.uuid4().hex[:8]}"
    control_plane.kubectl("create", "namespace", name)
    # every pod the operator renders must pass the restricted Pod Security Standard, or admission refuses it
    control_plane.kubectl("label", "namespace", name, f"{PSS_ENFORCE}=restricted")
    wait_for(
        lambda: (
            control_plane.kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode == 0
        ),
        60,
        "default service account",
    )
    yield name
    control_plane.kubectl("delete", "namespace", name, "--wait=false", check=False)


def wait_for(fn, timeout: float, what: str, interval: float = 0.3):
    """Poll fn until it returns something truthy; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = fn()
        except Exception as e:  # not there yet
            last = e
        if last and not isinstance(last, Exception):
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")


def get_json(cp: ControlPlane, *args: str, namespace: str | None = None) -> dict | None:
    ns = ["-n", namespace] if namespace else []
    out = cp.kubectl("get", *args, *ns, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """On a failed k8s test, attach the operator's log tail to the report."""
    outcome = yield
    report = outcome.get_result()
    op = item.funcargs.get("operator") if hasattr(item, "funcargs") else None
    if report.when == "call" and report.failed and op is not None:
        report.sections.append(("operator log (tail)", op.log()[-6000:]))
