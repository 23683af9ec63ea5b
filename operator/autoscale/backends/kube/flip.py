"""Role flips on Kubernetes, as the autoscaler's actuator does them (operator/status/flip.py has the
operator's own, for `tandem flip`): a pod's current role is its `serving.tandem.dev/role` label, which the
operator sets and the worker follows (SetRole, through the downward-API labels file). Deployments select on
the pool label only, so their ReplicaSets never see a flip. Pools count pods by current role; a decision
resizes the home Deployment by what the role's count should become; a pod that flipped is annotated, so a
later step down of its home pool removes it first, and one lent out is removed last. A flip never takes a
pool's last Ready pod: the pods that would empty it are left where they are (autoscale/flip.py `flip_waves`,
as the local backend sequences its flips). Pure, but for `patch_flip`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from tandem import names
from tandem.operator.autoscale.core.flip import Flip, flip_waves
from tandem.operator.autoscale.core.types import Pool
from tandem.operator.status.flip import current_role, is_ready

FLIPPED_AT = "serving.tandem.dev/flipped-at"
Body = dict[str, Any]


def home_of(pod: Body) -> str:
    return ((pod.get("metadata") or {}).get("labels") or {}).get(names.LABEL_POOL, "")


def role_of(pod: Body) -> str:
    """The role a pod serves now: its role label, else its pool's (operator/status/flip.py)."""
    return current_role(pod) or ""


def _live(pods: list[Body]) -> list[Body]:
    return [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]


def by_role(pods: list[Body], pools: tuple[Pool, ...]) -> dict[Pool, list[Body]]:
    return {pool: [p for p in pods if role_of(p) == pool.value] for pool in pools}


def home_replicas(desired: int, pool: Pool, pods: list[Body]) -> int:
    """The home Deployment's replicas that give `pool` `desired` workers by role: less the other pool's pods
    serving it, plus its own pods serving the other."""
    live = _live(pods)
    borrowed = sum(1 for p in live if role_of(p) == pool.value and home_of(p) != pool.value)
    lent = sum(1 for p in live if home_of(p) == pool.value and role_of(p) != pool.value)
    return max(desired - borrowed + lent, 0)


def flip_candidates(pods: list[Body], flip: Flip, running: Mapping[str, float | None]) -> list[str]:
    """The pods to flip: serving `flip.source` and answering; going home first (a flip back), then the
    fewest running sequences (the shortest drain, which the flip's cost counted). Never the last Ready pod of
    `flip.source`: the pods of one flip are relabelled at once, so only those that leave another Ready pod
    serving the source may go (flip_waves' first wave, in that order); a later tick decides again."""
    live = _live(pods)
    serving = [
        p for p in live if role_of(p) == flip.source.value and running.get(p["metadata"]["name"]) is not None
    ]
    serving.sort(
        key=lambda p: (
            home_of(p) != flip.target.value,
            running[p["metadata"]["name"]] or 0.0,
            p["metadata"]["name"],
        )
    )
    roles = {p["metadata"]["name"]: role_of(p) for p in live if is_ready(p)}  # a pod not Ready serves no pool
    waves, _ = flip_waves(roles, dict.fromkeys((p["metadata"]["name"] for p in serving), flip.target.value))
    return waves[0][: flip.count] if waves else []


def flip_patch(target: Pool, at: str) -> Body:
    return {"metadata": {"labels": {names.LABEL_ROLE: target.value}, "annotations": {FLIPPED_AT: at}}}


def flip_aware_costs(costs: Mapping[str, int], pods: list[Body], pool: Pool) -> dict[str, int]:
    """Deletion costs for `pool`'s own pods: a pod lent to the other role goes last (it comes back), one
    that flipped and came back goes first (the pod the flip touched)."""
    named = {p["metadata"]["name"]: p for p in pods}
    low, high = min(costs.values(), default=0) - 1, max(costs.values(), default=0) + 1
    out = {}
    for name, cost in costs.items():
        pod = named.get(name)
        if pod is not None and role_of(pod) != pool.value:
            out[name] = high
        elif pod is not None and FLIPPED_AT in ((pod.get("metadata") or {}).get("annotations") or {}):
            out[name] = low
        else:
            out[name] = cost
    return out


def patch_flip(
    merge_patch: Callable[[str, str, str, Body], object],
    namespace: str,
    pod_names: list[str],
    target: Pool,
    at: str,
) -> None:
    for name in pod_names:
        merge_patch("Pod", namespace, name, flip_patch(target, at))
