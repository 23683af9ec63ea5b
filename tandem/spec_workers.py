"""`spec.prefill`, `spec.decode` and `spec.kvTransfer`: the worker pools (their replica bounds, resources and
placement) and how KV moves between them."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from tandem.spec_base import Spec, cel, rules
from tandem.spec_k8s import ENV, LABEL_KEYS, LABEL_VALUE, TOLERATION
from tandem.spec_pods import OVERLAY, PodTemplateOverlay, WorkerResources

MIN_ABOVE_MAX = "minReplicas must be less than or equal to maxReplicas"
# The API server's alone: `tandem up` starts a pool below minReplicas (no prefill worker under
# disaggregation mode never), which on Kubernetes takes minReplicas 0 and the autoscaler.
REPLICAS_OUT_OF_BOUNDS = "replicas must be between minReplicas and maxReplicas"


class PoolSpec(Spec):
    model_config = ConfigDict(
        json_schema_extra=rules(
            cel("self.minReplicas <= self.maxReplicas", MIN_ABOVE_MAX, ".minReplicas"),
            cel(
                "self.minReplicas <= self.replicas && self.replicas <= self.maxReplicas",
                REPLICAS_OUT_OF_BOUNDS,
                ".replicas",
            ),
        )
    )

    replicas: int = Field(default=1, ge=0)
    """Initial worker count of this pool; after creation the TandemPool's /scale (kubectl scale, HPA, KEDA or
    the autoscaler) owns it."""
    min_replicas: int = Field(default=1, ge=0)
    """Fewest workers the autoscaler keeps in this pool."""
    max_replicas: int = Field(default=4, ge=1)
    """Most workers the autoscaler gives this pool."""
    resources: WorkerResources = Field(default_factory=WorkerResources)
    """What each worker pod of this pool requests."""
    node_selector: dict[str, str] = Field(
        default_factory=dict,
        max_length=64,
        json_schema_extra=rules(LABEL_KEYS, additionalProperties=LABEL_VALUE),
    )
    """Node labels this pool's pods must run on (Kubernetes pod nodeSelector)."""
    tolerations: list[dict[str, Any]] = Field(
        default_factory=list, max_length=64, json_schema_extra=rules(items=TOLERATION)
    )
    """Taints this pool's pods tolerate (Kubernetes pod tolerations)."""
    affinity: dict[str, Any] | None = None
    """Kubernetes pod affinity for this pool's pods, passed through as written."""
    env: list[dict[str, Any]] = Field(
        default_factory=list, max_length=256, json_schema_extra=rules(items=ENV)
    )
    """Extra environment variables of this pool's worker container."""
    pod_template: PodTemplateOverlay | None = Field(default=None, description=OVERLAY)

    @model_validator(mode="after")
    def _bounds(self) -> PoolSpec:
        if not self.min_replicas <= self.max_replicas:
            raise ValueError(MIN_ABOVE_MAX)
        return self


# The API server checks a CRD's default against the pool's rules before it fills the fields' own defaults, so
# the pools' default names the fields those rules read.
POOL_DEFAULT = PoolSpec().model_dump(by_alias=True, include={"replicas", "min_replicas", "max_replicas"})


class Transport(StrEnum):
    """How prefill workers push KV to decode workers: `auto` uses shared memory between workers on one host
    whose caches are on the CPU, else the gRPC stream; `grpc` and `shm` force one (shm: CPU caches, one
    host)."""

    auto = "auto"
    grpc = "grpc"
    shm = "shm"


class KvTransferSpec(Spec):
    transport: Transport = Transport.auto
    """auto: shared memory between CPU workers on one host, else the gRPC stream; grpc or shm force one."""
    compression: Literal["none", "int8"] = "none"
    """none, or int8 (quantize KV blocks in transit: a quarter of float32's bytes)."""
    lease_ms: int = Field(default=30_000, gt=0)
    """How long a decode worker holds KV blocks reserved for a transfer that has not completed."""
