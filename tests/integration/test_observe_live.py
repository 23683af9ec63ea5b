"""Observability against a live local stack under load, scraped by a real Prometheus: every panel of the
chart's Grafana dashboard returns data (each query through the HTTP API with the template variables filled
in the way Grafana fills them; a query with no data fails naming its panel), the alert rules evaluate on
the live series, the vLLM-named series agree with tandem's own, and `tandem top` run headless shows the
stack."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
import yaml

from tandem import names
from tests.integration.stacks import metrics_targets, running_stack, spec
from tests.prometheus import running_prometheus

pytestmark = pytest.mark.slow

CHART = Path(__file__).resolve().parents[2] / "charts/tandem"
DASHBOARD = CHART / "dashboards/tandem.json"
RULES = CHART / "files/prometheus-rules.yaml"
NAMESPACE, SERVICE = "team-a", "dash"
# Series only another component exports, so no data here is expected (each still has to parse).
NOT_IN_A_LOCAL_STACK = {
    names.AUTOSCALER_DESIRED_REPLICAS: "the autoscaler loop runs only with autoscaling on",
    names.AUTOSCALER_DECISIONS_TOTAL: "the autoscaler loop runs only with autoscaling on",
}


def grafana_vars(expr: str, rate_interval: str = "1m", dashboard_range: str = "5m") -> str:
    """The query Grafana sends for `expr` with this namespace and service chosen and every pool."""
    values = {
        "$__rate_interval": rate_interval,
        "$__range": dashboard_range,
        "$namespace": NAMESPACE,
        "$service": SERVICE,
        "$pool": ".*",
    }
    for var, value in values.items():
        expr = expr.replace(var, value)
    assert "$" not in expr, expr
    return expr


def _panels(dash: dict) -> list[dict]:
    out = []
    for p in dash["panels"]:
        out.extend(p.get("panels", []) if p.get("type") == "row" else [p])
    return [p for p in out if p.get("type") != "row"]


class Load:
    """Streams completions (sharing a long prefix, so the prefix cache hits) and a few bad requests at the
    router until stopped."""

    def __init__(self, url: str):
        self.url, self.stop, self.sent, self.errors = url, threading.Event(), 0, []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        prefix = "The quick brown fox jumps over the lazy dog. " * 6
        with httpx.Client(base_url=self.url, timeout=60) as client:
            while not self.stop.is_set():
                i = self.sent
                model = "tiny" if i % 5 else "no-such-model"  # every fifth a 404: the errors panel has data
                body = {
                    "model": model,
                    "prompt": f"{prefix} request {i}",
                    "max_tokens": 8,
                    "stream": True,
                    "ignore_eos": True,
                    "temperature": 0,
                }
                if i % 10 == 1:  # the tiny model's long greedy answer to the bare prefix repeats one token:
                    body.update(prompt=prefix, max_tokens=48)  # speculation finds drafts there to verify
                try:
                    with client.stream("POST", "/v1/completions", json=body) as resp:
                        resp.read()
                except httpx.HTTPError as e:
                    self.errors.append(repr(e))
                self.sent += 1

    def __enter__(self) -> Load:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(timeout=60)


@pytest.fixture(scope="module")
def observed(tiny_model_dir, tmp_path_factory):
    """A disaggregated stack under load, scraped every second by a real Prometheus."""
    obj = _spec(tiny_model_dir)
    with running_stack(obj, tmp_path_factory.mktemp("stack")) as (stack, url):
        targets = metrics_targets(stack, SERVICE, NAMESPACE)
        with (
            running_prometheus(targets, tmp_path_factory.mktemp("prometheus"), rule_files=[RULES]) as prom,
            Load(url) as load,
        ):
            prom.wait_targets_up(timeout_s=60)
            # enough completed requests and scrapes that every rate has two samples with traffic between
            prom.wait_for(f'sum(tandem_slo_requests_total{{service="{SERVICE}"}}) >= 8', timeout_s=180)
            prom.wait_for(
                f'sum(increase(tandem_requests_total{{service="{SERVICE}", status="404"}}[1m])) > 0',
                timeout_s=60,
            )
            # each worker scraped at least twice since its first prompt (the router's counters can run ahead)
            prom.wait_for(
                f'sum(rate(tandem_prefill_tokens_total{{service="{SERVICE}"}}[1m])) > 0', timeout_s=60
            )
            # and the decode workers' speculation has verified drafts between two scrapes (its panel's ratios)
            prom.wait_for(
                f'sum(rate({names.SPEC_VERIFY_STEPS_TOTAL}{{service="{SERVICE}"}}[1m])) > 0', timeout_s=60
            )
            yield prom, load
            assert not load.errors, load.errors[:3]


def test_every_panel_returns_data(observed):
    prom, _ = observed
    dash = json.loads(DASHBOARD.read_text())
    empty = []
    for panel in _panels(dash):
        got_any, absent_here = False, 0
        for target in panel["targets"]:
            expr = grafana_vars(target["expr"])
            result = prom.query(expr)
            values = [float(r["value"][1]) for r in result]
            finite = [v for v in values if math.isfinite(v)]
            if finite:
                got_any = True
                for r in result:
                    assert r["metric"].get("service", SERVICE) == SERVICE, (panel["title"], r)
                continue
            metrics = set(re.findall(r"\btandem_[a-z0-9_]+", expr))
            if metrics and metrics <= set(NOT_IN_A_LOCAL_STACK):
                prom.query(expr)  # it still has to parse and evaluate
                absent_here += 1
                continue
            empty.append(f"{panel['title']!r} [{target['refId']}] {expr} -> {values}")
        assert got_any or absent_here == len(panel["targets"]), panel["title"]
    assert not empty, "panels without data:\n" + "\n".join(empty)


def test_panel_values_are_what_the_stack_did(observed):
    prom, _ = observed
    up = {
        r["metric"]["pool"]: float(r["value"][1])
        for r in prom.query(
            grafana_vars(
                'sum by (namespace, service, pool) (up{namespace=~"$namespace", service=~"$service", '
                'pool!="router"})'
            )
        )
    }
    assert up == {"prefill": 1.0, "decode": 1.0}
    (target,) = prom.query(
        grafana_vars(
            'max by (namespace, service) (tandem_slo_target_seconds{namespace=~"$namespace", '
            'service=~"$service", slo="ttft"})'
        )
    )
    assert float(target["value"][1]) == 2.0  # spec.slo.ttftMs reaches the router's SLO line
    hits = prom.query(
        grafana_vars(
            'sum by (pool) (tandem_prefix_cache_hit_tokens_total{namespace=~"$namespace", '
            'service=~"$service"})'
        )
    )
    assert {r["metric"]["pool"] for r in hits if float(r["value"][1]) > 0} == {
        "prefill",
        "decode",
    }  # the shared prefix


def test_vllm_named_series_agree_with_tandems(observed):
    """Each vLLM-named series, read back from Prometheus, against the tandem series it restates (the same
    scrape of the same process, so equal to rounding; counters fed on another thread are waited for)."""
    prom, _ = observed
    sel = f'{{namespace="{NAMESPACE}", service="{SERVICE}"}}'
    vllm = f'{{namespace="{NAMESPACE}", service="{SERVICE}", model_name="tiny"}}'

    def zero(result: list[dict]) -> bool:
        return bool(result) and all(abs(float(r["value"][1])) < 1e-6 for r in result)

    def same(theirs: str, ours: str, wait: bool = False) -> float:
        """Assert theirs - ours is 0 in every series (waiting up to 60 s if asked); the sum of theirs."""
        expr = f"({theirs}) - ({ours})"
        result = prom.wait_for(expr, 60, ok=zero) if wait else prom.query(expr)
        assert zero(result), (expr, result)
        (value,) = prom.query(f"sum({theirs})")
        return float(value["value"][1])

    # the router's per-request series
    for theirs, ours in (
        (names.VLLM_TTFT_SECONDS, names.TTFT_SECONDS),
        (names.VLLM_ITL_SECONDS, names.ITL_SECONDS),
        (names.VLLM_E2E_SECONDS, names.E2E_SECONDS),
    ):
        for suffix in ("_count", "_sum"):
            assert same(f"sum({theirs}{suffix}{vllm})", f"sum({ours}{suffix}{sel})", wait=True) > 0, theirs
    # every streamed token was a first token or followed one
    assert (
        same(
            f"sum({names.VLLM_GENERATION_TOKENS}_total{vllm})",
            f"sum({names.TTFT_SECONDS}_count{sel}) + sum({names.ITL_SECONDS}_count{sel})",
            wait=True,
        )
        > 0
    )
    # a prompt counts once prefilled; tandem's histogram counts it on admission (equal between requests)
    assert (
        same(
            f"sum({names.VLLM_PROMPT_TOKENS}_total{vllm})",
            f"sum({names.REQUEST_PROMPT_TOKENS}_sum{sel})",
            wait=True,
        )
        > 0
    )
    # each worker's engine state, per pod
    per_pod = "sum by (pod) "
    assert (
        same(f"{per_pod}({names.VLLM_RUNNING}{vllm})", f"{per_pod}({names.DECODE_RUNNING_SEQUENCES}{sel})")
        >= 0
    )
    assert (
        same(
            f"{per_pod}({names.VLLM_KV_CACHE_USAGE}{vllm})",
            f"{per_pod}({names.KV_BLOCKS_USED}{sel}) / {per_pod}({names.KV_BLOCKS_TOTAL}{sel})",
        )
        >= 0
    )
    for theirs, ours in (
        (names.VLLM_PREFIX_CACHE_QUERIES, names.PREFIX_CACHE_QUERIED_TOKENS_TOTAL),
        (names.VLLM_PREFIX_CACHE_HITS, names.PREFIX_CACHE_HIT_TOKENS_TOTAL),
    ):
        assert same(f"sum({theirs}_total{vllm})", f"sum({ours}{sel})", wait=True) > 0, (
            theirs
        )  # the shared prefix
    waiting = prom.query(f"{names.VLLM_WAITING}{vllm}")
    assert {r["metric"]["pool"] for r in waiting} == {"prefill", "decode"}
    assert all(float(r["value"][1]) >= 0 for r in waiting)
    # each name comes from one kind of process, so a sum over pods counts once
    for name in (names.VLLM_TTFT_SECONDS + "_count", names.VLLM_PROMPT_TOKENS + "_total"):
        assert {r["metric"]["pool"] for r in prom.query(f"{name}{vllm}")} == {"router"}, name
    for name in (names.VLLM_RUNNING, names.VLLM_KV_CACHE_USAGE):
        assert {r["metric"]["pool"] for r in prom.query(f"{name}{vllm}")} == {"prefill", "decode"}, name


def test_alert_rules_evaluate_on_live_series(observed):
    prom, _ = observed
    groups = {g["name"]: g for g in prom.rule_groups()}
    assert set(groups) == {"tandem-slo.rules", "tandem-slo.alerts", "tandem-workers.alerts"}
    for group in groups.values():
        for rule in group["rules"]:
            assert rule["health"] in ("ok", "unknown") and not rule.get("lastError"), rule
    # the recording rules the burn-rate alerts read have a value per SLO for this service
    ratios = prom.wait_for(f'tandem:slo_error_ratio:rate5m{{service="{SERVICE}"}}', ok=lambda r: len(r) == 2)
    assert {r["metric"]["slo"] for r in ratios} == {"ttft", "tpot"}
    (budget, _) = prom.wait_for(
        f'tandem:slo_error_budget:ratio{{service="{SERVICE}"}}', ok=lambda r: len(r) == 2
    )
    assert float(budget["value"][1]) == pytest.approx(0.1)  # spec.slo.percentile 90
    firing = {a["labels"]["alertname"] for a in prom.alerts() if a["labels"].get("service") == SERVICE}
    assert not firing & {"TandemWorkerDown", "TandemKVCacheFull"}, firing  # every worker up, cache not full


def test_variables_and_annotations(observed):
    prom, _ = observed
    dash = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dash["templating"]["list"] if v["type"] == "query"}
    listed = {}
    for name, v in variables.items():
        match = re.fullmatch(r"label_values\((.+), (\w+)\)", v["query"]["query"])
        assert match and match.group(2) == name, v["query"]
        listed[name] = set(prom.label_values(name, grafana_vars(match.group(1))))
    assert listed == {"namespace": {NAMESPACE}, "service": {SERVICE}, "pool": {"prefill", "decode"}}
    for annotation in dash["annotations"]["list"]:
        prom.query(grafana_vars(annotation["expr"]))  # parses and evaluates (no data without the autoscaler)


def _top(*args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "tandem", "top", "--iterations", "2", "--interval", "1", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "220"},
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def _cell(output: str, column: int) -> str:
    """The last frame's row for the service: the text of one column."""
    row = [line for line in output.splitlines() if SERVICE in line][-1]
    return row.split("│")[column + 1].strip()


def _spec(model_dir) -> dict:
    obj = spec(SERVICE, model_dir, prefillChunkTokens=32)
    obj["spec"]["slo"] = {"ttftMs": 2000, "tpotMs": 200, "percentile": 90}
    obj["spec"].setdefault("engine", {})["speculative"] = {
        "method": "ngram",
        "numTokens": 4,
    }  # its panel has data
    return obj


def test_top_headless_from_the_routers_metrics(observed, tiny_model_dir, tmp_path):
    prom, load = observed
    router_url = load.url
    out = _top("--router", router_url)
    assert out.count("tandem top") == 2  # one frame per poll
    assert _cell(out, 0) == SERVICE  # a router's /metrics does not know the namespace
    assert _cell(out, 1) == "prefill 1  decode 1"  # workers the router can route to
    spec_file = tmp_path / "svc.yaml"
    spec_file.write_text(yaml.safe_dump(_spec(tiny_model_dir)))
    with_spec = _top("--router", router_url, "-f", str(spec_file))
    assert _cell(with_spec, 1) == "prefill 1/1  decode 1/1"  # ready (the router) / desired (the spec)
    ttft, tpot = _cell(out, 2), _cell(out, 3)
    assert re.fullmatch(r"[0-9.]+ms / 2000ms \S*", ttft), ttft  # the spec's SLO line, a sparkline
    assert re.fullmatch(r"[0-9.]+ms / 200ms \S*", tpot), tpot
    attainment = _cell(out, 4)
    assert re.fullmatch(r"ttft [0-9.]+% tpot [0-9.]+% \(objective 90%\)", attainment), attainment
    assert float(_cell(out, 5).split()[0]) > 0  # requests per second between the two polls


def test_top_headless_from_prometheus_agrees(observed):
    prom, _ = observed
    out = _top("--prometheus", prom.url)
    assert _cell(out, 0) == f"{NAMESPACE}/{SERVICE}" and _cell(out, 1) == "prefill 1  decode 1"  # up per pool
    (objective,) = prom.query(f'max(tandem_slo_objective_ratio{{service="{SERVICE}"}})')
    assert f"(objective {float(objective['value'][1]) * 100:.0f}%)" in _cell(out, 4)
    assert re.match(r"[0-9.]+ms / 2000ms", _cell(out, 2)) and "(" in _cell(out, 5)  # errors: the 404s
