"""What the API server refuses shows on the InferenceService: Degraded with its message, a Warning Event,
no half-built GPU pools, and a backoff instead of a hot retry loop."""

from __future__ import annotations

import re
import time

import yaml

from tandem import names
from tests.k8s.conftest import get_json, wait_for
from tests.k8s.test_operator_lifecycle import condition, ready_at_current_generation


def _apply(cp, ns: str, name: str, spec: dict) -> None:
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
                "metadata": {"name": name},
                "spec": {"model": {"source": {"path": "/models/m"}, "servedName": name}, **spec},
            }
        ),
    )


def degraded(cp, ns: str, name: str, reason: str) -> dict | None:
    obj = get_json(cp, "tsvc", name, namespace=ns)
    c = condition(obj, "Degraded")
    return obj if c.get("status") == "True" and c.get("reason") == reason else None


def warning_events(cp, ns: str, name: str) -> list[dict]:
    events = get_json(
        cp, "events", "--field-selector", f"involvedObject.name={name},type=Warning", namespace=ns
    )["items"]
    return [e for e in events if e["involvedObject"]["kind"] == "InferenceService"]


def failed_reconciles(log: str, ns: str, name: str) -> int:
    return len(re.findall(rf"reconcile {re.escape(ns)}/{re.escape(name)} failed", log))


def quota_refuses_services(cp, ns: str) -> bool:
    """A quota binds only once the quota controller has counted it: probe admission with a dry run."""
    out = cp.kubectl(
        "create", "service", "clusterip", "probe", "--tcp=80", "--dry-run=server", "-n", ns, check=False
    )
    return out.returncode != 0 and "exceeded quota" in out.stderr


def test_refused_child_degrades_with_the_servers_message_builds_nothing_and_backs_off(
    control_plane, operator, namespace
):
    cp, ns = control_plane, namespace
    cp.kubectl("create", "quota", "no-services", "--hard=services=0", "-n", ns)
    wait_for(lambda: quota_refuses_services(cp, ns), 60, "the quota to bind")
    _apply(cp, ns, "q", {})
    obj = wait_for(lambda: degraded(cp, ns, "q", "ApplyFailed"), 60, "Degraded ApplyFailed")
    for ctype in ("Degraded", "Ready", "Progressing"):
        c = condition(obj, ctype)
        assert c["reason"] == "ApplyFailed" and "exceeded quota" in c["message"], c
    assert condition(obj, "Ready")["status"] == "False" and condition(obj, "Progressing")["status"] == "False"
    (event,) = wait_for(lambda: warning_events(cp, ns, "q"), 30, "a Warning Event on the InferenceService")
    assert event["reason"] == "ApplyFailed" and "exceeded quota" in event["message"]
    # every child is dry-run first: the refused Services leave no GPU Deployment behind
    out = cp.kubectl("get", "deployments", "-n", ns, "-l", f"{names.LABEL_SERVICE}=q", "-o", "name").stdout
    assert out.strip() == ""
    # child events, resyncs (every 10 s here) and our own status writes must not retry a permanent refusal
    first = failed_reconciles(operator.log(), ns, "q")
    time.sleep(12)
    assert failed_reconciles(operator.log(), ns, "q") - first == 0
    assert len(warning_events(cp, ns, "q")) == 1

    # the fix: quota lifted, and the next generation is retried at once and becomes Ready
    cp.kubectl("delete", "quota", "no-services", "-n", ns)
    cp.kubectl("patch", "tsvc", "q", "-n", ns, "--type=merge", "-p", '{"spec":{"slo":{"ttftMs":400}}}')
    obj = wait_for(lambda: ready_at_current_generation(cp, ns, "q"), 60, "Ready after the fix")
    assert condition(obj, "Degraded")["status"] == "False"
