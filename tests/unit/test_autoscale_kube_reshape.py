"""A change of shape on Kubernetes, the pure plan: which pods are relabelled to which role in which waves,
which drain, and the replicas of each home Deployment; no side is left without a Ready pod."""

import pytest

from tandem import names
from tandem.operator.autoscale.backends.kube.reshape import (
    DELETION_COST,
    DRAIN_FIRST,
    KubeReshape,
    drain_costs,
    plan_reshape,
)
from tandem.operator.autoscale.core.shape import Shape


def pod(name, home, role=None, ready=True, deleting=False, cost=None):
    labels = {names.LABEL_POOL: home, names.LABEL_ROLE: role or home}
    meta = {
        "name": name,
        "labels": labels,
        "annotations": {DELETION_COST: str(cost)} if cost is not None else {},
    }
    if deleting:
        meta["deletionTimestamp"] = "t"
    status = {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    return {"metadata": meta, "status": status}


P0, P1, D0, D1, D2 = (
    pod("p0", "prefill"),
    pod("p1", "prefill"),
    pod("d0", "decode"),
    pod("d1", "decode"),
    pod("d2", "decode"),
)


@pytest.mark.parametrize(
    ("pods", "target", "running", "expected"),
    [
        # collapse 1P+1D -> 1: the prefill pod flips (a prefill step to drain; the prefill side may empty in
        # mode auto), the decode pod drains; the colocated pod stays in the prefill Deployment
        (
            [P0, D0],
            Shape(colocated=1),
            {},
            KubeReshape(({"p0": "colocated"},), ("d0",), {"prefill": 1, "decode": 0}),
        ),
        # collapse 2P+3D -> 2: the prefill pods flip one wave apiece (the last one empties the prefill side),
        # every decode pod drains
        (
            [P0, P1, D0, D1, D2],
            Shape(colocated=2),
            {},
            KubeReshape(
                ({"p0": "colocated"}, {"p1": "colocated"}), ("d0", "d1", "d2"), {"prefill": 2, "decode": 0}
            ),
        ),
        # collapse 1P+3D -> 2: one decode pod flips too (the emptiest), before the last prefill pod; the
        # other two drain
        (
            [P0, D0, D1, D2],
            Shape(colocated=2),
            {"d0": 4, "d1": 0, "d2": 7},
            KubeReshape(
                ({"d1": "colocated"}, {"p0": "colocated"}), ("d0", "d2"), {"prefill": 1, "decode": 1}
            ),
        ),
        # a starting (not Ready) pod is the one that drains; the Ready ones are kept
        (
            [P0, P1, pod("d0", "decode", ready=False), D1],
            Shape(colocated=1),
            {},
            KubeReshape(({"p0": "colocated"},), ("p1", "d1", "d0"), {"prefill": 1, "decode": 0}),
        ),
        # split 2 colocated (homed in prefill) -> 1P+1D: one flips to decode first (decode side keeps the
        # other), then the other to prefill; nothing starts
        (
            [pod("p0", "prefill", "colocated"), pod("p1", "prefill", "colocated")],
            Shape(prefill=1, decode=1),
            {},
            KubeReshape(({"p1": "decode"}, {"p0": "prefill"}), (), {"prefill": 2, "decode": 0}),
        ),
        # split 1 colocated -> 1P+1D: a decode pod starts in the decode home; the colocated pod, the decode
        # side's only Ready one, waits for it before it flips to prefill
        (
            [pod("p0", "prefill", "colocated")],
            Shape(prefill=1, decode=1),
            {},
            KubeReshape((), (), {"prefill": 1, "decode": 1}, held={"p0": "prefill"}),
        ),
        # ... and once the new decode pod is Ready, it flips
        (
            [pod("p0", "prefill", "colocated"), D0],
            Shape(prefill=1, decode=1),
            {},
            KubeReshape(({"p0": "prefill"},), (), {"prefill": 1, "decode": 1}),
        ),
        # while the new pod starts, the held flip keeps it (and the drain) waiting
        (
            [pod("p0", "prefill", "colocated"), pod("d0", "decode", ready=False)],
            Shape(prefill=1, decode=1),
            {},
            KubeReshape((), (), {"prefill": 1, "decode": 1}, held={"p0": "prefill"}),
        ),
        # a colocated pool of 1 that grows to 2: a pod starts in the decode home (born decode) ...
        (
            [pod("p0", "prefill", "colocated")],
            Shape(colocated=2),
            {},
            KubeReshape((), (), {"prefill": 1, "decode": 1}),
        ),
        # ... and is relabelled colocated while it starts
        (
            [pod("p0", "prefill", "colocated"), pod("d0", "decode", ready=False)],
            Shape(colocated=2),
            {},
            KubeReshape(({"d0": "colocated"},), (), {"prefill": 1, "decode": 1}),
        ),
        # a pod being deleted is gone already; the target holds: nothing to do
        (
            [pod("p0", "prefill", "colocated"), pod("d0", "decode", deleting=True)],
            Shape(colocated=1),
            {},
            KubeReshape((), (), {"prefill": 1, "decode": 0}),
        ),
    ],
    ids=[
        "collapse-1p1d",
        "collapse-2p3d",
        "collapse-1p3d",
        "drain-not-ready",
        "split-warm",
        "split-needs-a-pod",
        "split-pod-ready",
        "split-pod-starting",
        "colocated-grows",
        "colocated-adopts",
        "settled",
    ],
)
def test_reshape_plan(pods, target, running, expected):
    assert plan_reshape(pods, target, running) == expected


def test_a_settled_plan_has_nothing_left():
    assert plan_reshape([pod("p0", "prefill", "colocated")], Shape(colocated=1)).settled
    assert not plan_reshape([P0, D0], Shape(colocated=1)).settled


def test_no_side_is_left_without_a_ready_pod_wave_by_wave():
    """Every wave of every plan leaves a Ready pod on the decode side (decode or colocated), and on the
    prefill side whenever the target keeps prefill pods."""
    cases = [
        ([P0, P1, D0, D1, D2], Shape(colocated=3)),
        (
            [
                pod("a", "prefill", "colocated"),
                pod("b", "decode", "colocated"),
                pod("c", "decode", "colocated"),
            ],
            Shape(prefill=2, decode=1),
        ),
        ([P0, D0, D1], Shape(prefill=2, decode=1)),
    ]
    for pods, target in cases:
        plan = plan_reshape(pods, target)
        roles = {p["metadata"]["name"]: p["metadata"]["labels"][names.LABEL_ROLE] for p in pods}
        for wave in plan.waves:
            leaving = set(wave)
            staying = [r for n, r in roles.items() if n not in leaving]
            assert any(r in ("decode", "colocated") for r in staying), (target, wave)
            if target.prefill and "prefill" in roles.values():
                assert "prefill" in staying, (target, wave)
            roles.update(wave)


def test_the_pods_to_drain_go_first_and_a_pod_no_longer_drained_is_kept():
    pods = [P0, pod("p1", "prefill", cost=DRAIN_FIRST), D0]
    assert drain_costs(pods, ("d0",)) == {"d0": DRAIN_FIRST, "p1": 0}


def test_status_shows_the_shape_now_and_keeps_the_last_change():
    from tandem.operator.autoscale.core.loop import Tick
    from tandem.operator.autoscale.core.report import slo_status
    from tandem.operator.autoscale.core.shape import ShapeAction, ShapeDecision
    from tandem.operator.autoscale.core.types import Pool, Replicas
    from tandem.spec_autoscaling import SloSpec

    slo, at = SloSpec(ttft_ms=500, tpot_ms=50, percentile=90), "2026-01-01T00:00:00Z"
    split = {Pool.colocated: Replicas(0), Pool.prefill: Replicas(1), Pool.decode: Replicas(2, 1)}
    change = ShapeDecision(
        ShapeAction.collapse, Shape(prefill=1, decode=3), Shape(colocated=1), "Collapsed: 0 req/s fits 1"
    )
    shape = slo_status(Tick(1.0, split, shape=change), slo, 60, {}, {}, at)["autoscaling"]["shape"]
    assert shape == {
        "current": "1P+3D",
        "target": "1 colocated",
        "reason": "Collapsed: 0 req/s fits 1",
        "time": at,
    }
    mixed = {Pool.colocated: Replicas(1), Pool.prefill: Replicas(0), Pool.decode: Replicas(1)}
    later = slo_status(
        Tick(2.0, mixed), slo, 60, {}, {"autoscaling": {"shape": shape}}, "2026-01-01T00:01:00Z"
    )
    assert later["autoscaling"]["shape"] == {**shape, "current": "changing"}  # the last change is kept
    fixed = slo_status(Tick(3.0, {Pool.prefill: Replicas(1), Pool.decode: Replicas(1)}), slo, 60, {}, {}, at)
    assert "shape" not in fixed["autoscaling"]  # a fixed shape says nothing of one


def test_a_change_under_way_is_resumed_from_status_after_a_restart():
    from tandem.operator.autoscale.backends.kube.reshape import resumed, shape_of

    for shape in (Shape(colocated=2), Shape(prefill=1, decode=3), Shape(prefill=12, decode=10)):
        assert shape_of(str(shape)) == shape
    assert shape_of("changing") is None and shape_of("xP+1D") is None
    assert resumed({"autoscaling": {"shape": {"current": "changing", "target": "1 colocated"}}}) == Shape(
        colocated=1
    )
    assert resumed({"autoscaling": {"shape": {"current": "1 colocated", "target": "1 colocated"}}}) is None
    assert resumed({}) is None


def test_worker_metrics_are_scraped_where_each_pod_serves_now():
    from tandem.operator.autoscale.backends.kube.pods import metrics_targets

    def running(p, ip):
        return {**p, "status": {"phase": "Running", "podIP": ip}}

    router = {
        "metadata": {"name": "r", "labels": {names.LABEL_POOL: "router"}},
        "status": {"phase": "Running", "podIP": "10.0.0.9"},
    }
    pods = [
        running(pod("p0", "prefill", "colocated"), "10.0.0.1"),
        running(pod("d0", "decode"), "10.0.0.2"),
        router,
    ]
    port = names.METRICS_PORT
    assert metrics_targets(pods) == {
        "colocated": [f"http://10.0.0.1:{port}/metrics"],
        "decode": [f"http://10.0.0.2:{port}/metrics"],
        "router": [f"http://10.0.0.9:{port}/metrics"],
    }
