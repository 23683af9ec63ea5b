"""Pure status computation: live Deployments in, InferenceService and InferencePool status out."""

from __future__ import annotations

from typing import Any

Body = dict[str, Any]


def rolled_out(dep: Body | None, desired: int) -> bool:
    """The Deployment runs `desired` ready pods of its current template and nothing else."""
    if dep is None:
        return False
    st = dep.get("status") or {}
    if st.get("observedGeneration", 0) < dep["metadata"].get("generation", 1):
        return False
    return (st.get("updatedReplicas", 0) == desired and st.get("readyReplicas", 0) >= desired
            and st.get("replicas", 0) == desired)


def failure(dep: Body | None) -> str | None:
    """A reason string when a Deployment reports it cannot progress."""
    for c in ((dep or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == "Progressing" and c.get("reason") == "ProgressDeadlineExceeded":
            return "ProgressDeadlineExceeded"
        if c.get("type") == "ReplicaFailure" and c.get("status") == "True":
            return "ReplicaFailure"
    return None


def pool_status(dep: Body | None, desired: int) -> dict[str, Any]:
    st = (dep or {}).get("status") or {}
    ready = st.get("readyReplicas", 0)
    return {
        "desiredReplicas": desired,
        "readyReplicas": ready,
        "updatedReplicas": st.get("updatedReplicas", 0),
        "summary": f"{ready}/{desired}",
    }


def inference_pool_status(dep: Body | None, selector: str, generation: int) -> dict[str, Any]:
    st = (dep or {}).get("status") or {}
    return {
        "replicas": st.get("replicas", 0),
        "readyReplicas": st.get("readyReplicas", 0),
        "updatedReplicas": st.get("updatedReplicas", 0),
        "selector": selector,
        "observedGeneration": generation,
    }


def _condition(ctype: str, ok: bool, reason: str, message: str, generation: int,
               previous: dict[str, Body], now: str) -> Body:
    status = "True" if ok else "False"
    old = previous.get(ctype) or {}
    changed = old.get("status") != status
    return {
        "type": ctype,
        "status": status,
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
        "lastTransitionTime": now if changed else old.get("lastTransitionTime", now),
    }


def service_status(generation: int, deployments: dict[str, Body | None], desired: dict[str, int],
                   previous: Body, endpoint: str, now: str, blocked: tuple[str, str] | None = None) -> Body:
    """Conditions (Ready, Progressing, Degraded), per-pool replicas and the router endpoint.

    `deployments` and `desired` are keyed by pool (including the router). `blocked` is (reason, message)
    when the spec cannot be rolled out: it could not be rendered (InvalidSpec) or the API server refused a
    child (ApplyFailed). lastTransitionTime only moves when a condition's status flips.
    """
    prev = {c["type"]: c for c in previous.get("conditions") or []}
    if blocked:
        reason, message = blocked
        conds = [
            _condition("Ready", False, reason, message, generation, prev, now),
            _condition("Progressing", False, reason, message, generation, prev, now),
            _condition("Degraded", True, reason, message, generation, prev, now),
        ]
        return {"observedGeneration": generation, "conditions": _keep_foreign(conds, prev),
                "pools": previous.get("pools") or {}, "routerEndpoint": endpoint}
    pools = {p: pool_status(deployments.get(p), n) for p, n in desired.items()}
    waiting = [f"{p} {s['summary']}" for p, s in pools.items() if not rolled_out(deployments.get(p), desired[p])]
    failures = {p: r for p in desired if (r := failure(deployments.get(p)))}
    ready = not waiting
    conds = [
        _condition("Ready", ready, "AllPoolsReady" if ready else "PoolsNotReady",
                   "all pools ready" if ready else "waiting for " + ", ".join(waiting), generation, prev, now),
        _condition("Progressing", not ready and not failures, "RollingOut" if not ready else "RolloutComplete",
                   "rolling out " + ", ".join(waiting) if waiting else "every pool runs the current spec",
                   generation, prev, now),
        _condition("Degraded", bool(failures), next(iter(failures.values()), "AsExpected"),
                   ", ".join(f"{p}: {r}" for p, r in failures.items()) or "no pool reports a failure",
                   generation, prev, now),
    ]
    return {"observedGeneration": generation, "conditions": _keep_foreign(conds, prev), "pools": pools,
            "routerEndpoint": endpoint}


def _keep_foreign(ours: list[Body], previous: dict[str, Body]) -> list[Body]:
    """Conditions other writers own (for example SLOMet from the autoscaler) stay as they are."""
    mine = {c["type"] for c in ours}
    return ours + [c for t, c in previous.items() if t not in mine]


def same_status(wanted: Body, live: Body) -> bool:
    """True when patching `wanted` over `live` would change nothing."""
    return all(live.get(k) == v for k, v in wanted.items())
