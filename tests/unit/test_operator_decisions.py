"""Pure operator decisions: drift detection, replica ownership, status conditions."""

import copy

from tandem.operator.manifests import render
from tandem.operator.manifests.drift import is_subset, needs_apply
from tandem.operator.manifests.manifest import with_hash
from tandem.operator.pools import clamp_message, desired_pool_replicas
from tandem.operator.status.service import rolled_out, same_status, service_status
from tandem.spec import InferenceServiceSpec, Mode

SPEC = InferenceServiceSpec.model_validate(
    {
        "model": {"source": {"path": "/m"}, "servedName": "m"},
        "decode": {"replicas": 2, "minReplicas": 1, "maxReplicas": 3},
    }
)


def _live(manifest):
    """What the API server returns: our fields plus defaults."""
    live = copy.deepcopy(manifest)
    live["metadata"]["uid"] = "x"
    live["metadata"]["resourceVersion"] = "7"
    live["spec"]["progressDeadlineSeconds"] = 600
    live["spec"]["template"]["spec"]["containers"][0]["terminationMessagePath"] = "/dev/termination-log"
    live["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["successThreshold"] = 1
    return live


def test_unchanged_child_needs_no_apply():
    m = with_hash(render.worker_deployment(SPEC, "s", "ns", "u", "decode", 2))
    assert not needs_apply(m, _live(m))


def test_missing_edited_or_rerendered_child_needs_apply():
    m = with_hash(render.worker_deployment(SPEC, "s", "ns", "u", "decode", 2))
    assert needs_apply(m, None)
    edited = _live(m)
    edited["spec"]["template"]["spec"]["containers"][0]["image"] = "evil:1"
    assert needs_apply(m, edited)
    fewer = _live(m)
    fewer["spec"]["template"]["spec"]["containers"][0]["args"].pop()
    assert needs_apply(m, fewer)
    other = with_hash(render.worker_deployment(SPEC, "s", "ns", "u", "decode", 3))
    assert needs_apply(other, _live(m))


def test_is_subset_lists_and_dicts():
    assert is_subset({"a": [1, {"b": 2}]}, {"a": [1, {"b": 2, "c": 3}], "d": 4})
    assert not is_subset({"a": [1]}, {"a": [1, 2]})
    assert not is_subset({"a": {"b": 1}}, {"a": {"b": 2}})
    assert is_subset({"a": {}}, {})


def test_pool_replicas_owner_rule():
    # creation: the InferenceService spec gives the initial size
    assert desired_pool_replicas(SPEC, "decode", None) == (2, True)
    # autoscaler off: whatever kubectl scale / HPA set stays, even outside [min, max]
    assert desired_pool_replicas(SPEC, "decode", {"spec": {"replicas": 7}}) == (7, False)
    # autoscaler on: the operator owns the count and clamps it
    auto = SPEC.model_copy(update={"autoscaling": SPEC.autoscaling.model_copy(update={"enabled": True})})
    assert desired_pool_replicas(auto, "decode", {"spec": {"replicas": 7}}) == (3, True)
    assert desired_pool_replicas(auto, "decode", {"spec": {"replicas": 2}}) == (2, False)
    # mode auto: a Deployment is the home of pods of any role; a collapse may empty it (minReplicas is a
    # role's)
    shaped = auto.model_copy(update={"mode": Mode.auto, "role_flip": True})
    assert desired_pool_replicas(shaped, "decode", {"spec": {"replicas": 0}}) == (0, False)
    most = shaped.prefill.max_replicas + shaped.decode.max_replicas
    assert desired_pool_replicas(shaped, "prefill", {"spec": {"replicas": most + 1}}) == (most, True)
    assert "from 0 to both pools' maxReplicas" in clamp_message(shaped, "prefill", most + 1, most)


def _dep(desired, ready, updated=None, gen=1, observed=1, conditions=()):
    return {
        "metadata": {"generation": gen},
        "status": {
            "observedGeneration": observed,
            "replicas": desired,
            "readyReplicas": ready,
            "updatedReplicas": desired if updated is None else updated,
            "conditions": list(conditions),
        },
    }


def _cond(status, t):
    return next(c for c in status["conditions"] if c["type"] == t)


def test_ready_only_when_every_pool_rolled_out():
    desired = {"prefill": 1, "decode": 2, "router": 1}
    deps = {"prefill": _dep(1, 1), "decode": _dep(2, 1), "router": _dep(1, 1)}
    st = service_status(4, deps, desired, {}, "http://e", "T0")
    assert _cond(st, "Ready")["status"] == "False"
    assert "decode 1/2" in _cond(st, "Ready")["message"]
    assert _cond(st, "Progressing")["status"] == "True"
    assert st["observedGeneration"] == 4 and st["pools"]["decode"]["summary"] == "1/2"
    deps["decode"] = _dep(2, 2)
    st2 = service_status(4, deps, desired, st, "http://e", "T1")
    assert _cond(st2, "Ready")["status"] == "True"
    assert _cond(st2, "Ready")["lastTransitionTime"] == "T1"
    assert _cond(st2, "Degraded")["lastTransitionTime"] == "T0"  # unchanged status keeps its time
    st3 = service_status(4, deps, desired, st2, "http://e", "T2")
    assert same_status(st3, st2)


def test_stale_deployment_generation_is_not_rolled_out():
    assert not rolled_out(_dep(1, 1, gen=2, observed=1), 1)
    assert not rolled_out(_dep(1, 1, updated=0), 1)
    assert rolled_out(_dep(1, 1), 1)


def test_degraded_on_progress_deadline_and_foreign_conditions_kept():
    deps = {
        "decode": _dep(
            1,
            0,
            conditions=[{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}],
        )
    }
    prev = {"conditions": [{"type": "SLOMet", "status": "True"}]}
    st = service_status(1, deps, {"decode": 1}, prev, "e", "T")
    assert _cond(st, "Degraded")["status"] == "True"
    assert _cond(st, "Degraded")["reason"] == "ProgressDeadlineExceeded"
    assert _cond(st, "Progressing")["status"] == "False"
    assert _cond(st, "SLOMet")["status"] == "True"


def test_zero_values_the_server_omits_are_equal():
    assert is_subset({"spec": {"publishNotReadyAddresses": False, "x": 0}}, {"spec": {}})
    assert not is_subset({"spec": {"publishNotReadyAddresses": True}}, {"spec": {}})


def test_blocked_rollout_sets_three_consistent_conditions_and_keeps_pools():
    prev = service_status(3, {"decode": _dep(1, 1)}, {"decode": 1}, {}, "e", "T0")
    st = service_status(
        4, {}, {}, prev, "e", "T1", blocked=("ApplyFailed", 'services "x" is forbidden: quota')
    )
    for ctype, status in (("Ready", "False"), ("Progressing", "False"), ("Degraded", "True")):
        c = _cond(st, ctype)
        assert (c["status"], c["reason"], c["observedGeneration"]) == (status, "ApplyFailed", 4)
        assert "forbidden: quota" in c["message"]
    assert st["pools"] == prev["pools"]


def test_api_error_carries_the_servers_reason_and_message():
    from tandem.operator.runtime.kube import ApiError

    e = ApiError(422, '{"kind":"Status","reason":"Invalid","message":"Service \\"a.b-prefill\\" is invalid"}')
    assert (e.status, e.reason, e.message) == (422, "Invalid", 'Service "a.b-prefill" is invalid')
    raw = ApiError(502, "<html>bad gateway</html>")
    assert (raw.reason, raw.message) == ("", "<html>bad gateway</html>")


def test_clamp_message_says_who_owns_the_count_and_the_bounds():
    from tandem.operator.pools import clamp_message

    msg = clamp_message(SPEC, "decode", 7, 3)
    assert msg.startswith("decode: replicas 7 set to 3") and "autoscaler" in msg
    assert "minReplicas 1 and maxReplicas 3" in msg
