"""The autoscaler in the operator: for each InferenceService with `autoscaling.enabled`, one tick every
`intervalSeconds` (observe, decide, write TandemPool replicas), then status, Events and metrics.

Runs beside the reconcile queue as one asyncio task; each tick's API and metric calls run in a worker
thread. With autoscaling off nothing here writes, so `kubectl scale`, HPA or KEDA own the pools.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import httpx
from prometheus_client import CollectorRegistry, Counter, Gauge

from tandem import names
from tandem.operator.autoscale.backends.kube.actuator import KubeActuator
from tandem.operator.autoscale.backends.kube.pods import metrics_targets
from tandem.operator.autoscale.backends.kube.reshape import resumed
from tandem.operator.autoscale.core.cold_start import learn, observed
from tandem.operator.autoscale.core.config import policy_config
from tandem.operator.autoscale.core.loop import Autoscaler
from tandem.operator.autoscale.core.report import slo_status
from tandem.operator.autoscale.core.shape_tick import SHAPE_POOLS, shape_config
from tandem.operator.autoscale.core.source import MetricSource, MetricsUnavailable, Target
from tandem.operator.autoscale.core.types import Pool
from tandem.operator.autoscale.sources.prometheus import PrometheusSource
from tandem.operator.autoscale.sources.scrape import ScrapeSource, parse
from tandem.operator.runtime.cache import ObjectCache
from tandem.operator.runtime.kube import ApiError, Kube
from tandem.profile import Profile, shipped_profile
from tandem.spec import KIND, InferenceService, InferenceServiceSpec, Mode, parse_object

log = logging.getLogger("tandem.operator.autoscale")
Body = dict[str, Any]
PROFILE_KEY = "profile.json"


class AutoscalerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        labels = ("namespace", "service", "pool")
        self.desired = Gauge(
            names.AUTOSCALER_DESIRED_REPLICAS,
            "Replicas the autoscaler wants per pool",
            labels,
            registry=self.registry,
        )
        self.decisions = Counter(
            names.AUTOSCALER_DECISIONS_TOTAL,
            "Autoscaler decisions per pool, by reason",
            (*labels, "reason"),
            registry=self.registry,
        )


def pools_of(svc: InferenceService) -> tuple[Pool, ...]:
    """The pools a service's pods serve: mode auto's pods serve any of the three roles."""
    return {Mode.colocated: (Pool.colocated,), Mode.auto: SHAPE_POOLS}.get(
        svc.spec.mode, (Pool.prefill, Pool.decode)
    )


def _now_iso() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def running_by_pod(http: httpx.Client, pods: list[Body]) -> dict[str, float | None]:
    """Running plus waiting sequences per pod, scraped from its /metrics (None when it does not answer)."""
    out: dict[str, float | None] = {}
    for pod in pods:
        name, ip = pod["metadata"]["name"], (pod.get("status") or {}).get("podIP")
        out[name] = None
        if not ip:
            continue
        try:
            samples = parse(http.get(f"http://{ip}:{names.METRICS_PORT}/metrics").text)
        except (httpx.HTTPError, ValueError):
            continue
        held = [
            v
            for (n, _), v in samples.items()
            if n in (names.DECODE_RUNNING_SEQUENCES, names.PREFILL_QUEUED_TOKENS)
        ]
        out[name] = sum(held) if held else None
    return out


def autoscaler_inputs(spec: InferenceServiceSpec, operator_prometheus_url: str | None) -> dict[str, Any]:
    """What the loop runs for a spec (pure): the policy settings, the metric source, the profile it loads."""
    config = policy_config(spec, shipped_profile())
    shape = shape_config(spec, config)
    url = spec.autoscaling.prometheus_url or operator_prometheus_url
    return {
        "config": {k: v for k, v in vars(config).items() if k != "profile"},
        "shape": {k: v for k, v in vars(shape).items() if k != "profile"} if shape else None,
        "source": ("prometheus", url) if url else ("scrape", None),
        "profile": spec.autoscaling.profile,
        "window_s": spec.autoscaling.window_seconds,
        "interval_s": spec.autoscaling.interval_seconds,
    }


@dataclass
class Managed:
    autoscaler: Autoscaler
    actuator: KubeActuator
    generation: int
    next_tick_s: float = 0.0


class KubeAutoscalers:
    """One Autoscaler per InferenceService with autoscaling on, ticked from the operator's event loop."""

    def __init__(
        self,
        kube: Kube,
        cache: ObjectCache,
        prometheus_url: str | None = None,
        metrics: AutoscalerMetrics | None = None,
    ):
        self.kube, self.cache, self.prometheus_url = kube, cache, prometheus_url
        self.metrics = metrics or AutoscalerMetrics()
        self.http = httpx.Client(timeout=2.0)
        # one client for every service's Prometheus: a client of its own would load the CA bundle per service
        self.prometheus_http = httpx.Client(timeout=5.0)
        self.managed: dict[tuple[str, str], Managed] = {}

    def _profile(self, svc: InferenceService) -> Profile:
        name = svc.spec.autoscaling.profile
        if not name:
            return shipped_profile()
        cm = self.kube.get("ConfigMap", svc.namespace, name)
        data = ((cm or {}).get("data") or {}).get(PROFILE_KEY)
        if data is None:
            log.warning(
                "%s/%s: ConfigMap %s has no %s; using the shipped profile",
                svc.namespace,
                svc.name,
                name,
                PROFILE_KEY,
            )
            return shipped_profile()
        return Profile.model_validate(json.loads(data))

    def _source(self, namespace: str, service: str, spec_url: str | None = None) -> MetricSource:
        url = spec_url or self.prometheus_url
        if url:
            return PrometheusSource(url, client=self.prometheus_http)
        selector = f"{names.LABEL_SERVICE}={service}"
        return ScrapeSource(lambda: metrics_targets(self.kube.list("Pod", namespace, selector)))

    def _held(self, source: MetricSource, target: Target, pods: list[Body]) -> dict[str, float | None]:
        """Work each pod holds, from Prometheus (by its `pod` label) or from the pod's own /metrics."""
        if not isinstance(source, PrometheusSource) or not pods:
            return running_by_pod(self.http, pods)
        pool = Pool((pods[0]["metadata"].get("labels") or {}).get(names.LABEL_POOL, "decode"))
        try:
            held = source.held_by_pod(target, pool)
        except MetricsUnavailable:
            held = {}
        return {p["metadata"]["name"]: held.get(p["metadata"]["name"]) for p in pods}

    def _managed(self, obj: Body) -> Managed:
        meta = obj["metadata"]
        key, generation = (meta["namespace"], meta["name"]), meta.get("generation", 1)
        svc = parse_object(obj)
        m = self.managed.get(key)
        if m is None or m.generation != generation:
            pools = pools_of(svc)
            source = self._source(svc.namespace, svc.name, svc.spec.autoscaling.prometheus_url)
            a = svc.spec.autoscaling
            target = Target(
                svc.namespace, svc.name, pools, a.window_seconds, svc.spec.slo.percentile, a.interval_seconds
            )
            actuator = KubeActuator(self.kube, obj, pools, lambda pods: self._held(source, target, pods))
            if m is not None:
                actuator.written = m.actuator.written
            actuator.reshaping = m.actuator.reshaping if m is not None else resumed(obj.get("status") or {})
            config = policy_config(svc.spec, self._profile(svc))
            autoscaler = Autoscaler(target, source, actuator, config, shape_config(svc.spec, config))
            if m is not None:
                autoscaler.state = m.autoscaler.state
            m = self.managed[key] = Managed(autoscaler, actuator, generation)
        m.actuator.owner = obj
        return m

    def tick_one(self, obj: Body, now_s: float) -> None:
        svc = parse_object(obj)
        m = self._managed(obj)
        for pool, replicas in m.actuator.manual_edits().items():
            m.actuator.event(
                "ManualScaleOverridden",
                f"{pool.value} replicas set to {replicas} by hand; autoscaling is on, its next decision wins",
                "Warning",
            )
            m.actuator.written.pop(pool, None)
        seen = observed(
            obj.get("status") or {},
            [p.value for p in m.actuator.pools],
            [pod for pods in m.actuator.pods.values() for pod in pods],
        )
        cold = learn(seen).expected_s()  # a cache hit's and a miss's cold starts, learned apart
        if cold is not None:
            m.autoscaler.config = policy_config(svc.spec, m.autoscaler.config.profile, cold_start_s=cold)
        m.actuator.step_reshape()  # mode auto: the next step of a change of shape under way
        tick = m.autoscaler.tick(now_s)
        attainment: dict[str, float] = {}
        if tick.unavailable is None and isinstance(m.autoscaler.source, PrometheusSource):
            try:
                attainment = m.autoscaler.source.attainment(m.autoscaler.target)
            except MetricsUnavailable:
                pass
        for pool, d in tick.decisions.items():
            labels = {"namespace": svc.namespace, "service": svc.name, "pool": pool.value}
            self.metrics.desired.labels(**labels).set(d.desired)
            self.metrics.decisions.labels(**labels, reason=d.reason_code).inc()
        at = _now_iso()
        self.kube.patch_status(  # on a conflict the reconciler's conditions are read afresh
            KIND,
            obj,
            lambda previous: slo_status(
                tick, svc.spec.slo, svc.spec.autoscaling.window_seconds, attainment, previous, at
            ),
        )

    def due(self, now_s: float) -> list[Body]:
        """InferenceServices whose next tick is due; forgets those that turned autoscaling off or went."""
        out, live = [], set()
        for obj in self.cache.objects(KIND):
            spec = obj.get("spec") or {}
            if not (spec.get("autoscaling") or {}).get("enabled"):
                continue
            key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
            live.add(key)
            m = self.managed.get(key)
            if m is None or now_s >= m.next_tick_s:
                out.append(obj)
        for key in set(self.managed) - live:
            del self.managed[key]
        return out

    def _run(self, obj: Body, now_s: float) -> None:
        key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
        try:
            self.tick_one(obj, now_s)
        except (ApiError, ValueError) as e:
            log.warning("%s/%s: autoscaler tick failed: %s", *key, e)
        except Exception:  # one service's failure must not stop the loop for the others
            log.exception("%s/%s: autoscaler tick failed", *key)
        finally:
            m = self.managed.get(key)
            interval = ((obj.get("spec") or {}).get("autoscaling") or {}).get("intervalSeconds", 15)
            if m is not None:
                m.next_tick_s = now_s + interval

    async def run_forever(self, poll_s: float = 1.0) -> None:
        while True:
            now = time.time()
            for obj in self.due(now):
                await asyncio.to_thread(self._run, obj, now)
            await asyncio.sleep(poll_s)


def prometheus_url_from_env() -> str | None:
    return os.environ.get("TANDEM_PROMETHEUS_URL") or None
