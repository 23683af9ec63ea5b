"""The chart's alert rules (charts/tandem/files/prometheus-rules.yaml) pass `promtool check rules`, and
`promtool test rules` fires and does not fire each alert on synthetic series; the chart renders the same
groups into its PrometheusRule. Skips without promtool (Debian's prometheus package) or helm."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from tandem import names
from tests.prometheus import require
from tests.unit.test_chart_dashboard import _template

RULES = Path(__file__).resolve().parents[2] / "charts/tandem/files/prometheus-rules.yaml"
SVC = {"namespace": "ns", "service": "llama"}
ROUTER = {**SVC, "pool": "router", "pod": "llama-router-0"}


def slo_series(
    slo: str, objective: float, errors_per_min: int, ok_per_min: int, minutes: int, then: str = ""
) -> list[dict]:
    """The router's SLO counters for one `slo`: `errors_per_min` requests missing the target and
    `ok_per_min` meeting it every minute for `minutes`, then `then` (promtool series notation) if given."""

    def series(name: str, **extra: str) -> str:
        return name + "{" + ",".join(f'{k}="{v}"' for k, v in {**ROUTER, "slo": slo, **extra}.items()) + "}"

    return [
        {
            "series": series(names.SLO_REQUESTS_TOTAL, met="false"),
            "values": f"0+{errors_per_min}x{minutes}{then}",
        },
        {"series": series(names.SLO_REQUESTS_TOTAL, met="true"), "values": f"0+{ok_per_min}x{minutes + 60}"},
        {"series": series(names.SLO_OBJECTIVE_RATIO), "values": f"{objective}x{minutes + 60}"},
    ]


def burn(slo: str, speed: str, ratio: str) -> dict:
    """An SLO alert as promtool expects it (labels and rendered annotations)."""
    upper = slo.upper()
    window = {"Fast": ("the last hour", "14.4x"), "Slow": ("the last 6 hours", "6x")}[speed]
    hint = {
        ("ttft", "Fast"): ": the prefill pool is short of capacity or its queue is growing.",
        ("tpot", "Fast"): ": the decode pool's batches are too large or its KV cache is full.",
    }.get((slo, speed), ".")
    return {
        "exp_labels": {**SVC, "slo": slo, "severity": "page" if speed == "Fast" else "ticket"},
        "exp_annotations": {
            "summary": f"ns/llama is burning its {upper} error budget{' fast' if speed == 'Fast' else ''}",
            "description": (
                f"{ratio} of requests missed the {upper} target over {window[0]} ({window[1]} the "
                f"budget rate){hint}"
            ),
        },
    }


def case(series: list[dict], checks: list[tuple[str, str, list[dict]]]) -> dict:
    return {
        "interval": "1m",
        "input_series": series,
        "alert_rule_test": [{"eval_time": t, "alertname": a, "exp_alerts": exp} for t, a, exp in checks],
    }


def slo_cases() -> list[dict]:
    cases = []
    for slo in (names.SLO_TTFT, names.SLO_TPOT):
        u = slo.upper()
        fast, slow = f"Tandem{u}BudgetBurnFast", f"Tandem{u}BudgetBurnSlow"
        # 99% objective (1% budget): 20% of requests missing is a 20x burn, over both thresholds
        cases.append(
            case(
                slo_series(slo, 0.99, 20, 80, 120),
                [
                    ("10m", fast, [burn(slo, "Fast", "20%")]),
                    ("10m", slow, []),  # still pending: its `for` is 15 minutes
                    ("30m", slow, [burn(slo, "Slow", "20%")]),
                ],
            )
        )
        # 10% missing is a 10x burn: under the fast threshold (14.4x), over the slow one (6x)
        cases.append(
            case(
                slo_series(slo, 0.99, 10, 90, 120),
                [("60m", fast, []), ("60m", slow, [burn(slo, "Slow", "10%")])],
            )
        )
        # 0.5% missing is within budget: nothing fires
        cases.append(case(slo_series(slo, 0.99, 1, 199, 400), [("6h", fast, []), ("6h", slow, [])]))
        # the burn stops after an hour: the 1 h window still burns, the 5 m window clears the page
        stopped = slo_series(slo, 0.99, 20, 80, 60, then=" 1200x60")
        cases.append(case(stopped, [("55m", fast, [burn(slo, "Fast", "20%")]), ("75m", fast, [])]))
        # a p90 objective: 14.4x its 10% budget is more than every request, so the threshold is half of them
        cases.append(case(slo_series(slo, 0.9, 60, 40, 120), [("30m", fast, [burn(slo, "Fast", "60%")])]))
        cases.append(case(slo_series(slo, 0.9, 40, 60, 120), [("30m", fast, []), ("30m", slow, [])]))
    # the TTFT SLO burning does not raise the TPOT alerts
    cases.append(
        case(
            slo_series("ttft", 0.99, 50, 50, 60) + slo_series("tpot", 0.99, 0, 100, 60),
            [
                ("20m", "TandemTPOTBudgetBurnFast", []),
                ("20m", "TandemTTFTBudgetBurnFast", [burn("ttft", "Fast", "50%")]),
            ],
        )
    )
    return cases


def worker_cases() -> list[dict]:
    decode = {**SVC, "pool": "decode", "pod": "llama-decode-1", "instance": "10.0.0.7:9090", "job": "tandem"}

    def up(labels: dict, values: str) -> dict:
        return {"series": "up{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}", "values": values}

    down = {
        "exp_labels": {**decode, "severity": "page"},
        "exp_annotations": {
            "summary": "ns/llama decode pod llama-decode-1 is down",
            "description": "Prometheus has not scraped 10.0.0.7:9090 for 2 minutes.",
        },
    }
    kv = {**SVC, "pool": "decode", "pod": "llama-decode-1"}

    def blocks(used: int) -> list[dict]:
        sel = ",".join(f'{k}="{v}"' for k, v in kv.items())
        return [
            {"series": f"{names.KV_BLOCKS_USED}{{{sel}}}", "values": f"{used}x20"},
            {"series": f"{names.KV_BLOCKS_TOTAL}{{{sel}}}", "values": "1000x20"},
        ]

    full = {
        "exp_labels": {**kv, "severity": "warning"},
        "exp_annotations": {
            "summary": "ns/llama decode pod llama-decode-1 KV cache is full",
            "description": (
                "98% of KV blocks in use for 5 minutes: new requests wait or preempt running "
                "ones; add decode replicas or KV memory."
            ),
        },
    }
    return [
        case(
            [up(decode, "1 1 0 0 0 0 0 0")],
            [("3m", "TandemWorkerDown", []), ("5m", "TandemWorkerDown", [down])],
        ),
        case([up(decode, "1x10")], [("5m", "TandemWorkerDown", [])]),
        case(
            [up({"job": "node", "instance": "x"}, "0x10")], [("5m", "TandemWorkerDown", [])]
        ),  # not a tandem pod
        case(blocks(980), [("3m", "TandemKVCacheFull", []), ("10m", "TandemKVCacheFull", [full])]),
        case(blocks(900), [("10m", "TandemKVCacheFull", [])]),
    ]


def test_promtool_checks_the_rules():
    out = subprocess.run(
        [require("promtool"), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr
    alerts = {
        r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r
    }
    assert alerts == {
        "TandemTTFTBudgetBurnFast",
        "TandemTTFTBudgetBurnSlow",
        "TandemTPOTBudgetBurnFast",
        "TandemTPOTBudgetBurnSlow",
        "TandemWorkerDown",
        "TandemKVCacheFull",
    }


def test_promtool_unit_tests_fire_and_do_not_fire_each_alert(tmp_path):
    tests = {"rule_files": [str(RULES)], "evaluation_interval": "1m", "tests": slo_cases() + worker_cases()}
    fired = {t["alertname"] for c in tests["tests"] for t in c["alert_rule_test"] if t["exp_alerts"]}
    quiet = {t["alertname"] for c in tests["tests"] for t in c["alert_rule_test"] if not t["exp_alerts"]}
    assert fired == quiet and len(fired) == 6  # every alert is shown firing and shown staying quiet
    path = tmp_path / "tests.yaml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False))
    out = subprocess.run(
        [require("promtool"), "test", "rules", str(path)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]


def test_chart_renders_the_same_rules_when_enabled():
    docs = _template()
    assert "PrometheusRule" not in [
        d["kind"] for d in docs
    ]  # off by default: needs the Prometheus Operator's CRDs
    docs = _template(
        "--set",
        "monitoring.prometheusRule.enabled=true",
        "--set",
        "monitoring.prometheusRule.labels.release=kps",
    )
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    assert (
        rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["metadata"]["namespace"] == "tandem-system"
    )
    assert rule["metadata"]["labels"]["release"] == "kps"
    assert rule["spec"] == yaml.safe_load(RULES.read_text())
