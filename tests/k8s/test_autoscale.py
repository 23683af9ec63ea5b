"""The autoscaler's Kubernetes side on the real control plane (kwok runs the pods, so nothing serves
metrics): the drain-safe scale-down removes the pod the actuator marked, and with no metrics to read the
operator (pointed at a loopback port where no Prometheus listens) reports SLOMet Unknown /
MetricsUnavailable, shows it in `kubectl get tsvc`, and holds the pools."""

from __future__ import annotations

import time

import yaml

from tandem import names
from tandem.launch import drain_timeout_seconds
from tandem.operator.autoscale.backends.kube.actuator import DELETION_COST, KubeActuator
from tandem.operator.autoscale.core.types import Decision, Pool
from tandem.operator.runtime.kube import Kube
from tandem.spec import parse_object
from tests.k8s.conftest import get_json, wait_for
from tests.k8s.test_operator_lifecycle import condition


def _svc(name: str, decode: int, autoscaling: dict | None = None) -> dict:
    return {
        "apiVersion": "serving.tandem.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": {
            "model": {"source": {"path": "/models/m"}, "servedName": name},
            "prefill": {"replicas": 1, "resources": {"gpus": 0}},
            "decode": {"replicas": decode, "maxReplicas": 4, "resources": {"gpus": 0}},
            "autoscaling": autoscaling or {"enabled": False},
        },
    }


def _pods(cp, ns: str, name: str, pool: str) -> list[dict]:
    out = get_json(cp, "pods", "-l", f"{names.LABEL_SERVICE}={name},{names.LABEL_POOL}={pool}", namespace=ns)
    return (out or {}).get("items") or []


def _ready(pods: list[dict]) -> list[dict]:
    return [
        p
        for p in pods
        if not p["metadata"].get("deletionTimestamp")
        and any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions") or [])
    ]


def test_scale_down_removes_the_pod_with_the_fewest_running_sequences(control_plane, operator, namespace):
    cp, ns = control_plane, namespace
    obj = _svc("victim", decode=3)
    cp.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(obj))
    pods = wait_for(
        lambda: len(r := _ready(_pods(cp, ns, "victim", "decode"))) == 3 and r, 120, "3 decode pods Ready"
    )
    spec = parse_object({**obj, "metadata": {"name": "victim", "namespace": ns}}).spec
    pod_spec = pods[0]["spec"]
    assert pod_spec["terminationGracePeriodSeconds"] > drain_timeout_seconds(spec)
    assert pod_spec["containers"][0]["lifecycle"]["preStop"]["exec"]["command"][:2] == ["tandem", "drain"]

    names_ = sorted(p["metadata"]["name"] for p in pods)
    load = {names_[0]: 7.0, names_[1]: 0.0, names_[2]: 3.0}  # what each pod's /metrics would say
    kube = Kube.from_kubeconfig(str(cp.kubeconfig("admin")))
    owner = get_json(cp, "tsvc", "victim", namespace=ns)
    actuator = KubeActuator(
        kube,
        owner,
        (Pool.prefill, Pool.decode),
        lambda ps: {p["metadata"]["name"]: load[p["metadata"]["name"]] for p in ps},
    )
    assert actuator.replicas()[Pool.decode].ready == 3
    assert actuator.mark_victims(Pool.decode) == {names_[0]: 7, names_[1]: 0, names_[2]: 3}
    costs = {
        p["metadata"]["name"]: p["metadata"]["annotations"][DELETION_COST]
        for p in _pods(cp, ns, "victim", "decode")
    }
    assert costs == {names_[0]: "7", names_[1]: "0", names_[2]: "3"}
    actuator.apply(Decision(Pool.decode, 3, 2, "decode 3->2: test", "ScaleDown"))
    wait_for(
        lambda: (
            {p["metadata"]["name"] for p in _ready(_pods(cp, ns, "victim", "decode"))}
            == {names_[0], names_[2]}
        ),
        120,
        f"{names_[1]} (no running sequences) removed, the busy ones kept",
    )
    events = get_json(cp, "events", "--field-selector", "involvedObject.name=victim", namespace=ns)["items"]
    assert any(e["reason"] == "ScaledDown" and "decode 3->2" in e["message"] for e in events)


def test_without_metrics_slo_met_is_unknown_and_the_pools_hold(control_plane, operator, namespace):
    cp, ns = control_plane, namespace
    cp.kubectl(
        "apply",
        "-n",
        ns,
        "-f",
        "-",
        input=yaml.safe_dump(_svc("blind", decode=2, autoscaling={"enabled": True, "intervalSeconds": 1})),
    )

    def unknown():
        c = condition(get_json(cp, "tsvc", "blind", namespace=ns), "SLOMet")
        return c if c.get("status") == "Unknown" and c.get("reason") == "MetricsUnavailable" else None

    cond = wait_for(unknown, 120, "SLOMet Unknown/MetricsUnavailable")
    assert "Prometheus at http://127.0.0.1:" in cond["message"] and "refused" in cond["message"]
    time.sleep(3)  # several ticks: nothing moves
    for pool, want in (("prefill", 1), ("decode", 2)):
        assert get_json(cp, "tpool", f"blind-{pool}", namespace=ns)["spec"]["replicas"] == want
    status = get_json(cp, "tsvc", "blind", namespace=ns)["status"]
    assert status["slo"]["ttft"] == "-/500ms" and status["slo"]["tpot"] == "-/50ms"
    header, row = cp.kubectl("get", "tsvc", "blind", "-n", ns).stdout.splitlines()[:2]
    starts = [i for i, ch in enumerate(header) if ch != " " and (i == 0 or header[i - 1] == " ")]
    cells = {header[a:b].strip(): row[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)}
    assert cells["TTFT"] == "-/500ms" and cells["TPOT"] == "-/50ms" and cells["SLO"] == "Unknown", cells


def test_status_writes_built_on_a_stale_read_keep_the_other_writers_condition(control_plane, namespace):
    """The reconciler and the autoscaler both write the conditions list; one that read before the other wrote
    gets a conflict from the API server, reads again, and keeps the other's condition."""
    from tandem.operator.status.service import rebase
    from tandem.spec import KIND

    cp, ns = control_plane, namespace
    cp.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(_svc("writers", decode=1)))
    kube = Kube.from_kubeconfig(str(cp.kubeconfig("admin")))
    stale = kube.get(KIND, ns, "writers")
    assert stale is not None
    slo_met = {"type": "SLOMet", "status": "True", "reason": "WithinTarget", "message": "ok"}
    kube.patch_status(KIND, stale, lambda prev: {"conditions": [*(prev.get("conditions") or []), slo_met]})

    built_on: list[list[str]] = []
    ready = {"type": "Ready", "status": "True", "reason": "AllPoolsReady", "message": "ok"}

    def reconciler(previous: dict) -> dict:
        built_on.append([c["type"] for c in previous.get("conditions") or []])
        return rebase({"conditions": [ready]}, previous)

    written = kube.patch_status(KIND, stale, reconciler)  # built on the read from before SLOMet was written
    # refused (409), then rebuilt on the fresh status; the session's operator may write this object too, so
    # the status is read as this write left it, not later
    assert built_on[0] == [] and len(built_on) >= 2 and "SLOMet" in built_on[-1]
    final = {c["type"]: c["status"] for c in written["status"]["conditions"]}
    assert final["Ready"] == "True" and final["SLOMet"] == "True"


def test_a_flip_relabels_a_pod_leaves_the_replicasets_alone_and_the_flipped_pod_goes_first(
    control_plane, operator, namespace
):
    from tandem.operator.autoscale.backends.kube.flip import FLIPPED_AT
    from tandem.operator.autoscale.core.flip import Flip

    cp, ns = control_plane, namespace
    cp.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(_svc("flipper", decode=3)))
    pods = wait_for(
        lambda: len(r := _ready(_pods(cp, ns, "flipper", "decode"))) == 3 and r, 120, "3 decode pods Ready"
    )
    wait_for(lambda: len(_ready(_pods(cp, ns, "flipper", "prefill"))) == 1, 120, "1 prefill pod Ready")
    names_ = sorted(p["metadata"]["name"] for p in pods)
    load = {names_[0]: 4.0, names_[1]: 1.0, names_[2]: 6.0}
    kube = Kube.from_kubeconfig(str(cp.kubeconfig("admin")))
    owner = get_json(cp, "tsvc", "flipper", namespace=ns)
    actuator = KubeActuator(
        kube,
        owner,
        (Pool.prefill, Pool.decode),
        lambda ps: {p["metadata"]["name"]: load.get(p["metadata"]["name"], 0.0) for p in ps},
    )
    actuator.refresh()
    actuator.flip(
        Flip(
            Pool.decode,
            Pool.prefill,
            1,
            "FlippedToPrefill: TTFT p90 7070 ms > 1000 ms SLO",
            "FlippedToPrefill",
        )
    )
    lent = get_json(cp, "pod", names_[1], namespace=ns)
    assert lent["metadata"]["labels"][names.LABEL_ROLE] == "prefill"  # the emptiest decode pod
    assert FLIPPED_AT in lent["metadata"]["annotations"]
    counts = actuator.replicas()
    assert (counts[Pool.prefill].ready, counts[Pool.decode].ready) == (2, 2)
    # prefill 2->3 by role is one more prefill pod of its own; decode's ReplicaSet makes none for the lent one
    actuator.apply(Decision(Pool.prefill, 2, 3, "prefill 2->3: test", "SLOBreach"))
    assert get_json(cp, "tpool", "flipper-prefill", namespace=ns)["spec"]["replicas"] == 2
    wait_for(
        lambda: len(_ready(_pods(cp, ns, "flipper", "prefill"))) == 2, 120, "prefill's own second pod Ready"
    )
    time.sleep(2)
    assert sorted(p["metadata"]["name"] for p in _pods(cp, ns, "flipper", "decode")) == names_
    # back home, then decode steps down: the pod the flip touched goes first, though not the emptiest now
    actuator.refresh()
    actuator.flip(Flip(Pool.prefill, Pool.decode, 1, "FlippedBack: test", "FlippedBack"))
    assert get_json(cp, "pod", names_[1], namespace=ns)["metadata"]["labels"][names.LABEL_ROLE] == "decode"
    load[names_[1]] = 5.0
    actuator.refresh()
    actuator.apply(Decision(Pool.decode, 3, 2, "decode 3->2: test", "ScaleDown"))
    wait_for(
        lambda: (
            {p["metadata"]["name"] for p in _ready(_pods(cp, ns, "flipper", "decode"))}
            == {names_[0], names_[2]}
        ),
        120,
        f"{names_[1]} (flipped and back) removed first",
    )
    events = get_json(cp, "events", "--field-selector", "involvedObject.name=flipper", namespace=ns)["items"]
    assert any(e["reason"] == "FlippedToPrefill" and names_[1] in e["message"] for e in events)


def test_mode_auto_collapse_relabels_the_prefill_pod_drains_the_decode_pod_and_says_why(
    control_plane, operator, namespace
):
    """A collapse of an `auto` service as the operator's autoscaler carries it out, a step per tick: the
    prefill pod is relabelled colocated (the colocated Service selects it), the decode pod drains (its home's
    TandemPool goes to 0, which the operator keeps), and an Event gives the shape rule's reason."""
    from tandem.operator.autoscale.core.shape import Shape, ShapeAction, ShapeDecision
    from tandem.operator.autoscale.core.shape_tick import SHAPE_POOLS, current_shape
    from tests.k8s.test_role_flip import _endpoints

    cp, ns = control_plane, namespace
    obj = _svc("shaper", decode=1, autoscaling={"enabled": True})
    obj["spec"] |= {"mode": "auto", "roleFlip": True}
    cp.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(obj))
    (p0,) = wait_for(
        lambda: len(r := _ready(_pods(cp, ns, "shaper", "prefill"))) == 1 and r, 120, "1 prefill pod Ready"
    )
    (d0,) = wait_for(
        lambda: len(r := _ready(_pods(cp, ns, "shaper", "decode"))) == 1 and r, 120, "1 decode pod Ready"
    )
    p0, d0 = p0["metadata"]["name"], d0["metadata"]["name"]
    kube = Kube.from_kubeconfig(str(cp.kubeconfig("admin")))
    owner = get_json(cp, "tsvc", "shaper", namespace=ns)
    actuator = KubeActuator(kube, owner, SHAPE_POOLS, lambda ps: {p["metadata"]["name"]: 0.0 for p in ps})
    assert current_shape(actuator.replicas()) == Shape(prefill=1, decode=1)
    reason = (
        "Collapsed: 0 req/s fits 1 colocated worker at TPOT p90 5 ms <= 50 ms; "
        "the split needs 1P+1D at 2 GPUs"
    )
    actuator.reshape(
        ShapeDecision(ShapeAction.collapse, Shape(prefill=1, decode=1), Shape(colocated=1), reason)
    )
    assert get_json(cp, "pod", p0, namespace=ns)["metadata"]["labels"][names.LABEL_ROLE] == "colocated"
    wait_for(
        lambda: (
            p0 in _endpoints(cp, ns, "colocated", "shaper") and not _endpoints(cp, ns, "prefill", "shaper")
        ),
        60,
        "the colocated Service selects the relabelled pod",
    )
    actuator.step_reshape()  # the next tick: no wave left, the decode pod drains
    left = get_json(cp, "pod", d0, namespace=ns)  # kwok may have removed it already
    assert left is None or left["metadata"]["annotations"][DELETION_COST] == "-1000"
    assert get_json(cp, "tpool", "shaper-decode", namespace=ns)["spec"]["replicas"] == 0
    wait_for(lambda: not _pods(cp, ns, "shaper", "decode"), 120, "the decode pod drained and gone")
    actuator.step_reshape()
    assert actuator.reshaping is None  # settled
    assert current_shape(actuator.replicas()) == Shape(colocated=1)
    time.sleep(2)  # the operator's reconcile and autoscaler ticks run meanwhile: the empty home stays empty
    assert get_json(cp, "tpool", "shaper-decode", namespace=ns)["spec"]["replicas"] == 0
    assert [p["metadata"]["name"] for p in _pods(cp, ns, "shaper", "prefill")] == [p0]
    events = get_json(cp, "events", "--field-selector", "involvedObject.name=shaper", namespace=ns)["items"]
    assert any(e["reason"] == "Collapsed" and reason in e["message"] for e in events)
