"""Role flips on Kubernetes, the pure parts: pods counted by the role they serve, the home Deployment's
replicas for a count by role, which pods flip (never a pool's last Ready pod), and the deletion costs around
a flip."""

import pytest

from tandem import names
from tandem.operator.autoscale.backends.kube.flip import (
    FLIPPED_AT,
    by_role,
    flip_aware_costs,
    flip_candidates,
    flip_patch,
    home_replicas,
)
from tandem.operator.autoscale.core.flip import Flip
from tandem.operator.autoscale.core.types import Pool


def pod(name, pool, role=None, deleting=False, flipped=False, ready=False):
    labels = {names.LABEL_POOL: pool, **({names.LABEL_ROLE: role} if role else {})}
    meta = {"name": name, "labels": labels, "annotations": {FLIPPED_AT: "t"} if flipped else {}}
    if deleting:
        meta["deletionTimestamp"] = "t"
    return {"metadata": meta, "status": {"conditions": [{"type": "Ready", "status": str(ready)}]}}


PODS = [
    pod("p0", "prefill"),
    pod("d0", "decode"),
    pod("d1", "decode", role="prefill", flipped=True),  # lent to prefill
    pod("d2", "decode", role="decode"),
]


def test_pools_count_pods_by_the_role_they_serve_now():
    roles = by_role(PODS, (Pool.prefill, Pool.decode))
    assert [p["metadata"]["name"] for p in roles[Pool.prefill]] == ["p0", "d1"]
    assert [p["metadata"]["name"] for p in roles[Pool.decode]] == ["d0", "d2"]


def test_a_count_by_role_resizes_the_home_deployment_by_the_difference():
    # prefill serves on 2 (its own p0 + decode's d1): 3 by role is 2 prefill pods of its own
    assert home_replicas(3, Pool.prefill, PODS) == 2
    # decode serves on 2 of its 3 pods: 2 by role keeps all 3 (d1 comes back)
    assert home_replicas(2, Pool.decode, PODS) == 3
    no_flips = [pod("p0", "prefill"), pod("d0", "decode")]
    assert home_replicas(4, Pool.prefill, no_flips) == 4  # without flips: the count itself
    assert home_replicas(2, Pool.prefill, [*PODS, pod("d3", "decode", role="prefill", deleting=True)]) == 1


def test_a_flip_back_takes_the_lent_pod_first_then_the_emptiest():
    back = Flip(Pool.prefill, Pool.decode, 1, "FlippedBack: ...", "FlippedBack")
    assert flip_candidates(PODS, back, {"p0": 0, "d1": 9}) == ["d1"]  # home first, though busier
    out = Flip(Pool.decode, Pool.prefill, 1, "FlippedToPrefill: ...", "FlippedToPrefill")
    assert flip_candidates(PODS, out, {"d0": 5, "d2": 1}) == ["d2"]
    assert flip_candidates(PODS, out, {"d0": 5, "d2": None}) == ["d0"]  # one that does not answer stays
    assert flip_patch(Pool.prefill, "t1") == {
        "metadata": {"labels": {names.LABEL_ROLE: "prefill"}, "annotations": {FLIPPED_AT: "t1"}}
    }


def test_deletion_costs_keep_a_lent_pod_and_remove_a_flipped_one_first():
    decode_pods = [
        pod("d0", "decode"),
        pod("d1", "decode", role="prefill", flipped=True),
        pod("d2", "decode", role="decode", flipped=True),
    ]
    costs = flip_aware_costs({"d0": 3, "d1": 0, "d2": 7}, decode_pods, Pool.decode)
    assert min(costs, key=costs.__getitem__) == "d2"  # flipped and back: the pod the flip touched goes first
    assert max(costs, key=costs.__getitem__) == "d1"  # lent out: it comes back, so it goes last
    assert costs["d0"] == 3


def ready(*specs):
    """Ready pods from (name, pool[, role]) tuples."""
    return [pod(*spec, ready=True) for spec in specs]


TO_DECODE = Flip(Pool.prefill, Pool.decode, 2, "FlippedToDecode: ...", "FlippedToDecode")
TO_PREFILL = Flip(Pool.decode, Pool.prefill, 1, "FlippedToPrefill: ...", "FlippedToPrefill")


@pytest.mark.parametrize(
    ("pods", "flip", "running", "chosen"),
    [
        # two of three prefill pods may go: one stays
        (
            ready(("p0", "prefill"), ("p1", "prefill"), ("p2", "prefill"), ("d0", "decode")),
            TO_DECODE,
            {"p0": 3, "p1": 0, "p2": 1},
            ["p1", "p2"],
        ),
        # two asked of two: the busier one stays, prefill keeps its last Ready pod
        (
            ready(("p0", "prefill"), ("p1", "prefill"), ("d0", "decode")),
            TO_DECODE,
            {"p0": 3, "p1": 0},
            ["p1"],
        ),
        # the only decode pod serving (d1 is lent to prefill) is never flipped away
        (ready(("p0", "prefill"), ("d0", "decode"), ("d1", "decode", "prefill")), TO_PREFILL, {"d0": 0}, []),
        # a second decode pod that is not Ready serves nothing: d0 is still the last, it stays
        (
            [*ready(("p0", "prefill"), ("d0", "decode")), pod("d1", "decode")],
            TO_PREFILL,
            {"d0": 0, "d1": None},
            [],
        ),
        # ... and one being deleted does not count either
        (
            [*ready(("p0", "prefill"), ("d0", "decode")), pod("d1", "decode", deleting=True, ready=True)],
            TO_PREFILL,
            {"d0": 0},
            [],
        ),
        # a pod that answers but is not Ready yet leaves no pool short: it may flip
        (
            [*ready(("p0", "prefill"), ("d0", "decode")), pod("d1", "decode")],
            TO_PREFILL,
            {"d0": 0, "d1": 0},
            ["d1"],
        ),
        # a flip back: the lent pod goes home while its borrower keeps its own Ready pod
        (
            ready(("p0", "prefill"), ("d0", "decode"), ("d1", "decode", "prefill")),
            Flip(Pool.prefill, Pool.decode, 1, "FlippedBack: ...", "FlippedBack"),
            {"p0": 0, "d1": 4},
            ["d1"],
        ),
    ],
)
def test_a_flip_never_takes_the_last_ready_pod_of_its_source_pool(pods, flip, running, chosen):
    assert flip_candidates(pods, flip, running) == chosen
