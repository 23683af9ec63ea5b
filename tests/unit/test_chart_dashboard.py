"""The chart's Grafana dashboard only queries metrics tandem exports, and the monitoring templates render.

Pure: reads the dashboard JSON and tandem/names.py. The render check runs `helm template` when a helm
binary is found (the control-plane build's cache, TANDEM_CONTROLPLANE_BIN, or PATH) and skips otherwise."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tandem import names

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts/tandem"
DASHBOARD = CHART / "dashboards/tandem.json"
METRIC = re.compile(r"\btandem_[a-z0-9_]+")
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def _exported() -> set[str]:
    return {
        v for k, v in vars(names).items() if k.isupper() and isinstance(v, str) and v.startswith("tandem_")
    }


def _known(metric: str, exported: set[str]) -> bool:
    """A series name prometheus-client can expose for one of tandem's metric names: the name itself (gauges,
    counters already ending in _total), name + _total (counters without it), name + _bucket/_sum/_count
    (histograms)."""
    if metric in exported:
        return True
    for suffix in (*HISTOGRAM_SUFFIXES, "_total"):
        if metric.endswith(suffix) and metric.removesuffix(suffix) in exported:
            return True
    return False


def _panels(dash: dict) -> list[dict]:
    out = []
    for p in dash["panels"]:
        out.extend(p.get("panels", []) if p.get("type") == "row" else [p])
    return out


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def test_dashboard_variables(dashboard):
    assert 36 <= dashboard["schemaVersion"] <= 41
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert list(variables) == ["datasource", "namespace", "service", "pool"]
    assert (
        variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    )

    def query(name: str) -> str:
        q = variables[name]["query"]
        return q["query"] if isinstance(q, dict) else q

    assert query("namespace") == f"label_values({names.REQUESTS_TOTAL}, namespace)"
    # each variable narrows the next: InferenceServices of the chosen namespaces, pools of the chosen services
    assert query("service") == f'label_values({names.REQUESTS_TOTAL}{{namespace=~"$namespace"}}, service)'
    assert (
        query("pool")
        == f'label_values({names.KV_BLOCKS_TOTAL}{{namespace=~"$namespace", service=~"$service"}}, pool)'
    )


def test_every_panel_has_a_title_and_a_target(dashboard):
    panels = _panels(dashboard)
    assert len(panels) >= 11
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for p in panels:
        assert p.get("title"), p
        assert p.get("targets") and all(t.get("expr") for t in p["targets"]), p["title"]


def test_every_queried_metric_exists_in_names(dashboard):
    exported = _exported()
    used: set[str] = set()
    exprs = [(p["title"], t["expr"]) for p in _panels(dashboard) for t in p["targets"]]
    exprs += [(a["name"], a["expr"]) for a in dashboard["annotations"]["list"]]
    for title, expr in exprs:
        assert "$namespace" in expr and "$service" in expr, (title, expr)
        found = METRIC.findall(expr)
        assert found or expr.startswith("sum by (namespace, service, pool) (up{"), (
            title,
            expr,
        )  # or scrape health
        used.update(found)
    unknown = sorted(m for m in used if not _known(m, exported))
    assert not unknown, f"dashboard queries metrics not in tandem/names.py: {unknown}"
    # the panels the dashboard promises: every router, prefill and decode family but ITL/E2E
    covered = {m.removesuffix(s) for m in used for s in HISTOGRAM_SUFFIXES if m.endswith(s)} | used
    missing = exported - covered - {names.ITL_SECONDS, names.E2E_SECONDS}
    assert not missing, f"no panel for {sorted(missing)}"


def test_quantiles_read_buckets_by_le(dashboard):
    for p in _panels(dashboard):
        for t in p["targets"]:
            expr = t["expr"]
            if "histogram_quantile" in expr:
                assert re.search(r"by \(le[,)]", expr) and re.search(r"rate\(tandem_\w+_bucket\{", expr), expr
            else:
                assert "_bucket" not in expr, expr


def test_known_metric_rules():
    exported = _exported()
    assert _known("tandem_ttft_seconds_bucket", exported)
    assert _known("tandem_requests_total", exported)
    assert not _known("tandem_ttft_bucket", exported)
    assert not _known("tandem_no_such_metric", exported)


def _helm() -> str | None:
    if os.environ.get("TANDEM_CONTROLPLANE_BIN"):
        path = Path(os.environ["TANDEM_CONTROLPLANE_BIN"]) / "helm"
        if path.exists():
            return str(path)
    cache = Path(os.environ.get("TANDEM_CACHE") or Path.home() / ".cache/tandem")
    cached = sorted(cache.glob("controlplane/*/bin/helm"))
    return str(cached[-1]) if cached else shutil.which("helm")


def _template(*args: str) -> list[dict]:
    helm = _helm()
    if helm is None:
        pytest.skip("no helm binary: TANDEM_BUILD_HELM=1 bash tests/k8s/build-controlplane.sh")
    out = subprocess.run(
        [helm, "template", "t", str(CHART), "--namespace", "tandem-system", *args],
        check=True,
        capture_output=True,
        text=True,
    )
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def test_helm_renders_podmonitor_and_dashboard():
    docs = _template("--set", "monitoring.podMonitor.enabled=true", "--set", "watchNamespaces={a,b}")
    pm = next(d for d in docs if d["kind"] == "PodMonitor")
    assert pm["apiVersion"] == "monitoring.coreos.com/v1"
    assert pm["spec"]["selector"]["matchExpressions"] == [{"key": names.LABEL_POOL, "operator": "Exists"}]
    assert pm["spec"]["namespaceSelector"] == {"matchNames": ["a", "b"]}
    (ep,) = pm["spec"]["podMetricsEndpoints"]
    assert ep["port"] == "metrics" and ep["path"] == "/metrics"
    targets = {r["targetLabel"]: r["sourceLabels"] for r in ep["relabelings"]}
    for label, key in (("service", names.LABEL_SERVICE), ("pool", names.LABEL_POOL)):
        assert label in names.METRIC_LABELS
        assert targets[label] == ["__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)]
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["tandem.json"]) == json.loads(DASHBOARD.read_text())


def test_operator_pod_exports_the_autoscalers_metrics_to_its_own_podmonitor():
    docs = _template(
        "--set", "monitoring.podMonitor.enabled=true", "--set", "autoscaler.prometheusUrl=http://p:9090"
    )
    (dep,) = [d for d in docs if d["kind"] == "Deployment"]
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert f"--metrics-port={ports['metrics']}" in container["args"]
    assert "--prometheus-url=http://p:9090" in container["args"]
    (own,) = [d for d in docs if d["kind"] == "PodMonitor" and d["metadata"]["name"].endswith("-operator")]
    assert (
        own["spec"]["selector"]["matchLabels"].items()
        <= dep["spec"]["template"]["metadata"]["labels"].items()
    )
    assert own["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    off = _template("--set", "monitoring.podMonitor.enabled=true", "--set", "autoscaler.metricsPort=0")
    (container,) = next(d for d in off if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"]
    assert not any(a.startswith(("--metrics-port", "--prometheus-url")) for a in container["args"])
    assert [d["metadata"]["name"] for d in off if d["kind"] == "PodMonitor"] == ["t-tandem"]


def test_helm_defaults_skip_podmonitor_keep_dashboard():
    docs = _template()
    kinds = [d["kind"] for d in docs]
    assert "PodMonitor" not in kinds and "ConfigMap" in kinds
    pm = _template("--set", "monitoring.podMonitor.enabled=true")
    assert next(d for d in pm if d["kind"] == "PodMonitor")["spec"]["namespaceSelector"] == {"any": True}
    off = _template("--set", "monitoring.dashboards.enabled=false")
    assert "ConfigMap" not in [d["kind"] for d in off]
