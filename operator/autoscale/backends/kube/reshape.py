"""A change of shape (mode auto) on Kubernetes as a plan (pure): which pods get which role label, in which
waves, which pods drain, and the replicas each home Deployment is given.

Pods never change Deployment: a pod's home is its `serving.tandem.dev/pool` label (prefill or decode), and
a colocated pod is a pod of either home relabelled `colocated` (the worker follows its label). Who flips and
who drains is the local backend's rule (shape_tick.reshape): prefill pods flip to colocated first (their drain
is one prefill step), surplus decode pods drain; on a split, colocated pods flip to prefill before any goes to
decode. New pods start in the decode home for decode and colocated (they are born `decode` and relabelled
on the next step) and in the prefill home for prefill. Pods that drain get the lowest deletion cost and their
home Deployment one replica fewer, so its ReplicaSet removes them and their preStop drains them.

Only Ready pods count as serving: a flip runs only while its side keeps a Ready pod after it (the flips
of a wave counted in their new role from the next wave on; decode and colocated are one side), except that
a collapse may empty the prefill side, since in mode auto the router lets decode and colocated workers
prefill. A flip that would empty its side waits (`held`), and the plan is made again on the next step from
the pods as they are then, so a step at a time converges on the target whatever the ReplicaSets did.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tandem import names
from tandem.operator.autoscale.backends.kube.flip import home_of, role_of
from tandem.operator.autoscale.core.flip import flip_waves
from tandem.operator.autoscale.core.shape import Shape
from tandem.operator.autoscale.core.shape_tick import reshape
from tandem.operator.status.flip import is_ready

Body = dict[str, Any]
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
DRAIN_FIRST = -1000  # below any cost the pools' own step downs set
HOMES = (names.POOL_PREFILL, names.POOL_DECODE)
BORN_IN = {
    names.POOL_PREFILL: names.POOL_PREFILL,
    names.POOL_DECODE: names.POOL_DECODE,
    names.POOL_COLOCATED: names.POOL_DECODE,
}


@dataclass(frozen=True)
class KubeReshape:
    """Relabel `waves` one after another (pod -> role), drain `drain`, give each home `homes` replicas; `held`
    flips wait for a Ready pod to stay behind."""

    waves: tuple[dict[str, str], ...] = ()
    drain: tuple[str, ...] = ()
    homes: dict[str, int] = field(default_factory=dict)
    held: dict[str, str] = field(default_factory=dict)

    @property
    def settled(self) -> bool:
        return not self.waves and not self.drain and not self.held


def live(pods: list[Body]) -> list[Body]:
    return [p for p in pods if home_of(p) in HOMES and not p["metadata"].get("deletionTimestamp")]


def move_order(pods: list[Body], running: Mapping[str, float | None]) -> list[str]:
    """Ready pods before starting ones, then the fewest running sequences (unknown last), then by name."""

    def key(p: Body) -> tuple[bool, float, str]:
        name = p["metadata"]["name"]
        held = running.get(name)
        return (not is_ready(p), float("inf") if held is None else held, name)

    return [p["metadata"]["name"] for p in sorted(pods, key=key)]


def plan_reshape(
    pods: list[Body], target: Shape, running: Mapping[str, float | None] | None = None
) -> KubeReshape:
    """The next step from the service's worker pods (any role, Ready or not) to `target`."""
    mine = live(pods)
    named = {p["metadata"]["name"]: p for p in mine}
    roles = {n: role_of(p) for n, p in named.items()}
    moves = reshape(roles, target, move_order(mine, running or {}))
    serving = {n: r for n, r in roles.items() if is_ready(named[n])}  # who serves now, as flips run
    waves: list[dict[str, str]] = []
    held: dict[str, str] = {}
    for step in moves.waves:
        starting = {n: r for n, r in step.items() if n not in serving}  # not serving yet: nothing to keep
        ready = {n: r for n, r in step.items() if n in serving}
        ordered, refused = flip_waves(serving, ready)
        emptied = [n for n in refused if roles[n] == names.POOL_PREFILL and not target.prefill]
        ordered = [*ordered, emptied] if emptied else ordered  # a collapse may leave no prefill pod
        if starting and ordered:
            ordered[0] = [*starting, *ordered[0]]
        elif starting:
            ordered = [list(starting)]
        for wave in ordered:
            waves.append({n: step[n] for n in wave})
            serving.update({n: step[n] for n in wave if n in serving})
        held |= {n: step[n] for n in refused if n not in emptied}
    drain = tuple(n for n in moves.drain if not held)  # nobody drains while a flip waits for its side
    homes = {h: sum(1 for n, p in named.items() if home_of(p) == h and n not in drain) for h in HOMES}
    for role, count in moves.start.items():
        homes[BORN_IN[role]] += count
    return KubeReshape(tuple(waves), drain, homes, held)


def shape_of(text: str) -> Shape | None:
    """A shape as status writes it ("2 colocated", "1P+3D"); None for anything else."""
    count, _, rest = text.partition(" ")
    if rest == "colocated" and count.isdigit():
        return Shape(colocated=int(count))
    p, _, d = text.partition("P+")
    return (
        Shape(prefill=int(p), decode=int(d[:-1]))
        if p.isdigit() and d.endswith("D") and d[:-1].isdigit()
        else None
    )


def resumed(status: Body) -> Shape | None:
    """The change of shape to finish after a restart: status says one was under way, and where it went."""
    shape = (status.get("autoscaling") or {}).get("shape") or {}
    return shape_of(shape.get("target") or "") if shape.get("current") == "changing" else None


def drain_costs(pods: list[Body], drain: tuple[str, ...]) -> dict[str, int]:
    """Deletion costs that make each home's ReplicaSet remove the pods to drain first (only those that
    change)."""
    costs = {}
    for p in live(pods):
        name = p["metadata"]["name"]
        if name in drain:
            costs[name] = DRAIN_FIRST
        elif (p["metadata"].get("annotations") or {}).get(DELETION_COST) == str(DRAIN_FIRST):
            costs[name] = 0  # drained by an earlier plan that changed: kept now
    return costs
