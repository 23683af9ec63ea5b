"""TandemPool: one child per pool of an InferenceService, with a /scale subresource so kubectl scale, HPA or
KEDA drive that pool's replica count alone. The operator creates and owns these objects; the types give
their CRD (tandem.crdgen)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tandem.spec_base import Spec, cel, rules


class TandemPoolSpec(Spec):
    """The desired size of one pool of an InferenceService; its Deployment follows it. Written through
    /scale."""

    service: str = Field(
        min_length=1, json_schema_extra=rules(cel("self == oldSelf", "spec.service is immutable"))
    )
    """The InferenceService the pool belongs to (immutable)."""
    pool: Literal["prefill", "decode", "colocated"] = Field(
        json_schema_extra=rules(cel("self == oldSelf", "spec.pool is immutable"))
    )
    """prefill, decode or colocated (immutable)."""
    replicas: int = Field(default=1, ge=0)
    """Desired workers. Written by kubectl scale / HPA when the InferenceService's autoscaler is off, by the
    operator when it is on."""


class TandemPoolStatus(Spec):
    """What the pool's Deployment reports."""

    replicas: int | None = None
    """Pods of the pool."""
    ready_replicas: int | None = None
    """Pods that pass their readiness probe."""
    updated_replicas: int | None = None
    """Pods that run the current pod template."""
    selector: str | None = None
    """Label selector of the pool's pods (for HPA and KEDA)."""
    observed_generation: int | None = Field(default=None, json_schema_extra={"format": "int64"})
    """The metadata.generation this status describes."""
