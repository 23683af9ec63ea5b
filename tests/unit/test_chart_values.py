"""The chart's values: values.yaml documents every value in the `helm create` style (a comment that starts
with the value's name), and `helm lint` / `helm template` pass with the defaults and with each file under
charts/tandem/ci/ (what chart-testing runs). Helm from the control-plane build's cache or PATH; skips
without."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.unit.test_chart_dashboard import _helm, _template

CHART = Path(__file__).resolve().parents[2] / "charts/tandem"
CI_VALUES = sorted((CHART / "ci").glob("*.yaml"))
KEY = re.compile(r"^(\s*)([A-Za-z][A-Za-z0-9_]*):")


def undocumented(values_yaml: str) -> list[str]:
    """Dotted names of keys in `values_yaml` whose comment block above does not start with that name.
    Keys inside a flow mapping ({...}) or under a map of user data are the value itself, not separate."""
    missing, stack, comment = [], [], []
    for line in values_yaml.splitlines():
        if line.strip().startswith("#"):
            comment.append(line.strip().lstrip("#").strip())
            continue
        m = KEY.match(line)
        if not m:
            comment = [] if not line.strip() else comment
            continue
        indent = len(m.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        name = ".".join([k for _, k in stack] + [m.group(2)])
        if not comment or not comment[0].startswith(name + " "):
            missing.append(name)
        stack.append((indent, m.group(2)))
        comment = []
    return missing


def test_every_value_is_documented_by_a_comment_naming_it():
    text = (CHART / "values.yaml").read_text()
    assert undocumented(text) == []
    assert undocumented("# a is one\na: 1\nb:\n  c: 2\n") == ["b", "b.c"]
    assert undocumented("# x.y wrong name\nx: 1\n") == ["x"]


def test_ci_values_are_valid_against_the_schema_keys():
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())

    def known(values: dict, base: dict, path: str = "") -> list[str]:
        out = []
        for k, v in values.items():
            if k not in base:
                out.append(path + k)
            elif isinstance(v, dict) and isinstance(base[k], dict) and base[k]:
                out.extend(known(v, base[k], f"{path}{k}."))
        return out

    assert CI_VALUES, "charts/tandem/ci/ holds the values files chart-testing installs"
    for f in CI_VALUES:
        assert known(yaml.safe_load(f.read_text()), defaults) == [], (
            f.name
        )  # no typo'd value silently ignored


@pytest.mark.parametrize("values", [None, *CI_VALUES], ids=lambda v: v.name if v else "defaults")
def test_helm_lint_and_template(values):
    helm = _helm()
    if helm is None:
        pytest.skip("no helm binary: TANDEM_BUILD_HELM=1 bash tests/k8s/build-controlplane.sh")
    extra = ["-f", str(values)] if values else []
    lint = subprocess.run(
        [helm, "lint", "--strict", str(CHART), *extra], capture_output=True, text=True, timeout=60
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr
    docs = _template(*extra)
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "ClusterRole", "ClusterRoleBinding"} <= kinds
    if values and values.name == "monitoring-values.yaml":
        assert {"PodMonitor", "PrometheusRule", "ConfigMap"} <= kinds
    if values and values.name == "namespaced-values.yaml":
        assert "ServiceAccount" not in kinds  # serviceAccount.create: false
        dep = next(d for d in docs if d["kind"] == "Deployment")
        assert dep["spec"]["template"]["spec"]["serviceAccountName"] == "tandem-operator"
