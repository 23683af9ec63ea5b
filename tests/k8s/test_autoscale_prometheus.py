"""The Kubernetes loop closed with real parts: a real Prometheus scrapes a local `tandem up` stack whose
metrics carry an InferenceService's labels; under load that breaches both SLOs the operator reads PromQL
and grows both TandemPools, kwok runs the new pods, status and Events say so; with Prometheus stopped
SLOMet turns Unknown / MetricsUnavailable and the pools hold."""

from __future__ import annotations

import time

import pytest
import yaml

from tests.integration.stacks import metrics_targets, running_stack, spec
from tests.integration.test_drain_scaling import StreamingLoad
from tests.k8s.conftest import get_json, wait_for
from tests.k8s.test_operator_lifecycle import condition
from tests.prometheus import require, running_prometheus

pytestmark = pytest.mark.slow
NAME = "closed"


def _replicas(cp, ns: str, pool: str) -> int:
    return get_json(cp, "tpool", f"{NAME}-{pool}", namespace=ns)["spec"]["replicas"]


def test_prometheus_driven_scale_up_then_metrics_loss_holds(
    control_plane, operator, namespace, tiny_model_dir, tmp_path
):
    require("prometheus")
    cp, ns = control_plane, namespace
    with running_stack(spec(NAME, tiny_model_dir), tmp_path / "stack") as (stack, url):
        with running_prometheus(metrics_targets(stack, NAME, ns), tmp_path / "prom") as prom:
            prom.wait_targets_up()
            cp.kubectl(
                "apply",
                "-n",
                ns,
                "-f",
                "-",
                input=yaml.safe_dump(
                    {
                        "apiVersion": "serving.tandem.dev/v1alpha1",
                        "kind": "InferenceService",
                        "metadata": {"name": NAME},
                        "spec": {
                            "model": {"source": {"path": "/models/m"}, "servedName": "tiny"},
                            "prefill": {
                                "replicas": 1,
                                "minReplicas": 1,
                                "maxReplicas": 2,
                                "resources": {"gpus": 0},
                            },
                            "decode": {
                                "replicas": 1,
                                "minReplicas": 1,
                                "maxReplicas": 2,
                                "resources": {"gpus": 0},
                            },
                            "slo": {
                                "ttftMs": 1,
                                "tpotMs": 1,
                                "percentile": 90,
                            },  # the tiny CPU model meets neither
                            "autoscaling": {
                                "enabled": True,
                                "intervalSeconds": 2,
                                "windowSeconds": 20,
                                "prometheusUrl": prom.url,
                            },
                        },
                    }
                ),
            )
            with StreamingLoad(url, clients=3) as load:
                wait_for(
                    lambda: _replicas(cp, ns, "prefill") == 2 and _replicas(cp, ns, "decode") == 2,
                    180,
                    "both TandemPools grown to 2 from PromQL",
                )
                wait_for(
                    lambda: all(
                        (
                            get_json(cp, "deployment", f"{NAME}-{p}", namespace=ns)["status"].get(
                                "readyReplicas"
                            )
                            or 0
                        )
                        == 2
                        for p in ("prefill", "decode")
                    ),
                    120,
                    "kwok runs the new pods",
                )
                obj = wait_for(
                    lambda: (
                        (o := get_json(cp, "tsvc", NAME, namespace=ns))
                        and condition(o, "SLOMet").get("status") == "False"
                        and o
                    ),
                    60,
                    "SLOMet False",
                )
            assert load.failures == [], load.failures[:5]
        # Prometheus is stopped now
        cond = wait_for(
            lambda: (
                (c := condition(get_json(cp, "tsvc", NAME, namespace=ns), "SLOMet")).get("reason")
                == "MetricsUnavailable"
                and c
            ),
            60,
            "SLOMet Unknown/MetricsUnavailable",
        )
        assert cond["status"] == "Unknown"
        time.sleep(5)  # ticks go on; nothing moves
        assert _replicas(cp, ns, "prefill") == 2 and _replicas(cp, ns, "decode") == 2
    st = obj["status"]
    assert condition(obj, "SLOMet")["reason"] in (
        "TTFTAboveTarget",
        "TPOTAboveTarget",
        "TTFTAndTPOTAboveTarget",
    )
    assert st["slo"]["ttftMs"] > 1 and st["slo"]["tpotMs"] > 1 and st["slo"]["ttft"].endswith("/1ms")
    assert st["autoscaling"]["pools"]["decode"]["desiredReplicas"] == 2
    assert (
        st["autoscaling"]["lastDecision"]["toReplicas"] == 2 and st["autoscaling"]["lastDecision"]["reason"]
    )
    assert 0 <= st["slo"]["attainment"]["ttft"] <= 1
    events = get_json(cp, "events", "--field-selector", f"involvedObject.name={NAME}", namespace=ns)["items"]
    ups = [e for e in events if e["reason"] == "ScaledUp"]
    assert {e["message"].split()[0] for e in ups} == {"prefill", "decode"}, [e["message"] for e in ups]
