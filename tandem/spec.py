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
from typing import Any

import yaml
from pydantic import BaseModel, Field, field_validator, model_validator
from pydantic.alias_generators import to_snake

from tandem.slo import DEFAULT as DEFAULT_SLO
from tandem.slo import Slo
from tandem.spec_base import Spec as _Spec

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


class SecretKeyRef(_Spec):
    name: str
    key: str = "token"


class PvcSource(_Spec):
    claim_name: str
    path: str = ""


class HuggingFaceSource(_Spec):
    repo_id: str
    revision: str = "main"
    token_secret_ref: SecretKeyRef | None = None


SOURCE_EXACTLY_ONE = "spec.model.source must set exactly one of path, pvc, hostPath, image, huggingFace"


class ModelSource(_Spec):
    """Exactly one of: a local/in-pod path, a PVC, a host path, an image, or a Hugging Face repo."""

    path: str | None = None
    pvc: PvcSource | None = None
    host_path: str | None = None
    image: str | None = None
    hugging_face: HuggingFaceSource | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> ModelSource:
        chosen = [k for k in ("path", "pvc", "host_path", "image", "hugging_face") if getattr(self, k)]
        if len(chosen) != 1:
            raise ValueError(f"{SOURCE_EXACTLY_ONE}; got {chosen}")
        return self


class Quantization(StrEnum):
    """Weight quantization applied as the checkpoint loads: `int8` stores every decoder projection and an
    untied lm_head as int8 with one scale per output channel (the embeddings stay in `dtype`)."""

    none = "none"
    int8 = "int8"


# The longest context any served model family has: Llama 4 Scout's 10M tokens. Past it a value is a typo (its
# KV cache alone would need terabytes); the model's own limit is checked once its config is read.
MAX_CONTEXT_LENGTH = 10_000_000


class ModelSpec(_Spec):
    source: ModelSource
    served_name: str
    dtype: Dtype = Dtype.bfloat16
    max_context_length: int = Field(default=4096, gt=0, le=MAX_CONTEXT_LENGTH)
    quantization: Quantization = Quantization.none


class Resources(_Spec):
    gpus: int = Field(default=1, ge=0)
    cpu: str | None = None
    memory: str | None = None


TENSOR_PARALLEL_SIZES = (0, 1, 2, 4, 8, 16, 32, 64)
GPUS_POWER_OF_TWO = ("resources.gpus must be 0, 1 or a power of two up to 64: a worker splits the model across its "
                     "GPUs (tensor parallel) by powers of two")  # fmt: skip


class WorkerResources(Resources):
    """A worker's GPUs: above one, the model is split across them (tensor parallel), by powers of two."""

    gpus: int = Field(default=1, ge=0, le=64)

    @field_validator("gpus")
    @classmethod
    def _splits(cls, gpus: int) -> int:
        if gpus not in TENSOR_PARALLEL_SIZES:
            raise ValueError(f"{GPUS_POWER_OF_TWO}; got {gpus}")
        return gpus


class LocalObjectRef(_Spec):
    name: str = Field(min_length=1)


class VolumeMount(_Spec):
    name: str = Field(min_length=1)
    mount_path: str
    read_only: bool | None = None
    sub_path: str | None = None


class PodTemplateOverlay(_Spec):
    """What a user adds to a pool's pods (Kubernetes only); the CRD refuses what would break the restricted
    Pod Security Standard or the operator's own fields."""

    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    image_pull_secrets: list[LocalObjectRef] = Field(default_factory=list)
    service_account_name: str | None = None
    priority_class_name: str | None = None
    volumes: list[dict[str, Any]] = Field(default_factory=list)
    volume_mounts: list[VolumeMount] = Field(default_factory=list)
    env: list[dict[str, Any]] = Field(default_factory=list)


class PoolSpec(_Spec):
    replicas: int = Field(default=1, ge=0)
    min_replicas: int = Field(default=1, ge=0)
    max_replicas: int = Field(default=4, ge=1)
    resources: WorkerResources = Field(default_factory=WorkerResources)
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[dict[str, Any]] = Field(default_factory=list)
    affinity: dict[str, Any] | None = None
    env: list[dict[str, Any]] = Field(default_factory=list)
    pod_template: PodTemplateOverlay | None = None

    @model_validator(mode="after")
    def _bounds(self) -> PoolSpec:
        if not self.min_replicas <= self.max_replicas:
            raise ValueError(MIN_ABOVE_MAX)
        if not self.min_replicas <= self.replicas <= self.max_replicas:
            raise ValueError(REPLICAS_OUT_OF_BOUNDS)
        return self


MIN_ABOVE_MAX = "minReplicas must be less than or equal to maxReplicas"
REPLICAS_OUT_OF_BOUNDS = "replicas must be between minReplicas and maxReplicas"


class RouterResources(Resources):
    """The router needs no GPU unless asked: `router.resources: {cpu: "1"}` must not request one."""

    gpus: int = Field(default=0, ge=0)


class DisaggregationMode(StrEnum):
    """Where a disaggregated service prefills each prompt: always on the prefill pool, never (on its decode
    worker), or conditionally (short prompts, or a saturated prefill pool, on the decode worker)."""

    always = "always"
    conditional = "conditional"
    never = "never"


class DisaggregationSpec(_Spec):
    mode: DisaggregationMode = DisaggregationMode.always
    # conditional: a prompt with at most this many uncached tokens is prefilled on its decode worker
    local_prefill_max_tokens: int = Field(default=512, ge=0)
    # conditional: once every prefill worker has more prompt tokens than this queued, prompts go to a
    # decode worker with room
    prefill_queue_tokens: int = Field(default=4096, ge=0)
    # conditional: a decode worker takes no local prefill while its streams' recent TPOT is above this
    # fraction of slo.tpotMs (a local prefill stalls every running sequence); 0 turns the check off
    local_prefill_max_tpot_fraction: float = Field(default=0.0, ge=0, le=1)
    # conditional: a prefill worker runs whole requests itself (both phases, Splitwise's mixed pool) while it
    # has fewer than this fraction of the decode worker's streams and its own queue has room; 0 turns it off
    mixed_decode_ratio: float = Field(default=0.0, ge=0, le=1)


class WakeQueueSpec(_Spec):
    """Requests the router holds while a pool they need has no worker (scaled to zero, or its first worker
    still starting), instead of refusing them: at most `maxRequests` at once, each for at most
    `timeoutSeconds`; past either, 503 with Retry-After. `maxRequests: 0` refuses at once."""

    max_requests: int = Field(default=64, ge=0)
    timeout_seconds: int = Field(default=300, gt=0)


class RouterSpec(_Spec):
    replicas: int = Field(default=1, ge=1)
    resources: RouterResources = Field(default_factory=RouterResources)
    max_queued_requests: int = Field(default=256, gt=0)
    disaggregation: DisaggregationSpec = Field(default_factory=DisaggregationSpec)
    wake_queue: WakeQueueSpec = Field(default_factory=WakeQueueSpec)
    pod_template: PodTemplateOverlay | None = None


class SloSpec(_Spec):
    ttft_ms: int = Field(default=int(DEFAULT_SLO.ttft_ms), gt=0)
    tpot_ms: int = Field(default=int(DEFAULT_SLO.tpot_ms), gt=0)
    percentile: int = Field(default=int(DEFAULT_SLO.percentile), gt=0, le=100)

    def to_slo(self) -> Slo:
        return Slo(self.ttft_ms, self.tpot_ms, self.percentile)


AUTOSCALING_FLIP_NEEDS_ROLE_FLIP = (
    "spec.autoscaling.flip.enabled needs roleFlip: true (workers that hold certificates for both roles) and mode "
    "disaggregated"
)


class FlipSpec(_Spec):
    """Role flips as an autoscaling action: a warm worker of the pool with slack serves the breaching pool
    after its drain plus `flipSeconds`, while new pods of the right role start; it flips back once they are Ready."""

    enabled: bool = False
    # A drained worker serves its new role this long after the flip (weights, CUDA context and graphs stay).
    flip_seconds: int = Field(default=2, ge=0, le=600)


class AutoscalingSpec(_Spec):
    enabled: bool = False
    interval_seconds: int = Field(default=15, gt=0)
    window_seconds: int = Field(default=60, gt=0)
    scale_up_cooldown_seconds: int = Field(default=30, ge=0)
    scale_down_cooldown_seconds: int = Field(default=120, ge=0)
    # Scale down only after the need stayed below the current count this long (then one replica per cooldown).
    stabilization_seconds: int = Field(default=180, ge=0)
    # Size each pool for this share of its SLO, and scale down only if N-1 replicas still meet it.
    slo_margin_percent: int = Field(default=80, ge=1, le=100)
    # GPUs both pools may hold together; unset = no shared cap (each pool still has its maxReplicas).
    gpu_budget: int | None = Field(default=None, ge=1)
    # The capacity profile (`tandem profile` JSON): a file path locally, a ConfigMap name on Kubernetes.
    profile: str | None = None
    # Where the autoscaler reads metrics: this Prometheus; unset, the operator's --prometheus-url, else it
    # scrapes the pods' /metrics directly.
    prometheus_url: str | None = Field(default=None, pattern="^https?://")
    flip: FlipSpec = Field(default_factory=FlipSpec)


class Transport(StrEnum):
    """How prefill workers push KV to decode workers: `auto` uses shared memory between workers on one host
    whose caches are on the CPU, else the gRPC stream; `grpc` and `shm` force one (shm: CPU caches, one host)."""

    auto = "auto"
    grpc = "grpc"
    shm = "shm"


class KvTransferSpec(_Spec):
    transport: Transport = Transport.auto
    compression: str = Field(default="none", pattern="^(none|int8)$")
    lease_ms: int = Field(default=30_000, gt=0)


class InferenceServiceSpec(_Spec):
    model: ModelSpec
    mode: Mode = Mode.disaggregated
    image: str = "tandem-worker:0.1.0"
    router: RouterSpec = Field(default_factory=RouterSpec)
    prefill: PoolSpec = Field(default_factory=PoolSpec)
    decode: PoolSpec = Field(default_factory=PoolSpec)
    slo: SloSpec = Field(default_factory=SloSpec)
    autoscaling: AutoscalingSpec = Field(default_factory=AutoscalingSpec)
    # Prefill and decode workers may change role at runtime (SetRole, `tandem flip`, the autoscaler): each
    # holds a certificate naming both roles. Off, each worker's certificate names its one role.
    role_flip: bool = False
    kv_transfer: KvTransferSpec = Field(default_factory=KvTransferSpec)
    engine: EngineSpec = Field(default_factory=EngineSpec)
    security: SecuritySpec = Field(default_factory=SecuritySpec)
    gateway: GatewaySpec | None = None

    @model_validator(mode="after")
    def _flips_need_workers_that_flip(self) -> InferenceServiceSpec:
        if self.autoscaling.flip.enabled and (not self.role_flip or self.mode != Mode.disaggregated):
            raise ValueError(AUTOSCALING_FLIP_NEEDS_ROLE_FLIP)
        return self

    @model_validator(mode="after")
    def _zero_needs_autoscaling(self) -> InferenceServiceSpec:
        pools = {"decode": self.decode} if self.mode is Mode.colocated else {"prefill": self.prefill, "decode": self.decode}
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


MIN_ZERO_NEEDS_AUTOSCALING = "minReplicas 0 needs autoscaling.enabled: only the autoscaler wakes a pool from zero"


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


_POOL_FIELDS = ("replicas", "minReplicas", "maxReplicas", "resources.gpus", "resources.cpu", "resources.memory",
                "nodeSelector", "tolerations", "affinity", "env", "podTemplate")  # fmt: skip
_CONDITIONAL_ONLY = ("localPrefillMaxTokens", "prefillQueueTokens", "localPrefillMaxTpotFraction", "mixedDecodeRatio")
_COLOCATED = "has(self.mode) && self.mode == 'colocated'"

IGNORED_BY_MODE = (
    Ignored("mode colocated", lambda s: s.mode is Mode.colocated, _COLOCATED,
            tuple(f"prefill.{f}" for f in _POOL_FIELDS), "one pool serves both phases, sized by spec.decode"),
    Ignored("mode colocated", lambda s: s.mode is Mode.colocated, _COLOCATED,
            tuple(f"router.disaggregation.{f}" for f in ("mode", *_CONDITIONAL_ONLY)),
            "every prompt is prefilled where it decodes"),
    Ignored("mode colocated", lambda s: s.mode is Mode.colocated, _COLOCATED,
            ("kvTransfer.transport", "kvTransfer.compression", "kvTransfer.leaseMs"), "no KV moves between workers"),
    Ignored("mode colocated", lambda s: s.mode is Mode.colocated, _COLOCATED, ("roleFlip",),
            "only a disaggregated service's workers change role"),
    Ignored("router.disaggregation.mode always or never",
            lambda s: s.mode is Mode.disaggregated and s.router.disaggregation.mode is not DisaggregationMode.conditional,
            "(!has(self.mode) || self.mode == 'disaggregated') && !(has(self.router) && has(self.router.disaggregation)"
            " && has(self.router.disaggregation.mode) && self.router.disaggregation.mode == 'conditional')",
            tuple(f"router.disaggregation.{f}" for f in _CONDITIONAL_ONLY), "only mode conditional reads it"),
)  # fmt: skip


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
        raise ValueError(f"expected kind {KIND} in {API_GROUP}, got {obj.get('kind')!r} {obj.get('apiVersion')!r}")
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
