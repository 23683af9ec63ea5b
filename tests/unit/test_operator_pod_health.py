"""Why a pool's pods do not run, read from pod status the way the kubelet and scheduler write it."""

from tandem.operator.status.pod_health import pod_problems
from tandem.operator.status.service import service_status


def _pod(name, conditions=(), containers=(), init=(), deleting=False):
    meta = {"name": name, **({"deletionTimestamp": "T"} if deleting else {})}
    return {
        "metadata": meta,
        "status": {
            "conditions": list(conditions),
            "containerStatuses": list(containers),
            "initContainerStatuses": list(init),
        },
    }


UNSCHEDULABLE = {
    "type": "PodScheduled",
    "status": "False",
    "reason": "Unschedulable",
    "message": '0/3 nodes are available: persistentvolumeclaim "models" not found.\n preemption: ...',
}


def test_unschedulable_pods_fold_into_one_problem_with_a_count():
    pods = [
        _pod("s-decode-a", [UNSCHEDULABLE]),
        _pod("s-decode-b", [UNSCHEDULABLE]),
        _pod("s-decode-old", [UNSCHEDULABLE], deleting=True),
    ]
    ((reason, message),) = pod_problems(pods)
    assert reason == "Unschedulable"
    assert message.startswith("2 pods (e.g. s-decode-a): Unschedulable: 0/3 nodes are available")
    assert 'persistentvolumeclaim "models" not found' in message and "\n" not in message


def test_image_pull_and_crash_loop_name_the_container_and_the_exit():
    pull = {
        "name": "worker",
        "state": {
            "waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "tandem-worker:9"'}
        },
    }
    crash = {
        "name": "fetch-model",
        "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}},
        "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}},
    }
    problems = dict(pod_problems([_pod("p1", containers=[pull]), _pod("p2", init=[crash])]))
    assert (
        problems["ImagePullBackOff"]
        == 'pod p1: ImagePullBackOff: container worker: Back-off pulling image "tandem-worker:9"'
    )
    assert (
        "container fetch-model: last exit code 137 (OOMKilled) back-off 40s" in problems["CrashLoopBackOff"]
    )


def test_starting_pods_are_no_problem():
    creating = {"name": "worker", "state": {"waiting": {"reason": "ContainerCreating"}}}
    scheduled = {"type": "PodScheduled", "status": "True"}
    assert pod_problems([_pod("p", [scheduled], [creating])]) == []


def _dep(desired, ready, conditions=()):
    return {
        "metadata": {"generation": 1},
        "status": {
            "observedGeneration": 1,
            "replicas": desired,
            "readyReplicas": ready,
            "updatedReplicas": desired,
            "conditions": list(conditions),
        },
    }


def _cond(status, ctype):
    return next(c for c in status["conditions"] if c["type"] == ctype)


def test_pod_problems_degrade_at_once_and_the_three_conditions_agree():
    deps = {"decode": _dep(2, 0), "router": _dep(1, 1)}
    problems = {"decode": pod_problems([_pod("s-decode-a", [UNSCHEDULABLE])])}
    st = service_status(2, deps, {"decode": 2, "router": 1}, {}, "e", "T", pod_problems=problems)
    for ctype, status in (("Ready", "False"), ("Progressing", "False"), ("Degraded", "True")):
        c = _cond(st, ctype)
        assert (c["status"], c["reason"]) == (status, "Unschedulable"), c
        assert 'persistentvolumeclaim "models" not found' in c["message"]
    assert _cond(st, "Ready")["message"].startswith("waiting for decode 0/2: decode: pod s-decode-a")


def test_replica_failure_carries_the_deployments_message():
    refused = {
        "type": "ReplicaFailure",
        "status": "True",
        "reason": "FailedCreate",
        "message": 'pods "s-decode-x" is forbidden: exceeded quota: gpus',
    }
    st = service_status(1, {"decode": _dep(1, 0, [refused])}, {"decode": 1}, {}, "e", "T")
    assert _cond(st, "Degraded")["reason"] == "ReplicaFailure"
    assert "exceeded quota: gpus" in _cond(st, "Degraded")["message"]
    assert _cond(st, "Progressing")["reason"] == "ReplicaFailure"


def test_a_pool_scaled_to_zero_is_not_ready_and_not_degraded():
    deps = {"prefill": _dep(1, 1), "decode": _dep(0, 0), "router": _dep(1, 1)}
    st = service_status(1, deps, {"prefill": 1, "decode": 0, "router": 1}, {}, "e", "T")
    assert (_cond(st, "Ready")["status"], _cond(st, "Ready")["reason"]) == ("False", "NoReplicas")
    assert "decode scaled to 0" in _cond(st, "Ready")["message"]
    assert _cond(st, "Degraded")["status"] == "False" and _cond(st, "Progressing")["status"] == "False"


def test_a_pool_at_zero_that_the_autoscaler_wakes_is_ready_resting():
    deps = {"prefill": _dep(0, 0), "decode": _dep(0, 0), "router": _dep(1, 1)}
    st = service_status(
        1, deps, {"prefill": 0, "decode": 0, "router": 1}, {}, "e", "T", wakes={"prefill", "decode"}
    )
    ready = _cond(st, "Ready")
    assert (ready["status"], ready["reason"]) == ("True", "ScaledToZero") and "prefill, decode" in ready[
        "message"
    ]
    st = service_status(1, deps, {"prefill": 0, "decode": 0, "router": 1}, {}, "e", "T", wakes={"decode"})
    assert (_cond(st, "Ready")["status"], _cond(st, "Ready")["reason"]) == (
        "False",
        "NoReplicas",
    )  # prefill cannot wake
