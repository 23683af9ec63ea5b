"""The reconcile's decisions on hand-built views of the world: what `plan` writes and what `report` says."""

import copy
from dataclasses import replace

from tandem.operator.manifests import render
from tandem.operator.plan import POD_RECHECK_SECONDS, Observed, Plan, Rollout, child_keys, plan, report
from tandem.operator.status.preflight import Findings
from tandem.spec import InferenceServiceSpec

NAME, NS, UID = "s", "ns", "u1"
NOW = "2026-01-01T00:00:00Z"
SPEC = InferenceServiceSpec.model_validate(
    {
        "model": {"source": {"path": "/m"}, "servedName": "m"},
        "prefill": {"replicas": 1},
        "decode": {"replicas": 2, "minReplicas": 1, "maxReplicas": 3},
    }
)


def _spec(**fields):
    return InferenceServiceSpec.model_validate(
        {**SPEC.model_dump(by_alias=True, exclude_unset=True), **fields}
    )


def _first_look(spec=SPEC, **over) -> Observed:
    """A never-reconciled InferenceService: nothing of it exists yet."""
    fields = dict(
        pools={p: None for p in render.worker_pools(spec)},
        children={k: None for k in child_keys(spec, NAME, NS, UID)},
        labelled={},
        tls_issued=False,
    )
    return Observed(NAME, NS, UID, 1, {}, Findings(), **{**fields, **over})


def _as_served(body, generation=1):
    """What the API server answers for a body it stored: ours plus its own fields, the rollout done."""
    live = copy.deepcopy(body)
    live["metadata"] |= {"uid": "x", "resourceVersion": "7", "generation": generation}
    if live["kind"] == "Deployment":
        live["spec"]["progressDeadlineSeconds"] = 600
        n = live["spec"]["replicas"]
        live["status"] = {
            "observedGeneration": generation,
            "replicas": n,
            "updatedReplicas": n,
            "readyReplicas": n,
            "availableReplicas": n,
        }
    return live


def _world_after(p: Plan) -> tuple[dict, dict]:
    """The pools and children that the plan's writes leave behind."""
    pools = {s.pool: _as_served(s.create) for s in p.pools}
    children = {(m["kind"], m["metadata"]["name"]): _as_served(m) for m in p.apply}
    return pools, children


def test_the_first_reconcile_creates_every_pool_and_child_and_deletes_nothing():
    p = plan(SPEC, _first_look())
    assert p.blocked is None and p.tls_secret
    assert [(s.pool, s.replicas, s.create is not None) for s in p.pools] == [
        ("prefill", 1, True),
        ("decode", 2, True),
    ]
    assert [(m["kind"], m["metadata"]["name"]) for m in p.apply] == child_keys(SPEC, NAME, NS, UID)
    assert p.delete == ()
    assert p.replicas == {"prefill": 1, "decode": 2}


def test_a_second_look_at_what_the_writes_left_plans_and_reports_nothing():
    first = plan(SPEC, _first_look())
    pools, children = _world_after(first)
    done = report(
        SPEC, _first_look(), first, Rollout(pools, children), ["create TandemPool/s-decode"], [], NOW
    )
    assert done.ready and done.status is not None
    assert ("Ready", "all pools ready", "Normal") in done.events
    assert ("Reconciled", "create TandemPool/s-decode", "Normal") in done.events
    # the next look: everything in place, the status as written, the TandemPools' statuses as written
    pools = {p: {**body, "status": done.pool_status[body["metadata"]["name"]]} for p, body in pools.items()}
    again = Observed(
        NAME,
        NS,
        UID,
        1,
        done.status,
        Findings(),
        pools=pools,
        children=children,
        labelled=None,
        tls_issued=True,
    )
    p = plan(SPEC, again)
    assert p.empty and p.blocked is None
    quiet = report(SPEC, again, p, Rollout(pools, children), [], [], NOW)
    assert (quiet.status, quiet.pool_status, quiet.events, quiet.recheck_after) == (None, {}, (), None)


def test_an_edited_child_is_applied_again_and_only_it():
    first = plan(SPEC, _first_look())
    pools, children = _world_after(first)
    edited = ("Deployment", "s-decode")
    children[edited]["spec"]["template"]["spec"]["containers"][0]["image"] = "evil:1"
    p = plan(
        SPEC, Observed(NAME, NS, UID, 1, {}, Findings(), pools=pools, children=children, tls_issued=True)
    )
    assert [(m["kind"], m["metadata"]["name"]) for m in p.apply] == [edited]
    assert not p.tls_secret and all(not (s.create or s.apply or s.scale) for s in p.pools)


def test_switching_to_colocated_deletes_the_children_of_the_pool_it_no_longer_has():
    disagg = plan(SPEC, _first_look())
    pools, children = _world_after(disagg)
    labelled = {}
    for (kind, _), body in children.items():
        labelled.setdefault(kind, []).append(body)
    labelled["TandemPool"] = list(pools.values())
    colocated = _spec(mode="colocated")
    seen = Observed(
        NAME,
        NS,
        UID,
        2,
        {"observedGeneration": 1},
        Findings(),
        pools={"colocated": None},
        children={k: children.get(k) for k in child_keys(colocated, NAME, NS, UID)},
        labelled=labelled,
        tls_issued=True,
    )
    p = plan(colocated, seen)
    assert set(p.delete) == {
        (kind, f"s-{pool}")
        for pool in ("prefill", "decode")
        for kind in ("Deployment", "Service", "PodDisruptionBudget", "NetworkPolicy", "TandemPool")
    }
    assert [s.pool for s in p.pools] == ["colocated"] and p.pools[0].create is not None
    # someone else's object under our label is not ours to delete
    labelled["Service"].append({"metadata": {"name": "theirs", "ownerReferences": []}})
    assert ("Service", "theirs") not in plan(colocated, seen).delete
    # the same generation as last time: nothing was listed, nothing is deleted
    unchanged = Observed(
        NAME,
        NS,
        UID,
        2,
        {"observedGeneration": 2},
        Findings(),
        pools={"colocated": None},
        children=seen.children,
        labelled=None,
        tls_issued=True,
    )
    assert plan(colocated, unchanged).delete == ()


def test_replicas_out_of_bounds_are_clamped_with_an_event():
    auto = _spec(autoscaling={"enabled": True})
    first = plan(auto, _first_look(auto))
    pools, children = _world_after(first)
    pools["decode"]["spec"]["replicas"] = 9  # someone scaled past maxReplicas 3
    p = plan(
        auto, Observed(NAME, NS, UID, 1, {}, Findings(), pools=pools, children=children, tls_issued=True)
    )
    decode = next(s for s in p.pools if s.pool == "decode")
    assert (decode.scale, decode.replicas) == (True, 3)
    assert decode.clamped and "replicas 9 set to 3" in decode.clamped
    assert p.replicas["decode"] == 3
    assert [m["spec"]["replicas"] for m in p.apply if m["metadata"]["name"] == "s-decode"] == [3]
    # the decode Deployment has 2 of the 3 pods it now asks for: its pods were read, none has trouble yet
    done = report(
        auto,
        _first_look(auto),
        p,
        Rollout(pools, children, pods={"decode": []}),
        ["scale TandemPool/s-decode=3"],
        [decode.clamped],
        NOW,
    )
    assert ("ReplicasClamped", decode.clamped, "Warning") in done.events
    assert not done.ready and done.recheck_after == POD_RECHECK_SECONDS


def test_with_the_autoscaler_off_a_scaled_pool_keeps_its_count():
    first = plan(SPEC, _first_look())
    pools, children = _world_after(first)
    pools["decode"]["spec"]["replicas"] = 9
    p = plan(
        SPEC, Observed(NAME, NS, UID, 1, {}, Findings(), pools=pools, children=children, tls_issued=True)
    )
    assert not any(s.scale for s in p.pools) and p.replicas["decode"] == 9


def test_a_name_owned_by_someone_else_blocks_and_writes_no_child():
    theirs = {
        "kind": "Deployment",
        "metadata": {"name": "s-decode", "labels": {"team": "theirs"}},
        "spec": {},
    }
    look = _first_look()
    p = plan(SPEC, replace(look, children={**look.children, ("Deployment", "s-decode"): theirs}))
    assert p.blocked == (
        "NameInUse",
        "Deployment/s-decode already exists and is not owned by this "
        "InferenceService; rename it or remove them",
    )
    assert p.apply == () and p.delete == ()
    pool = {
        "kind": "TandemPool",
        "metadata": {"name": "s-prefill", "ownerReferences": [{"uid": "other"}]},
        "spec": {"replicas": 1},
    }
    p = plan(SPEC, replace(look, pools={**look.pools, "prefill": pool}))
    assert p.blocked == (
        "NameInUse",
        "TandemPool/s-prefill already exists and is not owned by this "
        "InferenceService; rename it or remove it",
    )
    assert p.apply == () and [s.pool for s in p.pools] == ["decode"]


def test_a_blocking_preflight_finding_writes_nothing():
    cause = ("ModelSourceNotFound", "PersistentVolumeClaim m does not exist")
    p = plan(SPEC, Observed(NAME, NS, UID, 1, {}, Findings(blocked=cause)))
    assert p.blocked == cause and p.empty


def test_a_router_exposed_without_api_keys_is_warned_of_once():
    first = plan(SPEC, _first_look())
    pools, children = _world_after(first)
    labels = children[("Deployment", "s-router")]["spec"]["template"]["metadata"]["labels"]
    lb = {"metadata": {"name": "public"}, "spec": {"type": "LoadBalancer", "selector": labels}}
    listed = replace(_first_look(), services=[lb])
    warned = report(SPEC, listed, first, Rollout(pools, children), [], [], NOW)
    assert warned.exposed == ("Service public (LoadBalancer)",)
    assert [e for e in warned.events if e[0] == "ExposedWithoutAPIKeys"] == [
        ("ExposedWithoutAPIKeys", warned.warning, "Warning")
    ]
    # the next look, not listed again: what was found is remembered, and the warning already given
    again = replace(_first_look(), exposed=warned.exposed, warned=warned.warning)
    quiet = report(SPEC, again, first, Rollout(pools, children), [], [], NOW)
    assert quiet.warning == warned.warning and not [
        e for e in quiet.events if e[0] == "ExposedWithoutAPIKeys"
    ]
