"""InferenceService spec types shared by the operator, the local backend and the workers.

The same YAML a user `kubectl apply`s is parsed here; camelCase in YAML, snake_case in Python.
Integers in milliseconds, never floats, as the Kubernetes API conventions ask.
The engine (spec_engine.py), security (spec_security.py) and gateway (spec_gateway.py) sections live in
modules of their own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_snake

from tandem.slo import DEFAULT as DEFAULT_SLO
from tandem.slo import Slo
from tandem.spec_base import Spec as _Spec
from tandem.spec_base import cel, rules

# The sections with a module of their own, re-exported: every spec type is named through tandem.spec.
from tandem.spec_engine import DRAFT_MODEL_FOR_DRAFT_ONLY as DRAFT_MODEL_FOR_DRAFT_ONLY
from tandem.spec_engine import KV_INT8_NEEDS_SDPA as KV_INT8_NEEDS_SDPA
from tandem.spec_engine import AttentionBackend as AttentionBackend
from tandem.spec_engine import DecodeStep as DecodeStep
from tandem.spec_engine import DraftModelSpec as DraftModelSpec
from tandem.spec_engine import EngineSpec as EngineSpec
from tandem.spec_engine import KvCacheDtype as KvCacheDtype
from tandem.spec_engine import SpeculativeMethod as SpeculativeMethod
from tandem.spec_engine import SpeculativeSpec as SpeculativeSpec
from tandem.spec_gateway import EndpointPickerRef as EndpointPickerRef
from tandem.spec_gateway import FailureMode as FailureMode
from tandem.spec_gateway import GatewayParentRef as GatewayParentRef
from tandem.spec_gateway import GatewaySpec as GatewaySpec
from tandem.spec_k8s import (
    DNS_SUBDOMAIN,
    ENV,
    LABEL_KEYS,
    LABEL_VALUE,
    OVERLAY_ENV,
    QUANTITY,
    TOLERATION,
    VOLUME,
)
from tandem.spec_security import ApiKeysSpec as ApiKeysSpec
from tandem.spec_security import NetworkPolicySpec as NetworkPolicySpec
from tandem.spec_security import SecuritySpec as SecuritySpec
from tandem.spec_security import TlsMode as TlsMode
from tandem.spec_security import TlsSpec as TlsSpec

API_GROUP = "serving.tandem.dev"
API_VERSION = "v1alpha1"
KIND = "InferenceService"


class Dtype(StrEnum):
    float32 = "float32"
    float16 = "float16"
    bfloat16 = "bfloat16"


class Mode(StrEnum):
    disaggregated = "disaggregated"
    colocated = "colocated"
    auto = "auto"


class SecretKeyRef(_Spec):
    name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)
    """Name of the Secret in the InferenceService's namespace."""
    key: str = Field(default="token", min_length=1, max_length=253, pattern="^[-._a-zA-Z0-9]+$")
    """Key of the token in the Secret."""


class PvcSource(_Spec):
    claim_name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)
    """Name of the PersistentVolumeClaim in the InferenceService's namespace."""
    path: str = ""
    """Folder of the model inside the volume; empty: its root."""


class HuggingFaceSource(_Spec):
    repo_id: str = Field(pattern="^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
    """Repository id, owner/name (for example meta-llama/Llama-3.1-8B-Instruct)."""
    revision: str = Field(default="main", min_length=1)
    """Branch, tag or commit to download."""
    token_secret_ref: SecretKeyRef | None = None
    """Secret holding a Hub token, for gated or private repositories."""


SOURCE_EXACTLY_ONE = "spec.model.source must set exactly one of path, pvc, hostPath, image, huggingFace"


class ModelSource(_Spec):
    """Exactly one of: a local/in-pod path, a PVC, a host path, an image, or a Hugging Face repo."""

    model_config = ConfigDict(
        json_schema_extra=rules(
            cel(
                "[has(self.path), has(self.pvc), has(self.hostPath), has(self.image), "
                "has(self.huggingFace)].filter(x, x).size() == 1",
                SOURCE_EXACTLY_ONE,
            )
        )
    )

    path: str | None = Field(default=None, min_length=1)
    """A path inside the worker container (weights baked into the image)."""
    pvc: PvcSource | None = None
    """Weights on a PersistentVolumeClaim, mounted read-only at /models."""
    host_path: str | None = Field(
        default=None,
        min_length=1,
        json_schema_extra=rules(
            cel("self.startsWith('/')", "spec.model.source.hostPath must be an absolute path")
        ),
    )
    """An absolute folder on every node that runs a pool, mounted read-only at /models."""
    image: str | None = Field(default=None, min_length=1, pattern=r"^\S+$")
    """An image holding the weights under /model."""
    hugging_face: HuggingFaceSource | None = None
    """A Hugging Face Hub repository, downloaded by an init container into an emptyDir."""

    @model_validator(mode="after")
    def _exactly_one(self) -> ModelSource:
        chosen = [k for k in ("path", "pvc", "host_path", "image", "hugging_face") if getattr(self, k)]
        if len(chosen) != 1:
            raise ValueError(f"{SOURCE_EXACTLY_ONE}; got {chosen}")
        return self


class Quantization(StrEnum):
    """Weight quantization applied as the checkpoint loads: `int8` stores every decoder projection and an
    untied lm_head as int8 with one scale per output channel (the embeddings stay in `dtype`); `fp8` stores
    them as float8 e4m3 with one scale per output channel and runs FP8 matmuls (activations quantized per
    token), on GPUs of compute capability 8.9 or newer (Ada, Hopper); an FP8 checkpoint loads as stored."""

    none = "none"
    int8 = "int8"
    fp8 = "fp8"


# The longest context any served model family has: Llama 4 Scout's 10M tokens. Past it a value is a typo (its
# KV cache alone would need terabytes); the model's own limit is checked once its config is read.
MAX_CONTEXT_LENGTH = 10_000_000


class ModelSpec(_Spec):
    source: ModelSource
    """Where the weights come from; exactly one of the fields."""
    served_name: str = Field(min_length=1, max_length=253)
    """The model name clients send in OpenAI requests and /v1/models lists."""
    dtype: Dtype = Dtype.bfloat16
    """Precision of the weights and the KV cache."""
    max_context_length: int = Field(default=4096, gt=0, le=MAX_CONTEXT_LENGTH)
    """Longest sequence (prompt plus output tokens) served; longer prompts are refused with 400. At most
    10,000,000 (the longest context of any model family, Llama 4 Scout's). Above the model's own
    max_position_embeddings, contexts are served up to the model's and the status says Degraded
    (ContextExceedsModel) with both numbers."""
    quantization: Quantization = Quantization.none
    """none, int8 or fp8, for every decoder projection and an untied lm_head, quantized as the checkpoint
    loads (the embeddings stay in dtype): int8 weight-only with one scale per output channel; fp8 e4m3 weights
    with per-channel scales and per-token activations through scaled matmuls (GPUs of compute capability 8.9
    or more; FP8 checkpoints load as stored)."""


class Resources(_Spec):
    gpus: int = Field(default=1, ge=0)
    cpu: str | None = Field(default=None, json_schema_extra=rules(QUANTITY))
    """CPU each pod requests, as a quantity (500m, 2)."""
    memory: str | None = Field(default=None, json_schema_extra=rules(QUANTITY))
    """Memory each pod requests and is limited to, as a quantity (8Gi)."""


TENSOR_PARALLEL_SIZES = (0, 1, 2, 4, 8, 16, 32, 64)
GPUS_POWER_OF_TWO = (
    "resources.gpus must be 0, 1 or a power of two up to 64: a worker splits the model across its "
    "GPUs (tensor parallel) by powers of two"
)


class WorkerResources(Resources):
    """A worker's GPUs: above one, the model is split across them (tensor parallel), by powers of two."""

    gpus: int = Field(
        default=1,
        ge=0,
        le=64,
        json_schema_extra=rules(cel(f"self in {list(TENSOR_PARALLEL_SIZES)}", GPUS_POWER_OF_TWO)),
    )
    """nvidia.com/gpu per worker pod (0: a CPU worker); above 1 the model is split across them (tensor
    parallel), so a power of two that divides the model's attention and KV heads."""

    @field_validator("gpus")
    @classmethod
    def _splits(cls, gpus: int) -> int:
        if gpus not in TENSOR_PARALLEL_SIZES:
            raise ValueError(f"{GPUS_POWER_OF_TWO}; got {gpus}")
        return gpus


class LocalObjectRef(_Spec):
    name: str = Field(min_length=1)
    """A docker-registry Secret's name."""


class VolumeMount(_Spec):
    model_config = ConfigDict(
        json_schema_extra=rules(
            cel(
                "!(self.mountPath in ['/models', '/tmp', '/dev/shm']) && "
                "!self.mountPath.startsWith('/models/') && !self.mountPath.startsWith('/etc/tandem/')",
                "podTemplate mount paths /models, /tmp, /dev/shm and /etc/tandem/ are the operator's",
            )
        )
    )

    name: str = Field(min_length=1)
    """A podTemplate volume's name."""
    mount_path: str = Field(pattern="^/")
    """Where in the container (absolute)."""
    read_only: bool | None = None
    """Mount read-only."""
    sub_path: str | None = None
    """A path inside the volume to mount instead of its root."""


OVERLAY = (
    "Merged onto the pod template the operator renders for this pool: labels, annotations, image pull "
    "secrets, service account, priority class, extra volumes mounted into the main container, extra "
    "environment. Refused here where it would break the restricted Pod Security Standard or touch what the "
    "operator owns (its labels and annotations, volume names and mount paths, TANDEM_ variables)."
)


class PodTemplateOverlay(_Spec):
    """What a user adds to a pool's pods (Kubernetes only); the CRD refuses what would break the restricted
    Pod Security Standard or the operator's own fields."""

    model_config = ConfigDict(
        json_schema_extra=rules(
            cel(
                "!has(self.volumeMounts) || self.volumeMounts.all(m, has(self.volumes) && "
                "self.volumes.exists(v, v.name == m.name))",
                "podTemplate.volumeMounts must each name a volume of podTemplate.volumes",
                ".volumeMounts",
            )
        )
    )

    labels: dict[str, str] = Field(
        default_factory=dict,
        max_length=64,
        json_schema_extra=rules(
            cel(
                "self.all(k, !k.startsWith('serving.tandem.dev/') && !k.startsWith('app.kubernetes.io/'))",
                "podTemplate.labels may not set serving.tandem.dev/ or app.kubernetes.io/ labels: the "
                "operator's selectors use them",
            ),
            additionalProperties={"type": "string", "maxLength": 63},
        ),
    )
    """Extra pod labels."""
    annotations: dict[str, str] = Field(
        default_factory=dict,
        max_length=64,
        json_schema_extra=rules(
            cel(
                "self.all(k, !k.startsWith('serving.tandem.dev/') && !k.startsWith('prometheus.io/'))",
                "podTemplate.annotations may not set serving.tandem.dev/ or prometheus.io/ annotations: the "
                "operator sets them",
            )
        ),
    )
    """Extra pod annotations."""
    image_pull_secrets: list[LocalObjectRef] = Field(default_factory=list, max_length=16)
    """Secrets (in the InferenceService's namespace) to pull the images with."""
    service_account_name: str | None = Field(default=None, pattern=DNS_SUBDOMAIN, max_length=253)
    """The pods' ServiceAccount (its token stays unmounted: automountServiceAccountToken is false; mount a
    projected token volume if the pod needs one)."""
    priority_class_name: str | None = Field(default=None, max_length=253)
    """The pods' PriorityClass."""
    volumes: list[dict[str, Any]] = Field(
        default_factory=list, max_length=32, json_schema_extra=rules(items=VOLUME)
    )
    """Extra volumes, of the kinds the restricted Pod Security Standard allows: configMap, secret, emptyDir,
    persistentVolumeClaim, projected, downwardAPI, csi or ephemeral (hostPath and the rest are refused)."""
    volume_mounts: list[VolumeMount] = Field(default_factory=list, max_length=32)
    """Mounts of podTemplate.volumes into the pool's main container."""
    env: list[dict[str, Any]] = Field(
        default_factory=list, max_length=256, json_schema_extra=rules(items=OVERLAY_ENV)
    )
    """Extra environment variables of the pool's main container (TANDEM_ ones are the operator's)."""


MIN_ABOVE_MAX = "minReplicas must be less than or equal to maxReplicas"
# The API server's alone: `tandem up` starts a pool below minReplicas (no prefill worker under
# disaggregation mode never), which on Kubernetes takes minReplicas 0 and the autoscaler.
REPLICAS_OUT_OF_BOUNDS = "replicas must be between minReplicas and maxReplicas"


class PoolSpec(_Spec):
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


class RouterResources(Resources):
    """The router needs no GPU unless asked: `router.resources: {cpu: "1"}` must not request one."""

    gpus: int = Field(default=0, ge=0)
    """nvidia.com/gpu per router pod; the router needs none."""


class DisaggregationMode(StrEnum):
    """Where a disaggregated service prefills each prompt: always on the prefill pool, never (on its decode
    worker), or conditionally (short prompts, or a saturated prefill pool, on the decode worker)."""

    always = "always"
    conditional = "conditional"
    never = "never"


class DisaggregationSpec(_Spec):
    mode: DisaggregationMode = DisaggregationMode.always
    """always: every prompt on the prefill pool, its KV moved to a decode worker; never: every prompt on its
    decode worker; conditional: short prompts, or any prompt while the prefill pool is saturated, on the
    decode worker."""
    local_prefill_max_tokens: int = Field(default=512, ge=0)
    """conditional: prompts of at most this many tokens the decode worker has not cached are prefilled there
    (the router counts the whole prompt as uncached)."""
    prefill_queue_tokens: int = Field(default=4096, ge=0)
    """conditional: once every prefill worker has more prompt tokens than this queued, a decode worker with
    free KV blocks (and no more queued prompt tokens itself) prefills."""
    local_prefill_max_tpot_fraction: float = Field(default=0.0, ge=0, le=1)
    """conditional: a decode worker whose streams' recent TPOT is above this fraction of slo.tpotMs takes no
    local prefill (it would stall every running sequence), so the prompt goes to the prefill pool; 0 turns
    the check off."""
    mixed_decode_ratio: float = Field(default=0.0, ge=0, le=1)
    """conditional: a prefill worker runs whole requests itself (both phases, no KV transfer) while it has
    fewer than this fraction of the chosen decode worker's streams and no more than prefillQueueTokens
    queued, so an idle prefill pool takes decode work off a busy decode pool (Splitwise's mixed pool); 0
    turns it off."""


class WakeQueueSpec(_Spec):
    """Requests the router holds while a pool they need has no worker (scaled to zero, or its first worker
    still starting), instead of refusing them: at most `maxRequests` at once, each for at most
    `timeoutSeconds`; past either, 503 with Retry-After. `maxRequests: 0` refuses at once."""

    max_requests: int = Field(default=64, ge=0)
    """Requests held at once; more get 503 with Retry-After (0: refuse at once)."""
    timeout_seconds: int = Field(default=300, gt=0)
    """Longest a request is held before 503 with Retry-After; a request answered after a hold says how long in
    X-Tandem-Cold-Start-Ms."""


class RouterSpec(_Spec):
    replicas: int = Field(default=1, ge=1)
    """Router pods (each talks to every worker)."""
    resources: RouterResources = Field(default_factory=RouterResources)
    """What each router pod requests."""
    max_queued_requests: int = Field(default=256, gt=0)
    """Requests a router holds waiting for a worker before it answers 429."""
    disaggregation: DisaggregationSpec = Field(default_factory=DisaggregationSpec)
    """Where a disaggregated service prefills each prompt. Each request's choice is the prefill label of
    tandem_ttft_seconds and tandem_requests_total, and the X-Tandem-Prefill response header."""
    wake_queue: WakeQueueSpec = Field(default_factory=WakeQueueSpec)
    """Requests the router holds while a pool they need has no worker (scaled to zero, or its first worker
    still starting), instead of refusing them; past either bound, 503 with Retry-After. Held requests are
    the tandem_router_held_requests metric the autoscaler wakes a pool on."""
    pod_template: PodTemplateOverlay | None = Field(default=None, description=OVERLAY)


class SloSpec(_Spec):
    ttft_ms: int = Field(default=int(DEFAULT_SLO.ttft_ms), gt=0)
    """Time to first token objective, in milliseconds (sizes the prefill pool)."""
    tpot_ms: int = Field(default=int(DEFAULT_SLO.tpot_ms), gt=0)
    """Time per output token objective, in milliseconds (sizes the decode pool)."""
    percentile: int = Field(default=int(DEFAULT_SLO.percentile), gt=0, le=100)
    """The share of requests, in percent, that must meet ttftMs and tpotMs."""

    def to_slo(self) -> Slo:
        return Slo(self.ttft_ms, self.tpot_ms, self.percentile)


AUTOSCALING_FLIP_NEEDS_ROLE_FLIP = (
    "spec.autoscaling.flip.enabled needs roleFlip: true (workers that hold certificates for both roles) and "
    "mode disaggregated or auto"
)
AUTO_NEEDS_AUTOSCALING = (
    "spec.mode auto needs autoscaling.enabled and roleFlip: true: the autoscaler chooses the shape "
    "(colocated workers or a prefill/decode split) and changes it by flipping warm workers, which hold "
    "certificates for every worker role"
)


class FlipSpec(_Spec):
    """Role flips as an autoscaling action: a warm worker of the pool with slack serves the breaching pool
    after its drain plus `flipSeconds`, while new pods of the right role start; it flips back once they are
    Ready."""

    enabled: bool = False
    """Let the autoscaler flip workers between the prefill and decode roles."""
    flip_seconds: int = Field(default=2, ge=0, le=600)
    """How long a drained worker takes to serve its new role (the autoscaler weighs drain plus this against a
    cold start)."""


class ShapeSpec(_Spec):
    """How mode auto changes the shape: colocated workers or a prefill/decode split, whichever the capacity
    model says serves the load at the SLO on fewer GPUs."""

    dwell_seconds: int = Field(default=600, ge=0)
    """No change of shape sooner than this after the last one."""
    band_percent: int = Field(default=10, ge=0, le=90)
    """The other shape must need at least this share fewer GPUs (and at least one fewer) than the current
    one."""
    horizon_seconds: int = Field(default=1800, gt=0)
    """The GPUs a change saves over this long must repay its cost (every worker drains and flips)."""


class AutoscalingSpec(_Spec):
    enabled: bool = False
    """Turn the built-in autoscaler on; off, kubectl scale, HPA or KEDA own the counts."""
    interval_seconds: int = Field(default=15, gt=0)
    """How often the autoscaler decides."""
    window_seconds: int = Field(default=60, gt=0)
    """How much recent traffic each decision looks at."""
    scale_up_cooldown_seconds: int = Field(default=30, ge=0)
    """Least time between two scale-ups of a pool."""
    scale_down_cooldown_seconds: int = Field(default=120, ge=0)
    """Least time between two scale-downs of a pool (one replica each)."""
    stabilization_seconds: int = Field(default=180, ge=0)
    """How long the need must stay below the current count before a pool scales down."""
    slo_margin_percent: int = Field(default=80, ge=1, le=100)
    """Size each pool for this share of its SLO; scale down only if one replica fewer still meets it."""
    gpu_budget: int | None = Field(default=None, ge=1)
    """GPUs both pools may hold together; unset: no shared cap (each pool keeps its maxReplicas)."""
    profile: str | None = None
    """The capacity profile (tandem profile JSON): a ConfigMap name on Kubernetes, a file path locally."""
    prometheus_url: str | None = Field(default=None, pattern="^https?://")
    """Prometheus HTTP API the autoscaler reads; unset, the operator's --prometheus-url, else a direct scrape
    of the pods."""
    shape: ShapeSpec = Field(default_factory=ShapeSpec)
    """mode auto: when the autoscaler collapses the split to colocated workers or splits them."""
    flip: FlipSpec = Field(default_factory=FlipSpec)
    """Role flips as a scaling action: when one pool breaches its SLO and the other has slack that survives
    losing a worker, a warm worker changes role (drain, then flipSeconds) while new pods start; it flips
    back once they are Ready."""


class Transport(StrEnum):
    """How prefill workers push KV to decode workers: `auto` uses shared memory between workers on one host
    whose caches are on the CPU, else the gRPC stream; `grpc` and `shm` force one (shm: CPU caches, one
    host)."""

    auto = "auto"
    grpc = "grpc"
    shm = "shm"


class KvTransferSpec(_Spec):
    transport: Transport = Transport.auto
    """auto: shared memory between CPU workers on one host, else the gRPC stream; grpc or shm force one."""
    compression: Literal["none", "int8"] = "none"
    """none, or int8 (quantize KV blocks in transit: a quarter of float32's bytes)."""
    lease_ms: int = Field(default=30_000, gt=0)
    """How long a decode worker holds KV blocks reserved for a transfer that has not completed."""


# The API server checks a CRD's default against the pool's rules before it fills the fields' own defaults, so
# the pools' default names the fields those rules read.
POOL_DEFAULT = PoolSpec().model_dump(by_alias=True, include={"replicas", "min_replicas", "max_replicas"})


def _spec_rules(schema: dict[str, Any]) -> None:
    """The CRD's rules across sections of the spec, each naming its field (fieldPath) in the types' words."""
    autoscaled = "has(self.autoscaling) && has(self.autoscaling.enabled) && self.autoscaling.enabled"
    flips = (
        "has(self.autoscaling) && has(self.autoscaling.flip) && has(self.autoscaling.flip.enabled) && "
        "self.autoscaling.flip.enabled"
    )
    schema["x-kubernetes-validations"] = [
        cel(
            f"{autoscaled} || !has(self.decode) || !has(self.decode.minReplicas) || self.decode.minReplicas "
            "> 0",
            f"spec.decode.{MIN_ZERO_NEEDS_AUTOSCALING}",
            ".decode.minReplicas",
        ),
        cel(
            f"{autoscaled} || {_COLOCATED} || !has(self.prefill) || !has(self.prefill.minReplicas) || "
            "self.prefill.minReplicas > 0",
            f"spec.prefill.{MIN_ZERO_NEEDS_AUTOSCALING}",
            ".prefill.minReplicas",
        ),
        cel(
            f"!({flips}) || has(self.roleFlip) && self.roleFlip && (!has(self.mode) || self.mode != "
            "'colocated')",
            AUTOSCALING_FLIP_NEEDS_ROLE_FLIP,
            ".autoscaling.flip.enabled",
        ),
        cel(
            f"!has(self.mode) || self.mode != 'auto' || {autoscaled} && has(self.roleFlip) && self.roleFlip",
            AUTO_NEEDS_AUTOSCALING,
            ".mode",
        ),
        *(rule.crd_rule(path) for rule in IGNORED_BY_MODE for path in rule.fields),
    ]


class InferenceServiceSpec(_Spec):
    """What to serve and how: the model, its prefill and decode pools, the router, SLOs and autoscaling."""

    model_config = ConfigDict(json_schema_extra=_spec_rules)

    model: ModelSpec
    """The model to serve."""
    mode: Mode = Mode.disaggregated
    """colocated runs prefill and decode in one pool (sized by spec.decode), the baseline; auto lets the
    autoscaler choose between colocated workers and the split as the load and the SLO call for (it needs
    autoscaling.enabled and roleFlip)."""
    image: str = Field(default="tandem-worker:0.1.0", min_length=1, pattern=r"^\S+$")
    """The tandem image every worker and router container runs."""
    router: RouterSpec = Field(default_factory=RouterSpec)
    """The OpenAI-compatible router Deployment in front of the pools."""
    prefill: PoolSpec = Field(default_factory=PoolSpec, json_schema_extra={"default": POOL_DEFAULT})
    """The prefill pool (prompt processing; sets TTFT). In colocated mode spec.decode sizes the one pool, and
    a prefill setting other than its default is refused."""
    decode: PoolSpec = Field(default_factory=PoolSpec, json_schema_extra={"default": POOL_DEFAULT})
    """The decode pool (token generation; sets TPOT). In colocated mode it sizes the one pool."""
    slo: SloSpec = Field(default_factory=SloSpec)
    """Latency objectives: the router reports attainment against them and the autoscaler sizes each pool for
    them."""
    autoscaling: AutoscalingSpec = Field(default_factory=AutoscalingSpec)
    """The built-in SLO autoscaler. While enabled it owns each pool's replica count, within minReplicas and
    maxReplicas."""
    role_flip: bool = False
    """Workers may change role at runtime (the autoscaler, or the serving.tandem.dev/role label): each holds a
    certificate naming every worker role (prefill, decode, colocated)."""
    kv_transfer: KvTransferSpec = Field(default_factory=KvTransferSpec)
    """How prefill workers hand the KV cache to decode workers."""
    engine: EngineSpec = Field(default_factory=EngineSpec)
    """The inference engine inside each worker."""
    security: SecuritySpec = Field(default_factory=SecuritySpec)
    """Who may call the service and how its hops are protected."""
    gateway: GatewaySpec | None = None
    """Routing from Gateway API Gateways: the operator renders an InferencePool
    (inference.networking.k8s.io/v1, named <name>-router) selecting the router pods, and an HTTPRoute
    (<name>-router) that sends requests whose X-Gateway-Model-Name header is model.servedName (set from the
    body's model by the Inference Extension's body-based routing) to it. Needs the Gateway API and Inference
    Extension CRDs. Unset: no Gateway objects."""

    @model_validator(mode="after")
    def _flips_need_workers_that_flip(self) -> InferenceServiceSpec:
        if self.autoscaling.flip.enabled and (not self.role_flip or self.mode is Mode.colocated):
            raise ValueError(AUTOSCALING_FLIP_NEEDS_ROLE_FLIP)
        return self

    @model_validator(mode="after")
    def _auto_needs_the_autoscaler_and_flips(self) -> InferenceServiceSpec:
        if self.mode is Mode.auto and not (self.autoscaling.enabled and self.role_flip):
            raise ValueError(AUTO_NEEDS_AUTOSCALING)
        return self

    @model_validator(mode="after")
    def _zero_needs_autoscaling(self) -> InferenceServiceSpec:
        pools = (
            {"decode": self.decode}
            if self.mode is Mode.colocated
            else {"prefill": self.prefill, "decode": self.decode}
        )
        for pool, p in pools.items():
            if not self.autoscaling.enabled and p.min_replicas == 0:
                raise ValueError(f"spec.{pool}.{MIN_ZERO_NEEDS_AUTOSCALING}")
        return self

    @model_validator(mode="after")
    def _nothing_the_mode_ignores(self) -> InferenceServiceSpec:
        for rule in IGNORED_BY_MODE:
            if rule.applies(self):
                for path in rule.fields:
                    if _at(self, path) != _at(_DEFAULTS, path):
                        raise ValueError(rule.message(path))
        return self


MIN_ZERO_NEEDS_AUTOSCALING = (
    "minReplicas 0 needs autoscaling.enabled: only the autoscaler wakes a pool from zero"
)


@dataclass(frozen=True)
class Ignored:
    """Settings a mode never reads: refused unless left at their default, so a spec says only what runs.
    `when` is the mode in words and `cel` the same test over the CRD's `self` (the spec); `fields` the
    settings, as the YAML spells their paths below spec."""

    when: str
    applies: Callable[[InferenceServiceSpec], bool]
    cel: str
    fields: tuple[str, ...]
    why: str

    def message(self, path: str) -> str:
        return f"spec.{path} is ignored in {self.when}: {self.why}"

    def crd_rule(self, path: str) -> dict[str, str]:
        """The CRD's rule for one of the settings: outside the mode, unset, or at its default."""
        parts = path.split(".")
        unset = [f"!has(self.{'.'.join(parts[: i + 1])})" for i in range(len(parts))]
        default = _at(_DEFAULTS, path)
        if isinstance(default, dict | list):
            unset.append(f"size(self.{path}) == 0")
        elif default is not None:
            unset.append(f"self.{path} == {_cel_literal(default)}")
        return cel(f"!({self.cel}) || {' || '.join(unset)}", self.message(path), f".{path}")


_POOL_FIELDS = (
    "replicas",
    "minReplicas",
    "maxReplicas",
    "resources.gpus",
    "resources.cpu",
    "resources.memory",
    "nodeSelector",
    "tolerations",
    "affinity",
    "env",
    "podTemplate",
)
_CONDITIONAL_ONLY = (
    "localPrefillMaxTokens",
    "prefillQueueTokens",
    "localPrefillMaxTpotFraction",
    "mixedDecodeRatio",
)
_COLOCATED = "has(self.mode) && self.mode == 'colocated'"

IGNORED_BY_MODE = (
    Ignored(
        "mode colocated",
        lambda s: s.mode is Mode.colocated,
        _COLOCATED,
        tuple(f"prefill.{f}" for f in _POOL_FIELDS),
        "one pool serves both phases, sized by spec.decode",
    ),
    Ignored(
        "mode colocated",
        lambda s: s.mode is Mode.colocated,
        _COLOCATED,
        tuple(f"router.disaggregation.{f}" for f in ("mode", *_CONDITIONAL_ONLY)),
        "every prompt is prefilled where it decodes",
    ),
    Ignored(
        "mode colocated",
        lambda s: s.mode is Mode.colocated,
        _COLOCATED,
        ("kvTransfer.transport", "kvTransfer.compression", "kvTransfer.leaseMs"),
        "no KV moves between workers",
    ),
    Ignored(
        "mode colocated",
        lambda s: s.mode is Mode.colocated,
        _COLOCATED,
        ("roleFlip",),
        "only a disaggregated service's workers change role",
    ),
    Ignored(
        "router.disaggregation.mode always or never",
        lambda s: (
            s.mode is not Mode.colocated
            and s.router.disaggregation.mode is not DisaggregationMode.conditional
        ),
        "(!has(self.mode) || self.mode != 'colocated') && !(has(self.router) && "
        "has(self.router.disaggregation) && has(self.router.disaggregation.mode) && "
        "self.router.disaggregation.mode == 'conditional')",
        tuple(f"router.disaggregation.{f}" for f in _CONDITIONAL_ONLY),
        "only mode conditional reads it",
    ),
)


def _cel_literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):  # a StrEnum too
        return f"'{value}'"
    return repr(value)


def _at(spec: BaseModel, path: str) -> Any:
    """The value at a YAML path below spec (`prefill.resources.gpus`)."""
    node: Any = spec
    for alias in path.split("."):
        node = getattr(node, to_snake(alias))
    return node


_DEFAULTS = InferenceServiceSpec.model_construct()


class InferenceService(BaseModel):
    """A whole object as read from YAML: name, namespace and the spec."""

    name: str
    namespace: str = "default"
    spec: InferenceServiceSpec


def parse_object(obj: dict[str, Any]) -> InferenceService:
    """Validate a YAML/JSON InferenceService object; raises ValueError with the field path on bad input."""
    if obj.get("kind") != KIND or not str(obj.get("apiVersion", "")).startswith(API_GROUP + "/"):
        raise ValueError(
            f"expected kind {KIND} in {API_GROUP}, got {obj.get('kind')!r} {obj.get('apiVersion')!r}"
        )
    meta = obj.get("metadata") or {}
    if not meta.get("name"):
        raise ValueError("metadata.name is required")
    return InferenceService(
        name=meta["name"],
        namespace=meta.get("namespace", "default"),
        spec=InferenceServiceSpec.model_validate(obj.get("spec") or {}),
    )


def load_file(path: str | Path) -> InferenceService:
    """Read the first InferenceService document from a YAML file."""
    for doc in yaml.safe_load_all(Path(path).read_text()):
        if doc and doc.get("kind") == KIND:
            return parse_object(doc)
    raise ValueError(f"{path}: no {KIND} document found")
