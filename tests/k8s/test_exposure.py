"""A router put outside the cluster while it takes no API keys: someone's LoadBalancer or NodePort Service
in front of the router pods gets the InferenceService a Warning Event naming it (once, not at every
resync); a ClusterIP Service does not; with API keys set the operator stops looking."""

from __future__ import annotations

import time

import yaml

from tests.k8s.conftest import wait_for
from tests.k8s.test_operator_failures import warning_events
from tests.k8s.test_operator_lifecycle import EXAMPLE, SERVICE, model_volume, ready_at_current_generation

REASON = "ExposedWithoutAPIKeys"


def _exposed(cp, ns: str) -> list[dict]:
    return [e for e in warning_events(cp, ns, SERVICE) if e["reason"] == REASON]


def _expose(cp, ns: str, name: str, type_: str) -> None:
    cp.kubectl(
        "expose",
        "deployment",
        f"{SERVICE}-router",
        "-n",
        ns,
        f"--name={name}",
        f"--type={type_}",
        "--port=80",
        "--target-port=http",
    )


def test_a_keyless_router_behind_a_load_balancer_gets_a_warning_event(control_plane, operator, namespace):
    cp, ns = control_plane, namespace
    cp.kubectl("apply", "-f", "-", input=model_volume(ns))
    cp.kubectl("apply", "-n", ns, "-f", str(EXAMPLE))
    wait_for(lambda: ready_at_current_generation(cp, ns), 180, "Ready")
    _expose(cp, ns, "inside", "ClusterIP")  # reachable in the cluster only: nothing to say
    _expose(cp, ns, "public", "LoadBalancer")
    (event,) = wait_for(
        lambda: _exposed(cp, ns), 60, "an ExposedWithoutAPIKeys Warning Event"
    )  # the next resync
    assert "Service public (LoadBalancer)" in event["message"] and "inside" not in event["message"]
    assert "spec.security.apiKeys" in event["message"]
    time.sleep(12)  # another resync (10 s in these tests): the same exposure is not warned again
    assert len(_exposed(cp, ns)) == 1
    _expose(cp, ns, "debug", "NodePort")
    wait_for(lambda: len(_exposed(cp, ns)) == 2, 60, "a second event for the new way in")
    assert any(
        "Service debug (NodePort), Service public (LoadBalancer)" in e["message"] for e in _exposed(cp, ns)
    )


def test_api_keys_silence_the_warning(control_plane, operator, namespace):
    cp, ns = control_plane, namespace
    cp.kubectl("apply", "-f", "-", input=model_volume(ns))
    cp.kubectl("create", "secret", "generic", f"{SERVICE}-keys", "-n", ns, "--from-literal=api-keys=sk-one")
    obj = yaml.safe_load(EXAMPLE.read_text())
    obj["spec"]["security"] = {"apiKeys": {"secretName": f"{SERVICE}-keys"}}
    cp.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(obj))
    wait_for(lambda: ready_at_current_generation(cp, ns), 180, "Ready")
    _expose(cp, ns, "public", "LoadBalancer")
    time.sleep(12)  # a resync (10 s in these tests) after the Service appeared
    assert _exposed(cp, ns) == []
