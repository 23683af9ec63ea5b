"""One level-based reconcile of an InferenceService: read, render, write only what differs, report status.

Safe to run any number of times: with nothing changed it reads and writes nothing back.
"""

from __future__ import annotations

import datetime as dt
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from tandem import names
from tandem.operator import certs, exposure, render
from tandem.operator.autoscale.wake import wakes_from_zero
from tandem.operator.cache import ObjectCache
from tandem.operator.drift import is_subset, needs_apply
from tandem.operator.flip import role_counts
from tandem.operator.kube import ApiError, Kube
from tandem.operator.manifest import selector_string, with_hash
from tandem.operator.model_cache import process_model_cache
from tandem.operator.pod_health import pod_problems
from tandem.operator.pod_tls import TLS_ROLES, tls_secret
from tandem.operator.pools import clamp_message, desired_pool_replicas
from tandem.operator.preflight import Facts, Findings, NodeGpus, check, claims_needed, node_gpus
from tandem.operator.security_defaults import operator_peer, process_defaults, with_defaults
from tandem.operator.start_status import with_pod_starts
from tandem.operator.status import inference_pool_status, rebase, rolled_out, same_status, service_status
from tandem.spec import KIND, InferenceServiceSpec, Mode

log = logging.getLogger("tandem.operator")

_APPLY_POOL = ThreadPoolExecutor(max_workers=16, thread_name_prefix="apply")
_CHILD_KINDS = ("Deployment", "Service", "PodDisruptionBudget", "NetworkPolicy", "TandemPool", "InferencePool",
                "HTTPRoute")
# Kinds of other projects' CRDs (spec.gateway): a cluster without them has none of these children to remove.
_OPTIONAL_KINDS = ("InferencePool", "HTTPRoute")
POD_RECHECK_SECONDS = 5.0
_ISSUED: set[tuple[str, str, str]] = set()  # (namespace, name, uid) whose TLS Secret exists
PREFLIGHT_RECHECK_SECONDS = 10.0  # the operator watches neither claims nor nodes: look again for the fix
_EXPOSURE = exposure.ExposureWatch()


class NameInUse(Exception):
    """A child's name is taken by an object this InferenceService does not own."""


@dataclass
class Outcome:
    """What one reconcile did; `writes` lists every API write it made. `recheck_after` (seconds) asks for
    another look while pods start, since the operator watches Deployments, not pods."""

    writes: list[str] = field(default_factory=list)
    ready: bool = False
    recheck_after: float | None = None
    clamped: list[str] = field(default_factory=list)  # replica counts the operator moved back into bounds


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _patch_status(kube: Kube, isvc: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    """Write the status built on `isvc`'s; pools that no longer exist are removed (null in a merge patch).
    On a conflict (the autoscaler wrote in between) the other writers' conditions are taken afresh."""

    def build(previous: dict[str, Any]) -> dict[str, Any]:
        gone = {p: None for p in previous.get("pools") or {} if p not in status["pools"]}
        return {**rebase(status, previous), "pools": {**gone, **status["pools"]}}

    return kube.patch_status(KIND, isvc, build)


class Reader:
    """Reads through the watch cache when there is one (GET only on a miss); writes refresh it."""

    def __init__(self, kube: Kube, cache: ObjectCache | None, fresh: bool):
        self.kube, self.cache, self.fresh = kube, cache, fresh
        self.first_time = False  # set for a never-reconciled object: a cache miss then means "absent"

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        if self.cache is not None and not self.fresh:
            hit = self.cache.get(kind, namespace, name)
            if hit is not None:
                return hit
            if self.first_time:
                return None
        body = self.kube.get(kind, namespace, name)
        if body is not None:
            self.remember(body)
        return body

    def remember(self, body: dict[str, Any]) -> dict[str, Any]:
        if self.cache is not None and body.get("kind"):
            self.cache.put(body)
        return body


def _ensure_pool(kube: Kube, reader: Reader, spec: InferenceServiceSpec, name: str, ns: str, uid: str, pool: str,
                 out: Outcome) -> tuple[dict[str, Any], int]:
    """Create the TandemPool if missing, keep its metadata ours, and return (pool, replicas)."""
    live = reader.get("TandemPool", ns, render.child_name(name, pool))
    replicas, write = desired_pool_replicas(spec, pool, live)
    wanted = render.inference_pool(name, ns, uid, pool, replicas)
    if live is None:
        try:
            live = reader.remember(kube.create(wanted))
        except ApiError as e:
            if e.status != 409:
                raise
            reader.first_time = False  # it exists after all: read it and go on as for an existing pool
            return _ensure_pool(kube, reader, spec, name, ns, uid, pool, out)
        out.writes.append(f"create TandemPool/{wanted['metadata']['name']}")
        return live, replicas
    if not owned_by(live, uid):
        raise NameInUse(f"TandemPool/{wanted['metadata']['name']}")
    if not is_subset(wanted["metadata"], live["metadata"]):
        # replicas left out on purpose: after creation this field manager must not own them (see pools.py)
        body = {**wanted, "spec": {k: v for k, v in wanted["spec"].items() if k != "replicas"}}
        live = reader.remember(kube.apply(body))
        out.writes.append(f"apply TandemPool/{wanted['metadata']['name']}")
    if write:
        before = (live.get("spec") or {}).get("replicas")
        live = reader.remember(kube.merge_patch("TandemPool", ns, wanted["metadata"]["name"],
                                                {"spec": {"replicas": replicas}}))
        out.writes.append(f"scale TandemPool/{wanted['metadata']['name']}={replicas}")
        if before is not None:
            out.clamped.append(clamp_message(spec, pool, int(before), replicas))
    return live, replicas


def _ensure_tls_secret(kube: Kube, name: str, ns: str, uid: str, out: Outcome, flippable: bool = False) -> None:
    """Issue the service's CA and every role's certificate into its Secret, once (with spec.roleFlip, the
    prefill and decode certificates name both roles): the operator may create Secrets but not read them, so
    one that exists (ours from an earlier reconcile) is left as it is (delete it to issue new ones)."""
    key = (ns, name, uid)
    if key in _ISSUED:
        return
    body = tls_secret(name, ns, uid, certs.secret_data(name, TLS_ROLES, flippable))
    try:
        kube.create(body)
        out.writes.append(f"create Secret/{body['metadata']['name']}")
    except ApiError as e:
        if e.status != 409:
            raise
    _ISSUED.add(key)


def owned_by(live: dict[str, Any] | None, uid: str) -> bool:
    """Whether a live object is absent or carries this InferenceService's owner reference (pure): server-side
    apply with force takes over fields, so it is used only on objects that are ours."""
    if live is None:
        return True
    return any(o.get("uid") == uid for o in live.get("metadata", {}).get("ownerReferences") or [])


def _remove_stale(kube: Kube, name: str, ns: str, keep: set[tuple[str, str]], out: Outcome) -> None:
    """Delete children of pools the spec no longer has (for example after switching to colocated)."""
    for kind in _CHILD_KINDS:
        try:
            items = kube.list(kind, ns, f"{names.LABEL_SERVICE}={name}")
        except ApiError as e:
            if e.status == 404 and kind in _OPTIONAL_KINDS:
                continue
            raise
        for item in items:
            child = item["metadata"]["name"]
            owners = item["metadata"].get("ownerReferences") or []
            ours = any(o.get("kind") == KIND and o.get("name") == name for o in owners)
            if ours and (kind, child) not in keep:
                kube.delete(kind, ns, child)
                out.writes.append(f"delete {kind}/{child}")


def reconcile(kube: Kube, namespace: str, name: str, cache: ObjectCache | None = None,
              fresh: bool = False) -> Outcome:
    """Bring one InferenceService's children and status in line with its spec.

    With a cache, reads come from the watch cache unless `fresh` (the periodic resync reads the API).
    """
    out = Outcome()
    reader = Reader(kube, cache, fresh)
    isvc = reader.get(KIND, namespace, name)
    if isvc is None or isvc["metadata"].get("deletionTimestamp"):
        _EXPOSURE.forget(namespace, name)
        return out  # garbage collection removes the children through owner references
    previous = isvc.get("status") or {}
    # Never reconciled: its children can only be ones we created, which the cache holds. (A crash between
    # creating children and writing status is covered: apply is idempotent, create falls back on 409.)
    reader.first_time = "observedGeneration" not in previous
    try:
        spec = with_defaults(InferenceServiceSpec.model_validate(isvc.get("spec") or {}), process_defaults())
    except ValidationError as e:
        _report_blocked(kube, reader, isvc, previous, ("InvalidSpec", str(e).splitlines()[0]), str(e), out)
        return out
    findings = Findings() if _settled(previous, isvc["metadata"].get("generation", 1)) else \
        check(spec, [*render.worker_pools(spec), names.POOL_ROUTER], read_facts(kube, namespace, spec))
    if findings.any:
        out.recheck_after = PREFLIGHT_RECHECK_SECONDS
    if findings.blocked:
        _report_blocked(kube, reader, isvc, previous, findings.blocked, findings.blocked[1], out)
        return out
    try:
        _converge(kube, reader, isvc, spec, previous, out, findings)
    except ApiError as e:
        detail = f"{e.message} (HTTP {e.status}{' ' + e.reason if e.reason else ''})"
        _report_blocked(kube, reader, isvc, previous, ("ApplyFailed", detail), detail, out)
        raise  # the queue retries with a backoff (no hot loop on answers that cannot change)
    return out


def _ready_changed(dep: dict[str, Any] | None, previous: dict[str, Any], pool: str) -> bool:
    """The Deployment's ready pods differ from what status last said: a pod started (or left)."""
    ready = ((dep or {}).get("status") or {}).get("readyReplicas", 0)
    return ready != ((previous.get("pools") or {}).get(pool) or {}).get("readyReplicas", 0)


def _settled(previous: dict[str, Any], generation: int) -> bool:
    """Ready at this generation: its pods run, so there is nothing to check before they can."""
    ready: dict[str, Any] = next((c for c in previous.get("conditions") or [] if c.get("type") == "Ready"), {})
    return ready.get("status") == "True" and ready.get("observedGeneration") == generation


def read_facts(kube: Kube, namespace: str, spec: InferenceServiceSpec) -> Facts:
    """The I/O edge of the preflight check; what the API refuses (RBAC, a Role without nodes) stays unknown."""
    claims: dict[str, str | None] = {}
    for claim in claims_needed(spec):
        try:
            body = kube.get("PersistentVolumeClaim", namespace, claim)
        except ApiError as e:
            log.debug("%s: cannot read PersistentVolumeClaim %s: %s", namespace, claim, e)
            continue
        claims[claim] = None if body is None else str((body.get("status") or {}).get("phase") or "Pending")
    try:
        nodes: tuple[NodeGpus, ...] | None = tuple(node_gpus(n) for n in kube.list_nodes())
    except ApiError as e:
        log.debug("cannot list nodes (the GPU check is skipped): %s", e)
        nodes = None
    return Facts(claims=claims, nodes=nodes)


def _report_blocked(kube: Kube, reader: Reader, isvc: dict[str, Any], previous: dict[str, Any],
                    blocked: tuple[str, str], event: str, out: Outcome) -> None:
    """Status Degraded with the cause, and a Warning Event on the InferenceService, once per new cause."""
    meta = isvc["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    status = service_status(meta.get("generation", 1), {}, {}, previous, render.router_endpoint(name, namespace),
                            _now(), blocked=blocked)
    if same_status(status, previous):
        return
    log.warning("%s/%s: %s: %s", namespace, name, *blocked)
    try:
        reader.remember(_patch_status(kube, isvc, status))
        out.writes.append("status")
    except ApiError as e:
        log.warning("%s/%s: could not write status: %s", namespace, name, e)
    kube.event(isvc, blocked[0], event, "Warning")


def _converge(kube: Kube, reader: Reader, isvc: dict[str, Any], spec: InferenceServiceSpec,
              previous: dict[str, Any], out: Outcome, findings: Findings) -> None:
    """Create or fix every child, then report status; raises ApiError when the API server refuses a write."""
    meta = isvc["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    uid, generation = meta["uid"], meta.get("generation", 1)
    endpoint = render.router_endpoint(name, namespace)
    wanted_pools = render.worker_pools(spec)
    if spec.security.tls.enabled and not (spec.security.tls.secret_name or spec.security.tls.dir):
        _ensure_tls_secret(kube, name, namespace, uid, out, spec.role_flip)
    ensured = _APPLY_POOL.map(lambda p: _ensure_pool(kube, reader, spec, name, namespace, uid, p, out), wanted_pools)
    try:
        pools: dict[str, tuple[dict[str, Any], int]] = dict(zip(wanted_pools, ensured, strict=True))
    except NameInUse as e:
        message = f"{e} already exists and is not owned by this InferenceService; rename it or remove it"
        _report_blocked(kube, reader, isvc, previous, ("NameInUse", message), message, out)
        return

    replicas = {pool: n for pool, (_, n) in pools.items()}
    deployments: dict[str, dict[str, Any] | None] = {}
    keep: set[tuple[str, str]] = set()
    live_children: dict[tuple[str, str], dict[str, Any] | None] = {}
    stale: list[dict[str, Any]] = []
    for manifest in render.children(spec, name, namespace, uid, replicas, process_model_cache(), operator_peer()):
        manifest = with_hash(manifest)
        key = (manifest["kind"], manifest["metadata"]["name"])
        keep.add(key)
        live_children[key] = reader.get(key[0], namespace, key[1])
        if live_children[key] is None and reader.first_time:  # the cache holds only ours: ask whether the name is free
            live_children[key] = kube.get(key[0], namespace, key[1])
        if needs_apply(manifest, live_children[key]):
            stale.append(manifest)
    clashes = [f"{k}/{n}" for (k, n), live in live_children.items() if not owned_by(live, uid)]
    if clashes:  # someone else's objects under our children's names: leave them be, say so
        message = (f"{', '.join(clashes)} already exist{'s' if len(clashes) == 1 else ''} and "
                   f"{'is' if len(clashes) == 1 else 'are'} not owned by this InferenceService; rename it or remove them")
        _report_blocked(kube, reader, isvc, previous, ("NameInUse", message), message, out)
        return
    # All or nothing: the API server validates and admits (quota included) every changed child before any is
    # written, so a child it refuses leaves no GPU pool half-built beside it.
    if stale:
        list(_APPLY_POOL.map(lambda m: kube.apply(m, dry_run=True), stale))
    # children are independent: apply them side by side, so a new object waits for one round trip, not nine
    applied = _APPLY_POOL.map(lambda m: reader.remember(kube.apply(m)), stale)
    for manifest, body in zip(stale, applied, strict=True):
        key = (manifest["kind"], manifest["metadata"]["name"])
        live_children[key] = body
        out.writes.append(f"apply {key[0]}/{key[1]}")
    for (kind, child), current in live_children.items():
        if kind == "Deployment":
            deployments[child.removeprefix(f"{name}-")] = current
    keep |= {("TandemPool", render.child_name(name, p)) for p in pools}

    if previous.get("observedGeneration") != generation:
        _remove_stale(kube, name, namespace, keep, out)

    for pool, (live_pool, _) in pools.items():
        st = inference_pool_status(deployments.get(pool), selector_string(name, pool),
                                   live_pool["metadata"].get("generation", 1))
        if not same_status(st, live_pool.get("status") or {}):
            reader.remember(kube.merge_patch("TandemPool", namespace, live_pool["metadata"]["name"],
                                             {"status": st}, sub="status"))
            out.writes.append(f"status TandemPool/{live_pool['metadata']['name']}")

    desired = {**replicas, names.POOL_ROUTER: spec.router.replicas}
    # Only a pool that is not rolled out, or whose ready pods changed, costs a pod read: steady state reads none.
    stuck = [p for p in desired if deployments.get(p) is not None and not rolled_out(deployments.get(p), desired[p])]
    read = [p for p in desired if p in stuck or (deployments.get(p) is not None and _ready_changed(
        deployments.get(p), previous, p))]
    pods = dict(zip(read, _APPLY_POOL.map(lambda p: kube.list("Pod", namespace, selector_string(name, p)), read),
                    strict=True))
    problems = {p: pod_problems(pods[p]) for p in stuck}
    if stuck and not any(problems.values()):
        out.recheck_after = POD_RECHECK_SECONDS  # pods may yet turn unschedulable or fail to pull
    for pool, found in findings.pools.items():  # the cause first, then what the scheduler says of it
        problems[pool] = found + problems.get(pool, [])
    serving = None
    if spec.role_flip and spec.mode is Mode.disaggregated:  # flipped pods count where they serve now
        serving = role_counts(kube.list("Pod", namespace, f"{names.LABEL_SERVICE}={name}"))
    now = _now()
    status = service_status(generation, deployments, desired, previous, endpoint, now, pod_problems=problems,
                            tls=spec.security.tls.enabled, serving=serving, wakes=wakes_from_zero(spec))
    status = with_pod_starts(status, previous, pods, spec.model.source.hugging_face is not None, generation, now)
    conditions = {c["type"]: c for c in status["conditions"]}
    out.ready = conditions["Ready"]["status"] == "True"
    if not same_status(status, previous):
        reader.remember(_patch_status(kube, isvc, status))
        out.writes.append("status")
        before = {c.get("type"): c for c in previous.get("conditions") or []}
        if out.ready and (before.get("Ready") or {}).get("status") != "True":
            kube.event(isvc, "Ready", "all pools ready")
        if conditions["Encrypted"]["status"] == "False" and (before.get("Encrypted") or {}).get("status") != "False":
            kube.event(isvc, "TLSOff", conditions["Encrypted"]["message"], "Warning")
        degraded, was = conditions["Degraded"], before.get("Degraded") or {}
        if degraded["status"] == "True" and (was.get("status") != "True" or was.get("reason") != degraded["reason"]):
            kube.event(isvc, degraded["reason"], degraded["message"], "Warning")
    router = live_children.get(("Deployment", render.child_name(name, names.POOL_ROUTER))) or {}
    _warn_if_exposed(kube, reader, isvc, spec, router.get("spec", {}).get("template", {}).get("metadata", {}).get("labels") or {})
    if out.clamped:
        kube.event(isvc, "ReplicasClamped", "; ".join(out.clamped), "Warning")
    changed = [w for w in out.writes if not w.startswith("status")]
    if changed:
        kube.event(isvc, "Reconciled", "; ".join(changed))
        log.info("%s/%s: %s", namespace, name, "; ".join(changed))


def _warn_if_exposed(kube: Kube, reader: Reader, isvc: dict[str, Any], spec: InferenceServiceSpec,
                     router_labels: dict[str, str]) -> None:
    """A Warning Event when the router is reachable from outside the cluster without API keys. The operator
    does not watch other people's Services: it lists them at each resync (and the first time)."""
    meta = isvc["metadata"]
    key = (meta["namespace"], meta["name"], meta["uid"])
    services = None
    if spec.security.api_keys is not None:
        _EXPOSURE.services.pop(key, None)
    elif _EXPOSURE.needs_listing(key, reader.fresh):
        services = exposure.external_services(kube.list("Service", key[0], ""), router_labels)
    seen = services if services is not None else _EXPOSURE.services.get(key, ())
    message = _EXPOSURE.to_send(key, services, exposure.warning(spec, key[0], seen))
    if message:
        kube.event(isvc, exposure.REASON, message, "Warning")
