"""Pure status computation: live Deployments in, InferenceService and TandemPool status out."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from tandem import names

Body = dict[str, Any]


def rolled_out(dep: Body | None, desired: int) -> bool:
    """The Deployment runs `desired` ready pods of its current template and nothing else."""
    if dep is None:
        return False
    st = dep.get("status") or {}
    if st.get("observedGeneration", 0) < dep["metadata"].get("generation", 1):
        return False
    return (
        st.get("updatedReplicas", 0) == desired
        and st.get("readyReplicas", 0) >= desired
        and st.get("replicas", 0) == desired
    )


def failure(dep: Body | None) -> tuple[str, str] | None:
    """(reason, the Deployment's message) when a Deployment reports it cannot progress."""
    for c in ((dep or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == "ReplicaFailure" and c.get("status") == "True":
            return "ReplicaFailure", c.get("message") or "pods cannot be created"
    for c in ((dep or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == "Progressing" and c.get("reason") == "ProgressDeadlineExceeded":
            return "ProgressDeadlineExceeded", c.get("message") or "the rollout made no progress"
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


def _condition(
    ctype: str, ok: bool, reason: str, message: str, generation: int, previous: dict[str, Body], now: str
) -> Body:
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


def service_status(
    generation: int,
    deployments: dict[str, Body | None],
    desired: dict[str, int],
    previous: Body,
    endpoint: str,
    now: str,
    blocked: tuple[str, str] | None = None,
    pod_problems: dict[str, list[tuple[str, str]]] | None = None,
    tls: bool | None = None,
    serving: dict[str, int] | None = None,
    wakes: Collection[str] = (),
) -> Body:
    """Conditions (Ready, Progressing, Degraded), per-pool replicas and the router endpoint.

    `deployments` and `desired` are keyed by pool (including the router). `blocked` is (reason, message) when
    the spec cannot be rolled out: it could not be rendered (InvalidSpec) or the API server refused a child
    (ApplyFailed). `pod_problems` (pool -> (reason, message), see pod_health.py) are why a pool's pods do not
    run. A pool with no replicas cannot serve, so it is not Ready, unless it is in `wakes` (autoscaled with
    minReplicas 0: the router holds its requests and the autoscaler starts its first worker). The three
    conditions tell one story: while something is failing, Progressing is False with the same reason as
    Degraded. With `tls` given, Encrypted says whether the gRPC hops use mutual TLS (False, reason TLSOff,
    when the spec turned it off). `serving` (spec.roleFlip): Ready pods by current role, which the pool counts
    show. lastTransitionTime only moves when a condition's status flips.
    """
    prev = {c["type"]: c for c in previous.get("conditions") or []}
    if blocked:
        reason, message = blocked
        conds = [
            _condition("Ready", False, reason, message, generation, prev, now),
            _condition("Progressing", False, reason, message, generation, prev, now),
            _condition("Degraded", True, reason, message, generation, prev, now),
        ]
        return {
            "observedGeneration": generation,
            "conditions": _keep_foreign(conds, prev),
            "pools": previous.get("pools") or {},
            "routerEndpoint": endpoint,
            "workers": previous.get("workers") or "",
        }
    pools = {p: pool_status(deployments.get(p), n) for p, n in desired.items()}
    for p, n in (serving or {}).items():  # spec.roleFlip: a pool counts the pods that serve its role now
        if p in pools:
            pools[p] = {**pools[p], "servingReplicas": n, "summary": f"{n}/{pools[p]['desiredReplicas']}"}
    waiting = [p for p in pools if not rolled_out(deployments.get(p), desired[p])]
    failures: dict[str, list[tuple[str, str]]] = {}
    for p in waiting:
        found = list((pod_problems or {}).get(p) or [])
        if (f := failure(deployments.get(p))) and not any(r == f[0] for r, _ in found):
            found.append(f)
        if found:
            failures[p] = found
    empty = [p for p, n in desired.items() if n == 0 and p not in wakes]
    resting = [p for p, n in desired.items() if n == 0 and p in wakes]
    why = "; ".join(f"{p}: {m}" for p, found in failures.items() for _, m in found)
    reason = next((found[0][0] for found in failures.values()), "")
    summary = ", ".join(f"{p} {pools[p]['summary']}" for p in waiting)
    if failures:
        ready_c = (False, reason, f"waiting for {summary}: {why}")
        progressing = (False, reason, why)
    elif waiting:
        ready_c = (False, "PoolsNotReady", f"waiting for {summary}")
        progressing = (True, "RollingOut", f"rolling out {summary}")
    elif empty:
        ready_c = (False, "NoReplicas", f"{', '.join(empty)} scaled to 0 replicas: nothing serves requests")
        progressing = (False, "RolloutComplete", "every pool runs the current spec")
    elif resting:
        ready_c = (
            True,
            "ScaledToZero",
            f"{', '.join(resting)} at 0 replicas: requests wait in the router while the "
            "autoscaler starts the first worker",
        )
        progressing = (False, "RolloutComplete", "every pool runs the current spec")
    else:
        ready_c = (True, "AllPoolsReady", "all pools ready")
        progressing = (False, "RolloutComplete", "every pool runs the current spec")
    conds = [
        _condition("Ready", *ready_c, generation, prev, now),
        _condition("Progressing", *progressing, generation, prev, now),
        _condition(
            "Degraded",
            bool(failures),
            reason or "AsExpected",
            why or "no pool reports a failure",
            generation,
            prev,
            now,
        ),
    ]
    if tls is not None:
        conds.append(_condition("Encrypted", *encrypted_condition(tls), generation, prev, now))
    return {
        "observedGeneration": generation,
        "conditions": _keep_foreign(conds, prev),
        "pools": pools,
        "routerEndpoint": endpoint,
        "workers": workers_summary(pools),
    }


def with_degraded(
    status: Body, previous: Body, cause: tuple[str, str] | None, generation: int, now: str
) -> Body:
    """`status` with Degraded True for `cause` (reason, message), a fault the service serves through (the
    model's own context limit below the spec's), unless a failure holds Degraded already; Ready and
    Progressing stay as they are."""
    conditions = status.get("conditions") or []
    if cause is None or any(c["type"] == "Degraded" and c["status"] == "True" for c in conditions):
        return status
    prev = {c["type"]: c for c in previous.get("conditions") or []}
    degraded = _condition("Degraded", True, *cause, generation, prev, now)
    return {**status, "conditions": [degraded if c["type"] == "Degraded" else c for c in conditions]}


def workers_summary(pools: dict[str, Body]) -> str:
    """One printer column for both modes: `prefill 1/1 decode 2/2`, or `colocated 2/2`."""
    return " ".join(f"{p} {s['summary']}" for p, s in pools.items() if p != names.POOL_ROUTER)


def encrypted_condition(tls: bool) -> tuple[bool, str, str]:
    if tls:
        return True, "MutualTLS", "every gRPC hop uses mutual TLS with per-role certificates"
    return (
        False,
        "TLSOff",
        (
            "security.tls is off: gRPC between router and workers is plaintext and unauthenticated; "
            "any pod that reaches a worker port can call it"
        ),
    )


OWN_CONDITIONS = (
    "Ready",
    "Progressing",
    "Degraded",
    "Encrypted",
    "ModelCached",
)  # the reconciler's; SLOMet is the autoscaler's


def rebase(status: Body, previous: Body) -> Body:
    """`status` as the reconciler built it, with the other writers' conditions taken from `previous` (a
    fresher read) instead of the read it was built on."""
    ours = [c for c in status.get("conditions") or [] if c["type"] in OWN_CONDITIONS]
    return {
        **status,
        "conditions": _keep_foreign(ours, {c["type"]: c for c in previous.get("conditions") or []}),
    }


def _keep_foreign(ours: list[Body], previous: dict[str, Body]) -> list[Body]:
    """Conditions other writers own (for example SLOMet from the autoscaler) stay as they are."""
    mine = {c["type"] for c in ours}
    return ours + [c for t, c in previous.items() if t not in mine]


def same_status(wanted: Body, live: Body) -> bool:
    """True when patching `wanted` over `live` would change nothing."""
    return all(live.get(k) == v for k, v in wanted.items())
