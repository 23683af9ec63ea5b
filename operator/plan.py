"""The reconcile's decisions, pure: what one look at an InferenceService's world asks to write (`plan`), and
what to report once the writes are made (`report`). No I/O here; reconcile.py reads and writes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tandem import context_limit, names
from tandem.operator.autoscale.core.wake import wakes_from_zero
from tandem.operator.manifests import exposure, render
from tandem.operator.manifests.drift import is_subset, needs_apply
from tandem.operator.manifests.manifest import selector_string, with_hash
from tandem.operator.model.cache import ModelCache
from tandem.operator.pools import clamp_message, desired_pool_replicas
from tandem.operator.status.flip import role_counts
from tandem.operator.status.model_cached import model_positions
from tandem.operator.status.pod_health import pod_problems
from tandem.operator.status.preflight import Findings
from tandem.operator.status.service import (
    inference_pool_status,
    rolled_out,
    same_status,
    service_status,
    with_degraded,
)
from tandem.operator.status.start_status import with_pod_starts
from tandem.spec import KIND, InferenceServiceSpec, Mode

Body = dict[str, Any]
Key = tuple[str, str]  # (kind, name) of a child
CHILD_KINDS = (
    "Deployment",
    "Service",
    "PodDisruptionBudget",
    "NetworkPolicy",
    "TandemPool",
    "InferencePool",
    "HTTPRoute",
)
POD_RECHECK_SECONDS = 5.0


@dataclass(frozen=True)
class Observed:
    """One read of an InferenceService's world: the object, its children as they are, and the facts around."""

    name: str
    namespace: str
    uid: str
    generation: int
    previous: Mapping[str, Any]  # the status as last written
    findings: Findings  # the preflight's; when they block, nothing below was read
    pools: Mapping[str, Body | None] = field(default_factory=dict)  # worker pool -> its live TandemPool
    children: Mapping[Key, Body | None] = field(default_factory=dict)  # each rendered child -> live object
    labelled: Mapping[str, Sequence[Body]] | None = None  # kind -> objects labelled ours; None: not listed
    tls_issued: bool = True  # the Secret of issued certificates exists (or none is needed)
    model_cache: ModelCache | None = None
    operator_peer: dict[str, Any] | None = None  # the operator's pods, admitted to the metrics ports
    services: Sequence[Body] | None = None  # the namespace's Services, when listed for the exposure check
    exposed: tuple[str, ...] = ()  # the external Services found at the last listing
    warned: str | None = None  # the exposure warning last sent


@dataclass(frozen=True)
class PoolStep:
    """What one TandemPool needs: created, its metadata applied, its replicas written (each or none)."""

    pool: str
    name: str
    replicas: int
    create: Body | None = None
    apply: Body | None = None  # without spec.replicas: after creation this field manager must not own them
    scale: bool = False
    clamped: str | None = None  # why a count someone else set is moved back into bounds


@dataclass(frozen=True)
class Plan:
    """The writes one reconcile makes, in order: the TLS Secret, the pools, then (unless `blocked`) the
    children that differ, all dry-run first, and the children of pools the spec no longer has."""

    pools: tuple[PoolStep, ...] = ()
    tls_secret: bool = False
    blocked: tuple[str, str] | None = None  # (reason, message): status Degraded, no child written
    apply: tuple[Body, ...] = ()
    delete: tuple[Key, ...] = ()
    replicas: Mapping[str, int] = field(default_factory=dict)  # worker pool -> desired workers

    @property
    def empty(self) -> bool:
        return not (
            self.tls_secret
            or self.apply
            or self.delete
            or any(s.create or s.apply or s.scale for s in self.pools)
        )


def owned_by(live: Body | None, uid: str) -> bool:
    """Whether a live object is absent or carries this InferenceService's owner reference: server-side apply
    with force takes over fields, so it is used only on objects that are ours."""
    if live is None:
        return True
    return any(o.get("uid") == uid for o in live.get("metadata", {}).get("ownerReferences") or [])


def needs_tls_secret(spec: InferenceServiceSpec) -> bool:
    """TLS on with certificates the operator issues (neither a Secret nor a folder of the user's)."""
    tls = spec.security.tls
    return tls.enabled and not (tls.secret_name or tls.dir)


def child_keys(spec: InferenceServiceSpec, name: str, namespace: str, uid: str) -> list[Key]:
    """The children (TandemPools aside) this spec renders, for reading them; the replicas do not name any."""
    spec_replicas = {p: render.pool_spec(spec, p).replicas for p in render.worker_pools(spec)}
    return [
        (m["kind"], m["metadata"]["name"]) for m in render.children(spec, name, namespace, uid, spec_replicas)
    ]


def pool_step(spec: InferenceServiceSpec, o: Observed, pool: str, live: Body | None) -> PoolStep | str:
    """One TandemPool's writes, or the name in use when someone else's object holds it."""
    replicas, write = desired_pool_replicas(spec, pool, live)
    wanted = render.inference_pool(o.name, o.namespace, o.uid, pool, replicas)
    child = wanted["metadata"]["name"]
    if live is None:
        return PoolStep(pool, child, replicas, create=wanted)
    if not owned_by(live, o.uid):
        return f"TandemPool/{child}"
    apply = None
    if not is_subset(wanted["metadata"], live["metadata"]):
        apply = {**wanted, "spec": {k: v for k, v in wanted["spec"].items() if k != "replicas"}}
    before = (live.get("spec") or {}).get("replicas")
    clamped = clamp_message(spec, pool, int(before), replicas) if write and before is not None else None
    return PoolStep(pool, child, replicas, apply=apply, scale=write, clamped=clamped)


def name_in_use(taken: Sequence[str], them: str = "them") -> tuple[str, str]:
    """The Degraded cause when children's names are held by objects this InferenceService does not own."""
    one = len(taken) == 1
    return (
        "NameInUse",
        f"{', '.join(taken)} already exist{'s' if one else ''} and {'is' if one else 'are'} "
        f"not owned by this InferenceService; rename it or remove {them}",
    )


def plan(spec: InferenceServiceSpec, o: Observed) -> Plan:
    """What to write so the children match the spec; nothing when they already do."""
    if o.findings.blocked:
        return Plan(blocked=o.findings.blocked)
    tls = needs_tls_secret(spec) and not o.tls_issued
    steps = [pool_step(spec, o, p, o.pools.get(p)) for p in render.worker_pools(spec)]
    pools = tuple(s for s in steps if isinstance(s, PoolStep))
    taken = [s for s in steps if isinstance(s, str)]
    if taken:  # the first pool's name: its TandemPool is not ours
        return Plan(pools=pools, tls_secret=tls, blocked=name_in_use(taken[:1], "it"))
    replicas = {s.pool: s.replicas for s in pools}
    manifests = [
        with_hash(m)
        for m in render.children(spec, o.name, o.namespace, o.uid, replicas, o.model_cache, o.operator_peer)
    ]
    keys = [(m["kind"], m["metadata"]["name"]) for m in manifests]
    clashes = [f"{k}/{n}" for k, n in keys if not owned_by(o.children.get((k, n)), o.uid)]
    if clashes:  # someone else's objects under our children's names: leave them be, say so
        return Plan(pools=pools, tls_secret=tls, blocked=name_in_use(clashes), replicas=replicas)
    stale = tuple(m for m, k in zip(manifests, keys, strict=True) if needs_apply(m, o.children.get(k)))
    keep = {*keys, *(("TandemPool", s.name) for s in pools)}
    delete = tuple(
        (kind, item["metadata"]["name"])
        for kind in CHILD_KINDS
        for item in (o.labelled or {}).get(kind, ())
        if _ours(item, o.name) and (kind, item["metadata"]["name"]) not in keep
    )
    return Plan(pools=pools, tls_secret=tls, apply=stale, delete=delete, replicas=replicas)


def _ours(item: Body, service: str) -> bool:
    owners = item["metadata"].get("ownerReferences") or []
    return any(r.get("kind") == KIND and r.get("name") == service for r in owners)


def _ready_changed(dep: Body | None, previous: Mapping[str, Any], pool: str) -> bool:
    """The Deployment's ready pods differ from what status last said: a pod started (or left)."""
    ready = ((dep or {}).get("status") or {}).get("readyReplicas", 0)
    return ready != ((previous.get("pools") or {}).get(pool) or {}).get("readyReplicas", 0)


def desired_replicas(spec: InferenceServiceSpec, p: Plan) -> dict[str, int]:
    return {**p.replicas, names.POOL_ROUTER: spec.router.replicas}


def stuck_pools(desired: Mapping[str, int], deployments: Mapping[str, Body | None]) -> list[str]:
    """Pools whose Deployment exists and is not rolled out yet."""
    return [
        p
        for p in desired
        if deployments.get(p) is not None and not rolled_out(deployments.get(p), desired[p])
    ]


def pods_to_read(
    desired: Mapping[str, int], deployments: Mapping[str, Body | None], previous: Mapping[str, Any]
) -> list[str]:
    """Only a pool that is not rolled out, or whose ready pods changed, costs a pod read: steady state reads
    none. Nor does a Deployment the deployment controller has not seen yet (one just created): it has no
    pods of its own until then, and its first status brings another look."""
    stuck = stuck_pools(desired, deployments)
    return [
        p
        for p in desired
        if _seen_by_controller(deployments.get(p))
        and (p in stuck or _ready_changed(deployments.get(p), previous, p))
    ]


def _seen_by_controller(dep: Body | None) -> bool:
    return dep is not None and "observedGeneration" in (dep.get("status") or {})


def deployments_of(name: str, children: Mapping[Key, Body | None]) -> dict[str, Body | None]:
    """pool -> its Deployment, from the children by name."""
    return {
        child.removeprefix(f"{name}-"): body
        for (kind, child), body in children.items()
        if kind == "Deployment"
    }


def serving_counted(spec: InferenceServiceSpec) -> bool:
    """With spec.roleFlip, flipped pods count where they serve now (which costs a read of every pod)."""
    return spec.role_flip and spec.mode is not Mode.colocated


@dataclass(frozen=True)
class Rollout:
    """What the writes left: each TandemPool and child as the API server answered, and the pods read."""

    pools: Mapping[str, Body]  # worker pool -> TandemPool
    children: Mapping[Key, Body | None]
    pods: Mapping[str, Sequence[Body]] = field(default_factory=dict)  # pool -> its pods (pods_to_read's only)
    all_pods: Sequence[Body] | None = None  # the service's pods, when serving_counted


@dataclass(frozen=True)
class Report:
    """What to write about the writes: TandemPool statuses, the InferenceService's status (None: unchanged),
    the Events in order as (reason, message, type), and what to remember of the exposure check."""

    pool_status: Mapping[str, Body]  # TandemPool name -> status to write
    status: Body | None
    ready: bool
    events: tuple[tuple[str, str, str], ...]
    recheck_after: float | None = None  # when pods are still starting
    exposed: tuple[str, ...] | None = None  # the external Services listed this time (None: not listed)
    warning: str | None = None  # the exposure warning in force


def report(
    spec: InferenceServiceSpec,
    o: Observed,
    p: Plan,
    r: Rollout,
    writes: Sequence[str],
    clamped: Sequence[str],
    now: str,
) -> Report:
    """Status and Events for one reconcile that wrote `writes`; `now` stamps changed conditions."""
    deployments = deployments_of(o.name, r.children)
    pool_status = {}
    for pool, live in r.pools.items():
        st = inference_pool_status(
            deployments.get(pool), selector_string(o.name, pool), live["metadata"].get("generation", 1)
        )
        if not same_status(st, live.get("status") or {}):
            pool_status[live["metadata"]["name"]] = st
    desired = desired_replicas(spec, p)
    stuck = stuck_pools(desired, deployments)
    problems = {pool: pod_problems(list(r.pods.get(pool, ()))) for pool in stuck}
    recheck = POD_RECHECK_SECONDS if stuck and not any(problems.values()) else None  # pods may yet fail
    for pool, found in o.findings.pools.items():  # the cause first, then what the scheduler says of it
        problems[pool] = found + problems.get(pool, [])
    serving = role_counts(list(r.all_pods)) if r.all_pods is not None else None
    previous = dict(o.previous)
    status = service_status(
        o.generation,
        deployments,
        desired,
        previous,
        render.router_endpoint(o.name, o.namespace),
        now,
        pod_problems=problems,
        tls=spec.security.tls.enabled,
        serving=serving,
        wakes=wakes_from_zero(spec),
    )
    status = with_pod_starts(
        status,
        previous,
        {k: list(v) for k, v in r.pods.items()},
        spec.model.source.hugging_face is not None,
        o.generation,
        now,
    )
    status = with_degraded(status, previous, model_limit(spec, status), o.generation, now)
    conditions = {c["type"]: c for c in status["conditions"]}
    ready = conditions["Ready"]["status"] == "True"
    events: list[tuple[str, str, str]] = []
    changed = not same_status(status, previous)
    if changed:
        events += status_events(conditions, previous)
    exposed = None
    if o.services is not None:
        router = r.children.get(("Deployment", render.child_name(o.name, names.POOL_ROUTER))) or {}
        labels = router.get("spec", {}).get("template", {}).get("metadata", {}).get("labels") or {}
        exposed = exposure.external_services(list(o.services), labels)
    warning = exposure.warning(spec, o.namespace, exposed if exposed is not None else o.exposed)
    if warning and warning != o.warned:
        events.append((exposure.REASON, warning, "Warning"))
    if clamped:
        events.append(("ReplicasClamped", "; ".join(clamped), "Warning"))
    made = [w for w in writes if not w.startswith("status")]
    if made:
        events.append(("Reconciled", "; ".join(made), "Normal"))
    return Report(pool_status, status if changed else None, ready, tuple(events), recheck, exposed, warning)


def model_limit(spec: InferenceServiceSpec, status: Body) -> tuple[str, str] | None:
    """Degraded's cause when spec.model.maxContextLength is above the model's max_position_embeddings, as the
    pods' fetches read it (status.modelCache); the workers serve contexts up to the model's limit."""
    why = context_limit.beyond_model(
        spec.model.max_context_length, model_positions(status.get("modelCache") or {})
    )
    return (context_limit.REASON, why) if why else None


def status_events(conditions: Mapping[str, Body], previous: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """The Events a new status brings: Ready, TLS off, and each new cause of Degraded."""
    before = {c.get("type"): c for c in previous.get("conditions") or []}
    out = []
    if conditions["Ready"]["status"] == "True" and (before.get("Ready") or {}).get("status") != "True":
        out.append(("Ready", "all pools ready", "Normal"))
    if (
        conditions["Encrypted"]["status"] == "False"
        and (before.get("Encrypted") or {}).get("status") != "False"
    ):
        out.append(("TLSOff", conditions["Encrypted"]["message"], "Warning"))
    degraded, was = conditions["Degraded"], before.get("Degraded") or {}
    if degraded["status"] == "True" and (
        was.get("status") != "True" or was.get("reason") != degraded["reason"]
    ):
        out.append((degraded["reason"], degraded["message"], "Warning"))
    return out


def blocked_status(o: Observed, blocked: tuple[str, str], now: str) -> Body | None:
    """Status Degraded with the cause, or None when the status already says so."""
    status = service_status(
        o.generation,
        {},
        {},
        dict(o.previous),
        render.router_endpoint(o.name, o.namespace),
        now,
        blocked=blocked,
    )
    return None if same_status(status, dict(o.previous)) else status
