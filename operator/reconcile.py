"""One level-based reconcile of an InferenceService: observe its world once, plan (plan.py, pure), act.

Safe to run any number of times: with nothing changed it reads and writes nothing back.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from pydantic import ValidationError

from tandem import names
from tandem.operator import certs
from tandem.operator.manifests import exposure, render
from tandem.operator.manifests.manifest import selector_string
from tandem.operator.manifests.pod_tls import TLS_ROLES, tls_secret
from tandem.operator.manifests.security_defaults import operator_peer, process_defaults, with_defaults
from tandem.operator.model.cache import process_model_cache
from tandem.operator.plan import (
    CHILD_KINDS,
    Observed,
    Plan,
    PoolStep,
    Report,
    Rollout,
    blocked_status,
    child_keys,
    deployments_of,
    desired_replicas,
    plan,
    pods_to_read,
    report,
    serving_counted,
)
from tandem.operator.reads import Listing, Reader, read_facts
from tandem.operator.runtime.cache import ObjectCache
from tandem.operator.runtime.kube import ApiError, Kube
from tandem.operator.status.preflight import Findings, check
from tandem.operator.status.service import rebase
from tandem.spec import KIND, InferenceServiceSpec

log = logging.getLogger("tandem.operator")

# Kinds of other projects' CRDs (spec.gateway): a cluster without them has none of these children to remove.
_OPTIONAL_KINDS = ("InferencePool", "HTTPRoute")
PREFLIGHT_RECHECK_SECONDS = 10.0  # the operator watches neither claims nor nodes: look again for the fix
SERVICES_TTL_SECONDS = 5.0  # a namespace's Services listed once serve the exposure checks of this long
Body = dict[str, Any]
ServiceKey = tuple[str, str, str]  # (namespace, name, uid)


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


class _Taken(Exception):
    """A child the observation took for absent exists (a TandemPool's create met a 409, or a dry run
    answered for a stored object): the world moved, look again, reading the API."""

    def __init__(self, error: ApiError):
        super().__init__(str(error))
        self.error = error


def _settled(previous: dict[str, Any], generation: int) -> bool:
    """Ready at this generation: its pods run, so there is nothing to check before they can."""
    ready: dict[str, Any] = next(
        (c for c in previous.get("conditions") or [] if c.get("type") == "Ready"), {}
    )
    return ready.get("status") == "True" and ready.get("observedGeneration") == generation


class Reconciler:
    """Reconciles InferenceServices against one API server; holds what must outlive a reconcile: the watch
    cache, the TLS Secrets issued, the exposure last seen, and the threads that write children side by
    side."""

    def __init__(self, kube: Kube, cache: ObjectCache | None = None, threads: int = 32):
        self.kube, self.cache = kube, cache
        self.issued: set[ServiceKey] = set()  # whose TLS Secret exists
        self.exposure = exposure.ExposureWatch()
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="apply")
        # half the preflight's recheck: a fixed cluster is seen by the next look
        self.nodes = Listing(kube.list_nodes, PREFLIGHT_RECHECK_SECONDS / 2)
        self.services: dict[str, Listing] = {}  # namespace -> its Services
        self._services_lock = threading.Lock()

    def reconcile(self, namespace: str, name: str, fresh: bool = False) -> Outcome:
        """Bring one InferenceService's children and status in line with its spec.

        With a cache, reads come from the watch cache unless `fresh` (the periodic resync reads the API).
        """
        out = Outcome()
        reader = Reader(self.kube, self.cache, fresh)
        isvc = reader.get(KIND, namespace, name)
        if isvc is None or isvc["metadata"].get("deletionTimestamp"):
            self.exposure.forget(namespace, name)
            return out  # garbage collection removes the children through owner references
        previous = isvc.get("status") or {}
        # Never reconciled: its children can only be ones we created, which the cache holds; a name the cache
        # misses is taken for free, and the dry run before any write says whether it is (act raises _Taken).
        # (A crash between creating children and writing status is covered: apply is idempotent, create falls
        # back on 409.)
        reader.first_time = "observedGeneration" not in previous
        meta = isvc["metadata"]
        seen = Observed(name, namespace, meta["uid"], meta.get("generation", 1), previous, Findings())
        try:
            spec = with_defaults(
                InferenceServiceSpec.model_validate(isvc.get("spec") or {}), process_defaults()
            )
        except ValidationError as e:
            self._report_blocked(reader, isvc, seen, ("InvalidSpec", str(e).splitlines()[0]), str(e), out)
            return out
        try:
            for look in range(2):
                seen = self.observe(reader, isvc, spec)
                if seen.findings.any:
                    out.recheck_after = PREFLIGHT_RECHECK_SECONDS
                try:
                    self.act(reader, isvc, spec, seen, plan(spec, seen), out)
                    break
                except _Taken as e:
                    if look:
                        raise e.error from None
                    reader.first_time = (
                        False  # it exists after all: read it and go on as for an existing pool
                    )
        except ApiError as e:
            detail = f"{e.message} (HTTP {e.status}{' ' + e.reason if e.reason else ''})"
            self._report_blocked(reader, isvc, seen, ("ApplyFailed", detail), detail, out)
            raise  # the queue retries with a backoff (no hot loop on answers that cannot change)
        return out

    def observe(self, reader: Reader, isvc: Body, spec: InferenceServiceSpec) -> Observed:
        """Read the world once: the preflight's facts (until Ready), then, unless they block, the TandemPools,
        the children, the labelled objects (after a spec change) and the Services (for the exposure check).
        For a never-reconciled object, a child the cache does not hold is taken for absent (see act)."""
        meta = isvc["metadata"]
        namespace, name, uid, generation = (
            meta["namespace"],
            meta["name"],
            meta["uid"],
            meta.get("generation", 1),
        )
        previous = isvc.get("status") or {}
        # the preflight's facts are read side by side with the children (read for nothing only when they
        # block)
        facts = (
            None
            if _settled(previous, generation)
            else self.pool.submit(read_facts, self.kube, namespace, spec, self.nodes)
        )
        pools = render.worker_pools(spec)
        keys = child_keys(spec, name, namespace, uid)
        live_pools = self.pool.map(
            lambda p: reader.get("TandemPool", namespace, render.child_name(name, p)), pools
        )
        live_children = self.pool.map(lambda k: reader.get(k[0], namespace, k[1]), keys)
        labelled = None
        # children of another generation can be left over only once the spec has changed
        if generation > 1 and previous.get("observedGeneration") != generation:
            labelled = dict(
                zip(
                    CHILD_KINDS,
                    self.pool.map(lambda k: self._labelled(k, namespace, name), CHILD_KINDS),
                    strict=True,
                )
            )
        key = (namespace, name, uid)
        services = None
        if spec.security.api_keys is None and self.exposure.needs_listing(key, reader.fresh):
            services = self._services(namespace)
        findings = Findings() if facts is None else check(spec, [*pools, names.POOL_ROUTER], facts.result())
        if findings.blocked:
            return Observed(name, namespace, uid, generation, previous, findings)
        return Observed(
            name,
            namespace,
            uid,
            generation,
            previous,
            findings,
            pools=MappingProxyType(dict(zip(pools, live_pools, strict=True))),
            children=MappingProxyType(dict(zip(keys, live_children, strict=True))),
            labelled=labelled,
            tls_issued=key in self.issued,
            model_cache=process_model_cache(),
            operator_peer=operator_peer(),
            services=services,
            exposed=self.exposure.services.get(key, ()),
            warned=self.exposure.warned.get(key),
        )

    def _services(self, namespace: str) -> list[Body]:
        with self._services_lock:
            listing = self.services.get(namespace)
            if listing is None:
                listing = self.services[namespace] = Listing(
                    lambda: self.kube.list("Service", namespace, ""), SERVICES_TTL_SECONDS
                )
        return listing()

    def _labelled(self, kind: str, namespace: str, name: str) -> list[Body]:
        try:
            return self.kube.list(kind, namespace, f"{names.LABEL_SERVICE}={name}")
        except ApiError as e:
            if e.status == 404 and kind in _OPTIONAL_KINDS:
                return []
            raise

    def act(
        self, reader: Reader, isvc: Body, spec: InferenceServiceSpec, seen: Observed, p: Plan, out: Outcome
    ) -> None:
        """Make the plan's writes, then read what they left and report it; raises ApiError on a refused
        write."""
        # All or nothing: the API server validates and admits (quota included) every changed child before any
        # is written, so a child it refuses leaves no GPU pool half-built beside it. The dry runs write
        # nothing, so they go out beside the Secret and the pools, whose own writes stay in order.
        # For a never-reconciled object, a dry run that answers with a stored object (it has a
        # resourceVersion), or is refused, for a child the observation took for absent sends the reconcile
        # back to read the API: the child may be someone else's, or ours unseen by the cache.
        dry_runs = [] if p.blocked else [self.pool.submit(self.kube.apply, m, dry_run=True) for m in p.apply]
        secret = self.pool.submit(self._issue_tls_secret, seen, spec.role_flip, out) if p.tls_secret else None
        try:
            pools = dict(
                zip(
                    [s.pool for s in p.pools],
                    self.pool.map(lambda s: self._write_pool(reader, spec, seen, s, out), p.pools),
                    strict=True,
                )
            )
        finally:
            wait([*dry_runs, *([secret] if secret else [])])
        if secret:
            secret.result()
        if p.blocked:
            message = p.blocked[1]
            self._report_blocked(reader, isvc, seen, p.blocked, message, out)
            return
        if reader.first_time:
            for manifest, dry_run in zip(p.apply, dry_runs, strict=True):
                key = (manifest["kind"], manifest["metadata"]["name"])
                if seen.children.get(key) is None and (
                    dry_run.exception() is not None or dry_run.result()["metadata"].get("resourceVersion")
                ):  # a refusal may be for an object of someone else's: look before reporting it
                    raise _Taken(ApiError(409, f"{key[0]}/{key[1]} exists or was refused"))
        for dry_run in dry_runs:
            dry_run.result()
        # children are independent: apply them side by side, so a new object waits for one round trip, not
        # nine
        children = dict(seen.children)
        for manifest, body in zip(
            p.apply, self.pool.map(lambda m: reader.remember(self.kube.apply(m)), p.apply), strict=True
        ):
            children[(manifest["kind"], manifest["metadata"]["name"])] = body
            out.writes.append(f"apply {manifest['kind']}/{manifest['metadata']['name']}")
        for kind, child in p.delete:
            self.kube.delete(kind, seen.namespace, child)
            out.writes.append(f"delete {kind}/{child}")
        rollout = self._read_rollout(spec, seen, p, pools, children)
        self._write_report(
            reader, isvc, spec, seen, report(spec, seen, p, rollout, out.writes, out.clamped, _now()), out
        )

    def _write_pool(
        self, reader: Reader, spec: InferenceServiceSpec, seen: Observed, s: PoolStep, out: Outcome
    ) -> Body:
        """One TandemPool's writes; returns it as the API server last answered."""
        live = seen.pools.get(s.pool)
        if s.create is not None:
            try:
                live = reader.remember(self.kube.create(s.create))
            except ApiError as e:
                if e.status != 409:
                    raise
                raise _Taken(e) from e
            out.writes.append(f"create TandemPool/{s.name}")
            return live
        assert live is not None
        if s.apply is not None:
            live = reader.remember(self.kube.apply(s.apply))
            out.writes.append(f"apply TandemPool/{s.name}")
        if s.scale:
            live = reader.remember(
                self.kube.merge_patch(
                    "TandemPool", seen.namespace, s.name, {"spec": {"replicas": s.replicas}}
                )
            )
            out.writes.append(f"scale TandemPool/{s.name}={s.replicas}")
            if s.clamped:
                out.clamped.append(s.clamped)
        return live

    def _issue_tls_secret(self, seen: Observed, flippable: bool, out: Outcome) -> None:
        """Issue the service's CA and every role's certificate into its Secret, once (with spec.roleFlip, the
        prefill and decode certificates name both roles): the operator may create Secrets but not read them,
        so one that exists (ours from an earlier reconcile) is left as it is (delete it to issue new ones)."""
        body = tls_secret(
            seen.name, seen.namespace, seen.uid, certs.secret_data(seen.name, TLS_ROLES, flippable)
        )
        try:
            self.kube.create(body)
            out.writes.append(f"create Secret/{body['metadata']['name']}")
        except ApiError as e:
            if e.status != 409:
                raise
        self.issued.add((seen.namespace, seen.name, seen.uid))

    def _read_rollout(
        self,
        spec: InferenceServiceSpec,
        seen: Observed,
        p: Plan,
        pools: dict[str, Body],
        children: dict[tuple[str, str], Body | None],
    ) -> Rollout:
        """The pods the status needs, after the writes: those of pools still rolling out or whose ready
        count changed, and every pod of the service when flipped pods are counted."""
        read = pods_to_read(desired_replicas(spec, p), deployments_of(seen.name, children), seen.previous)
        selectors = [selector_string(seen.name, pool) for pool in read]
        pods = dict(
            zip(
                read,
                self.pool.map(lambda s: self.kube.list("Pod", seen.namespace, s), selectors),
                strict=True,
            )
        )
        all_pods = None
        if serving_counted(spec):
            all_pods = self.kube.list("Pod", seen.namespace, f"{names.LABEL_SERVICE}={seen.name}")
        return Rollout(pools, children, pods, all_pods)

    def _write_report(
        self, reader: Reader, isvc: Body, spec: InferenceServiceSpec, seen: Observed, r: Report, out: Outcome
    ) -> None:
        # the statuses are independent writes: side by side, one round trip
        statuses = [
            self.pool.submit(
                self.kube.merge_patch, "TandemPool", seen.namespace, child, {"status": st}, sub="status"
            )
            for child, st in r.pool_status.items()
        ]
        if r.status is not None:
            statuses.append(self.pool.submit(_patch_status, self.kube, isvc, r.status))
        wait(statuses)
        for written in statuses:
            reader.remember(written.result())
        out.writes += [f"status TandemPool/{child}" for child in r.pool_status]
        out.writes += ["status"] if r.status is not None else []
        out.ready = r.ready
        if r.recheck_after is not None:
            out.recheck_after = r.recheck_after
        key = (seen.namespace, seen.name, seen.uid)
        if spec.security.api_keys is not None:
            self.exposure.services.pop(key, None)  # list them again should the keys go
        self.exposure.to_send(key, r.exposed, r.warning)  # the Event, if due, is among r.events
        if r.events:  # in order, best effort, without holding the reconcile
            self.pool.submit(self._send_events, isvc, r.events)
        made = [w for w in out.writes if not w.startswith("status")]
        if made:
            log.info("%s/%s: %s", seen.namespace, seen.name, "; ".join(made))

    def _send_events(self, isvc: Body, events: tuple[tuple[str, str, str], ...]) -> None:
        try:
            for reason, message, type_ in events:
                self.kube.event(isvc, reason, message, type_)
        except Exception as e:  # a lost Event is logged, never raised: Events are best effort
            log.warning(
                "%s/%s: could not send an Event: %s",
                isvc["metadata"]["namespace"],
                isvc["metadata"]["name"],
                e,
            )

    def _report_blocked(
        self, reader: Reader, isvc: Body, seen: Observed, blocked: tuple[str, str], event: str, out: Outcome
    ) -> None:
        """Status Degraded with the cause, and a Warning Event on the InferenceService, once per new cause."""
        status = blocked_status(seen, blocked, _now())
        if status is None:
            return
        log.warning("%s/%s: %s: %s", seen.namespace, seen.name, *blocked)
        try:
            reader.remember(_patch_status(self.kube, isvc, status))
            out.writes.append("status")
        except ApiError as e:
            log.warning("%s/%s: could not write status: %s", seen.namespace, seen.name, e)
        self.kube.event(isvc, blocked[0], event, "Warning")


def _patch_status(kube: Kube, isvc: Body, status: Body) -> Body:
    """Write the status built on `isvc`'s; pools that no longer exist are removed (null in a merge patch).
    On a conflict (the autoscaler wrote in between) the other writers' conditions are taken afresh."""

    def build(previous: Body) -> Body:
        gone = {p: None for p in previous.get("pools") or {} if p not in status["pools"]}
        return {**rebase(status, previous), "pools": {**gone, **status["pools"]}}

    return kube.patch_status(KIND, isvc, build)
