"""The Kubernetes actuator: a pool's replicas from its pods, and a decision written to the pool's
TandemPool (the one writer while autoscaling is on). Before a pool shrinks, each pod's
`controller.kubernetes.io/pod-deletion-cost` is set from its running sequences, so the ReplicaSet
removes the emptiest pod, which then drains (preStop) before it exits. Pools count pods by the role they
serve now, and a flip relabels pods (flip.py). In mode auto a change of shape, and a resize of the colocated
pool, is carried out a step per tick from the plan reshape.py makes of the pods as they are."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Mapping
from typing import Any

from tandem import names
from tandem.operator.autoscale.backends.kube.flip import (
    by_role,
    flip_aware_costs,
    flip_candidates,
    flip_patch,
    home_of,
    home_replicas,
    patch_flip,
)
from tandem.operator.autoscale.backends.kube.reshape import (
    DELETION_COST,
    HOMES,
    drain_costs,
    live,
    plan_reshape,
)
from tandem.operator.autoscale.core.flip import Flip
from tandem.operator.autoscale.core.shape import Shape, ShapeAction, ShapeDecision
from tandem.operator.autoscale.core.types import Decision, Pool, Replicas
from tandem.operator.runtime.kube import Kube

log = logging.getLogger(__name__)
Body = dict[str, Any]


def _ready_since(pod: Body) -> str | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready" and c.get("status") == "True":
            return c.get("lastTransitionTime") or ""
    return None


def pool_replicas(pods: list[Body]) -> Replicas:
    """Ready, starting (created, not Ready yet: capacity on its way) and draining (being deleted) pods."""
    ready = starting = draining = 0
    for pod in pods:
        phase = (pod.get("status") or {}).get("phase")
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            draining += 1
        elif phase in ("Succeeded", "Failed"):
            continue
        elif _ready_since(pod) is not None:
            ready += 1
        else:
            starting += 1
    return Replicas(ready, starting, draining)


def _time(value: str) -> dt.datetime:
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))


def cold_start_seconds(pods: list[Body]) -> float | None:
    """The measured cold start of a pool: the median, over its Ready pods, of created -> Ready."""
    spans = []
    for pod in pods:
        since, created = _ready_since(pod), (pod.get("metadata") or {}).get("creationTimestamp")
        if since and created:
            spans.append((_time(since) - _time(created)).total_seconds())
    if not spans:
        return None
    spans.sort()
    return spans[len(spans) // 2]


def deletion_costs(running: Mapping[str, float | None]) -> dict[str, int]:
    """Pod -> deletion cost: its running sequences (the ReplicaSet removes the lowest cost first); a pod
    whose load is unknown costs more than any known one, so an idle pod we can see goes first."""
    known = [int(v) for v in running.values() if v is not None]
    unknown = max(known, default=0) + 1
    return {pod: int(v) if v is not None else unknown for pod, v in running.items()}


class KubeActuator:
    def __init__(
        self,
        kube: Kube,
        owner: Body,
        pools: tuple[Pool, ...],
        running_by_pod: Callable[[list[Body]], dict[str, float | None]],
        event: Callable[[str, str, str], None] | None = None,
    ):
        self.kube, self.owner, self.pools, self.running_by_pod = kube, owner, pools, running_by_pod
        meta = owner["metadata"]
        self.namespace, self.service = meta["namespace"], meta["name"]
        self.event = event or (lambda reason, message, type_: kube.event(owner, reason, message, type_))
        self.written: dict[Pool, int] = {}  # what the autoscaler last wrote per pool
        self.pods: dict[Pool, list[Body]] = {}  # by the role each pod serves now
        self.all_pods: list[Body] = []  # every pod of the pools, whatever its role
        self.auto = Pool.colocated in pools and Pool.prefill in pools  # mode auto: the shape changes
        self.reshaping: Shape | None = None  # mode auto: the shape a change under way goes to

    def pool_name(self, pool: Pool) -> str:
        return f"{self.service}-{pool.value}"

    def refresh(self) -> None:
        pods = self.kube.list("Pod", self.namespace, f"{names.LABEL_SERVICE}={self.service}")
        self.all_pods = [x for x in pods if home_of(x) in {p.value for p in self.pools}]
        self.pods = by_role(self.all_pods, self.pools)

    def replicas(self) -> dict[Pool, Replicas]:
        self.refresh()
        return {pool: pool_replicas(pods) for pool, pods in self.pods.items()}

    def cold_start_s(self) -> float | None:
        spans = [s for pods in self.pods.values() if (s := cold_start_seconds(pods)) is not None]
        return max(spans) if spans else None

    def manual_edits(self) -> dict[Pool, int]:
        """Pools whose replicas someone else changed since the autoscaler wrote them (it will win again)."""
        edited = {}
        for pool, mine in self.written.items():
            live = self.kube.get("TandemPool", self.namespace, self.pool_name(pool))
            replicas = ((live or {}).get("spec") or {}).get("replicas")
            if replicas is not None and replicas != mine:
                edited[pool] = int(replicas)
        return edited

    def mark_victims(self, pool: Pool) -> dict[str, int]:
        """Set every pod's deletion cost from its running sequences; returns the costs."""
        pods = [
            p
            for p in self.all_pods
            if home_of(p) == pool.value and not p["metadata"].get("deletionTimestamp")
        ]
        costs = flip_aware_costs(deletion_costs(self.running_by_pod(pods)), pods, pool)
        for pod in pods:
            name = pod["metadata"]["name"]
            if (pod["metadata"].get("annotations") or {}).get(DELETION_COST) != str(costs[name]):
                self.kube.merge_patch(
                    "Pod",
                    self.namespace,
                    name,
                    {"metadata": {"annotations": {DELETION_COST: str(costs[name])}}},
                )
        return costs

    def apply(self, decision: Decision) -> None:
        if decision.pool == Pool.colocated and self.auto:  # colocated pods live in either home
            self.reshaping = Shape(colocated=decision.desired)
            self.step_reshape()
            reason = "ScaledUp" if decision.desired > decision.current else "ScaledDown"
            self.event(reason, f"{decision.reason} [{decision.reason_code}]", "Normal")
            return
        if decision.desired < decision.current:
            self.mark_victims(decision.pool)
        replicas = home_replicas(decision.desired, decision.pool, self.all_pods)  # = desired without flips
        self.kube.merge_patch(
            "TandemPool", self.namespace, self.pool_name(decision.pool), {"spec": {"replicas": replicas}}
        )
        self.written[decision.pool] = replicas
        reason = "ScaledUp" if decision.desired > decision.current else "ScaledDown"
        self.event(reason, f"{decision.reason} [{decision.reason_code}]", "Normal")

    def flip(self, flip: Flip) -> None:
        """Relabel the pods to flip (the workers follow their role label), never the source's last Ready pod;
        an Event names the flip."""
        serving = self.pods.get(flip.source, [])
        chosen = flip_candidates(self.all_pods, flip, self.running_by_pod(serving))
        patch_flip(
            self.kube.merge_patch, self.namespace, chosen, flip.target, dt.datetime.now(dt.UTC).isoformat()
        )
        short = (
            ""
            if len(chosen) == flip.count
            else f"; {len(chosen)} of {flip.count}: {flip.source} keeps a Ready pod"
        )
        if chosen:
            self.event(flip.reason_code, f"{flip.reason} ({', '.join(chosen)}){short}", "Normal")
        if short:
            log.warning("%s/%s: %s%s", self.namespace, self.service, flip.reason_code, short)

    def reshape(self, decision: ShapeDecision) -> None:
        """mode auto: go to `decision.target` (its first step now, the rest on the next ticks); an Event
        (Collapsed or Split) gives the shape rule's reason."""
        self.reshaping = decision.target
        code = "Collapsed" if decision.action is ShapeAction.collapse else "Split"
        self.event(code, f"{decision.reason} ({decision.current} -> {decision.target})", "Normal")
        self.step_reshape()

    def step_reshape(self) -> None:
        """One step of the change under way: start the pods the target has beyond these, relabel the first
        wave, and once no wave is left, drain the rest (lowest deletion cost, homes scaled down)."""
        if self.reshaping is None:
            return
        self.refresh()
        plan = plan_reshape(self.all_pods, self.reshaping, self.running_by_pod(live(self.all_pods)))
        at = dt.datetime.now(dt.UTC).isoformat()
        for name, role in (plan.waves[0] if plan.waves else {}).items():
            self.kube.merge_patch("Pod", self.namespace, name, flip_patch(Pool(role), at))
        if not plan.waves:
            for name, cost in drain_costs(self.all_pods, plan.drain).items():
                self.kube.merge_patch(
                    "Pod", self.namespace, name, {"metadata": {"annotations": {DELETION_COST: str(cost)}}}
                )
        now = {h: sum(1 for p in live(self.all_pods) if home_of(p) == h) for h in HOMES}
        for home in HOMES:  # while flips remain, homes only grow: pods start first, drains go last
            replicas = plan.homes[home] if not plan.waves else max(plan.homes[home], now[home])
            if self.written.get(Pool(home)) != replicas or replicas != now[home]:
                self.kube.merge_patch(
                    "TandemPool", self.namespace, self.pool_name(Pool(home)), {"spec": {"replicas": replicas}}
                )
                self.written[Pool(home)] = replicas
        if plan.settled:
            self.reshaping = None
