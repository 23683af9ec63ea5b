"""`status`: what the operator and the autoscaler report on an InferenceService, typed so that the CRD's
status schema comes from here (tandem.crdgen); the writers build these objects as dicts."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from tandem.spec_base import Spec


class Status(Spec):
    """A status section: every field optional, each writer fills its own."""


class PoolStatus(Status):
    desired_replicas: int | None = None
    """Replicas the pool should have."""
    ready_replicas: int | None = None
    """Pods that pass their readiness probe."""
    updated_replicas: int | None = None
    """Pods that run the current pod template."""
    serving_replicas: int | None = None
    """With spec.roleFlip: Ready pods whose current role (the serving.tandem.dev/role label) is this pool's,
    from either Deployment."""
    summary: str | None = None
    """ready/desired (with spec.roleFlip, serving/desired)."""


class SloAttainment(Status):
    """Share of requests completed in the window that met each SLO."""

    ttft: float | None = None
    """Share that met the TTFT target."""
    tpot: float | None = None
    """Share that met the TPOT target."""


class SloStatus(Status):
    """The SLO as the autoscaler last observed it (written while autoscaling is on)."""

    percentile: int | None = None
    """The SLO percentile the latencies are observed at."""
    window_seconds: int | None = None
    """The window the latencies and attainment cover."""
    ttft_target_ms: int | None = None
    """spec.slo.ttftMs."""
    tpot_target_ms: int | None = None
    """spec.slo.tpotMs."""
    ttft_ms: float | None = None
    """observed TTFT at the percentile (the prefill pool's SLO)"""
    tpot_ms: float | None = None
    """observed TPOT at the percentile (the decode pool's SLO)"""
    ttft: str | None = None
    """observed/target, e.g. 312/500ms"""
    tpot: str | None = None
    """observed/target, e.g. 41/50ms"""
    attainment: SloAttainment | None = None
    """Share of requests completed in the window that met each SLO."""
    observed_at: datetime | None = None
    """When the autoscaler last read the metrics."""


class AutoscalerPoolStatus(Status):
    """One pool."""

    desired_replicas: int | None = None
    """Replicas the autoscaler wants."""
    ready_replicas: int | None = None
    """Pods Ready."""
    starting_replicas: int | None = None
    """Pods created, not Ready yet (capacity on its way)."""
    draining_replicas: int | None = None
    """Pods being deleted, finishing what they hold."""


class ScalingDecision(Status):
    """The last decision that changed a pool."""

    pool: str | None = None
    """The pool it resized."""
    from_replicas: int | None = None
    """Replicas before."""
    to_replicas: int | None = None
    """Replicas after."""
    reason: str | None = None
    """Why, in words (also the Event message)."""
    reason_code: str | None = None
    """Why, as a CamelCase code (SLOBreach, Forecast, ScaleDownIdle...)."""
    time: datetime | None = None
    """When it was decided."""


class ShapeStatus(Status):
    """mode auto: the shape the pods serve in, and the last change of shape."""

    current: str | None = None
    """Colocated workers ("2 colocated") or a split ("1P+3D"); "changing" while a change is under way."""
    target: str | None = None
    """The shape the last change went to."""
    reason: str | None = None
    """Why the last change was made, in words (also its Event's message)."""
    time: datetime | None = None
    """When the last change was decided."""


class AutoscalingStatus(Status):
    """What the autoscaler wants and sees per pool, and its last scaling decision."""

    pools: dict[str, AutoscalerPoolStatus] | None = None
    """Per pool, as the autoscaler sees it."""
    last_decision: ScalingDecision | None = None
    """The last decision that changed a pool."""
    shape: ShapeStatus | None = None
    """mode auto: the service's shape now and its last change."""


class ColdStart(Status):
    """One pod's start, seconds per phase."""

    pod: str | None = None
    """The pod."""
    ready_at: datetime | None = None
    """When it turned Ready."""
    cache: str | None = None
    """hit (the model was in the cache), miss (it downloaded), none (no download), unknown."""
    scheduled_seconds: float | None = None
    """Created to scheduled."""
    pulled_seconds: float | None = None
    """Scheduled to its first container started (the image pulled)."""
    fetched_seconds: float | None = None
    """The fetch-model init container, start to end (a hit waits for another pod's download or checks the
    files)."""
    loaded_seconds: float | None = None
    """The serving container's start to Ready: weights loaded, warmed up, first readiness probe passed."""
    total_seconds: float | None = None
    """Created to Ready."""


class PhaseMedians(Status):
    """One kind of start."""

    count: int | None = None
    """Starts of this kind kept."""
    scheduled_seconds: float | None = None
    """Median created to scheduled."""
    pulled_seconds: float | None = None
    """Median scheduled to first container started."""
    fetched_seconds: float | None = None
    """Median fetch-model run."""
    loaded_seconds: float | None = None
    """Median serving container start to Ready."""
    total_seconds: float | None = None
    """Median created to Ready."""


class ColdStartStatus(Status):
    """One pool."""

    samples: list[ColdStart] | None = None
    """The last starts, oldest first."""
    last: ColdStart | None = None
    """The newest start."""
    medians: dict[str, PhaseMedians] | None = None
    """Per kind of start (hit, miss, none), the count and each phase's median over the kept starts."""


class ModelCacheStatus(Status):
    """One pool."""

    pods: int | None = None
    """Live pods."""
    cached: int | None = None
    """Pods whose fetch-model finished: the model is there."""
    fetching: int | None = None
    """Pods downloading or waiting for another pod's download."""
    waiting: int | None = None
    """Pods whose fetch has not started."""
    failed: int | None = None
    """Pods whose fetch failed (the kubelet retries it)."""
    hits: int | None = None
    """Pods that found the model in the cache."""
    misses: int | None = None
    """Pods that downloaded it."""
    bytes: int | None = None
    """Bytes those downloads took."""
    error: str | None = None
    """The first failure, in fetch-model's words."""
    fetching_since: datetime | None = None
    """When a running fetch started."""
    max_position_embeddings: int | None = None
    """The model's own context limit (its config.json's max_position_embeddings), as the fetches read it; a
    spec.model.maxContextLength above it is Degraded (ContextExceedsModel)."""


class Condition(Status):
    type: str
    """Ready, Progressing, Degraded or another writer's type."""
    status: Literal["True", "False", "Unknown"]
    """True, False or Unknown."""
    reason: str | None = None
    """One CamelCase word for the cause (for example Unschedulable or ApplyFailed)."""
    message: str | None = None
    """The cause in words, quoting the API server, scheduler or kubelet."""
    observed_generation: int | None = Field(default=None, json_schema_extra={"format": "int64"})
    """The metadata.generation the condition was computed from."""
    last_transition_time: datetime | None = None
    """When status last changed."""


class InferenceServiceStatus(Status):
    """What the operator observed."""

    observed_generation: int | None = Field(default=None, json_schema_extra={"format": "int64"})
    """The metadata.generation this status describes."""
    router_endpoint: str | None = None
    """The router's in-cluster URL (OpenAI API under /v1)."""
    workers: str | None = None
    """ready/desired workers per pool, for example prefill 1/1 decode 2/2 (or colocated 2/2)."""
    pools: dict[str, PoolStatus] | None = None
    """Per pool (prefill, decode, colocated, router) desired and ready replicas."""
    slo: SloStatus | None = None
    """The SLO as the autoscaler last observed it (written while autoscaling is on)."""
    autoscaling: AutoscalingStatus | None = None
    """What the autoscaler wants and sees per pool, and its last scaling decision."""
    cold_start: dict[str, ColdStartStatus] | None = None
    """Per pool, its pods' starts phase by phase (the last 8), and the median of each phase per kind of
    start."""
    model_cache: dict[str, ModelCacheStatus] | None = None
    """Per pool, for a Hugging Face source, its pods' model fetches (the ModelCached condition sums them)."""
    conditions: list[Condition] | None = Field(
        default=None,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    """Ready, Progressing and Degraded (and SLOMet from the autoscaler), each with a reason and the cause in
    the message."""
