"""InferenceService spec types shared by the operator, the local backend and the workers.

The same YAML a user `kubectl apply`s is parsed here; camelCase in YAML, snake_case in Python.
Integers in milliseconds, never floats, as the Kubernetes API conventions ask.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from tandem.slo import DEFAULT as DEFAULT_SLO
from tandem.slo import Slo

API_GROUP = "serving.tandem.dev"
API_VERSION = "v1alpha1"
KIND = "InferenceService"


class _Spec(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


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
            raise ValueError(f"model.source needs exactly one of path, pvc, hostPath, image, huggingFace; got {chosen}")
        return self


class Quantization(StrEnum):
    """Weight quantization applied as the checkpoint loads: `int8` stores every decoder projection and an
    untied lm_head as int8 with one scale per output channel (the embeddings stay in `dtype`)."""

    none = "none"
    int8 = "int8"


class ModelSpec(_Spec):
    source: ModelSource
    served_name: str
    dtype: Dtype = Dtype.bfloat16
    max_context_length: int = Field(default=4096, gt=0)
    quantization: Quantization = Quantization.none


class Resources(_Spec):
    gpus: int = Field(default=1, ge=0)
    cpu: str | None = None
    memory: str | None = None


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
    resources: Resources = Field(default_factory=Resources)
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[dict[str, Any]] = Field(default_factory=list)
    affinity: dict[str, Any] | None = None
    env: list[dict[str, Any]] = Field(default_factory=list)
    pod_template: PodTemplateOverlay | None = None

    @model_validator(mode="after")
    def _bounds(self) -> PoolSpec:
        if not self.min_replicas <= self.max_replicas:
            raise ValueError("minReplicas must be <= maxReplicas")
        return self


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


class RouterSpec(_Spec):
    replicas: int = Field(default=1, ge=1)
    resources: RouterResources = Field(default_factory=RouterResources)
    max_queued_requests: int = Field(default=256, gt=0)
    disaggregation: DisaggregationSpec = Field(default_factory=DisaggregationSpec)
    pod_template: PodTemplateOverlay | None = None


class SloSpec(_Spec):
    ttft_ms: int = Field(default=int(DEFAULT_SLO.ttft_ms), gt=0)
    tpot_ms: int = Field(default=int(DEFAULT_SLO.tpot_ms), gt=0)
    percentile: int = Field(default=int(DEFAULT_SLO.percentile), gt=0, le=100)

    def to_slo(self) -> Slo:
        return Slo(self.ttft_ms, self.tpot_ms, self.percentile)


AUTOSCALING_FLIP_NEEDS_ROLE_FLIP = (
    "autoscaling.flip.enabled needs roleFlip: true (workers that hold certificates for both roles) and mode "
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


class AttentionBackend(StrEnum):
    sdpa = "sdpa"  # the reference: each context gathered from the paged cache, then SDPA
    flex = "flex"  # FlexAttention reading the paged cache in place (compiled on CUDA)


class SpeculativeMethod(StrEnum):
    ngram = "ngram"  # prompt lookup: drafts copied from where the text's last n-gram occurred before
    draft = "draft"  # self-speculative: the model's own first layers draft (early exit), see draftModel


class DraftModelSpec(_Spec):
    """The draft of method `draft`: the served model's first `layers` layers, then its final norm and LM
    head. Their KV is the target's own (already in the cache the prefill worker sent), so drafting needs no
    second checkpoint and no KV memory of its own; `layers` must be below the model's layer count."""

    layers: int = Field(ge=1)


DRAFT_MODEL_FOR_DRAFT_ONLY = "engine.speculative.draftModel is required by method draft and only by it"


class SpeculativeSpec(_Spec):
    """Speculative decoding in the decode pool: `numTokens` drafts per sequence per step, verified by the
    model in one batched pass; greedy output is unchanged, sampled output keeps its distribution (rejection
    sampling), and a sequence whose drafts keep failing decodes plainly for a while."""

    method: SpeculativeMethod = SpeculativeMethod.ngram
    num_tokens: int = Field(default=4, ge=1, le=16)
    draft_model: DraftModelSpec | None = None  # method draft only

    @model_validator(mode="after")
    def _draft_model_with_its_method(self) -> SpeculativeSpec:
        if (self.method is SpeculativeMethod.draft) != (self.draft_model is not None):
            raise ValueError(DRAFT_MODEL_FOR_DRAFT_ONLY)
        return self


class KvCacheDtype(StrEnum):
    """How the paged KV cache stores keys and values: `auto` in model.dtype; `int8` as int8 with one
    float32 scale per token and head (about twice the sequences in the same memory; sdpa attention only).
    With an int8 cache, kvTransfer.compression int8 is a no-op: the blocks travel as they are stored."""

    auto = "auto"
    int8 = "int8"


class DecodeStep(StrEnum):
    """How the decode pool runs a pure-decode step (every sequence one new token): `eager` the general path;
    `compiled` one static-shape step padded to batch and page-table buckets, torch.compiled whole (CPU or
    CUDA); `cudaGraphs` that step captured as a CUDA graph per bucket (CUDA only: a worker without CUDA
    refuses to start). Other steps (prompts, verifying drafts) take the general path either way; the worker
    warms every bucket up before it reports ready."""

    eager = "eager"
    compiled = "compiled"
    cudaGraphs = "cudaGraphs"  # noqa: N815 (the value as YAML spells it)


KV_INT8_NEEDS_SDPA = (
    "engine.kvCacheDtype int8 needs engine.attention sdpa: the flex backend reads the cache in place and "
    "cannot unpack 8-bit pages"
)


class EngineSpec(_Spec):
    block_size: int = Field(default=16, gt=0)
    # KV cache share of the GPU memory left once the weights are in, less a warm-up batch's activations
    # (CPU: of a 1 GiB budget); numKvBlocks, when set, fixes the number instead.
    kv_cache_memory_percent: int = Field(default=90, gt=0, le=100)
    num_kv_blocks: int | None = Field(default=None, gt=0)
    max_running_sequences: int = Field(default=64, gt=0)
    max_batch_tokens: int = Field(default=2048, gt=0)
    prefill_chunk_tokens: int = Field(default=512, gt=0)
    # Stall-free batching: a step that carries decodes carries at most this many prompt tokens (unset: no cap)
    max_prefill_tokens_with_decodes: int | None = Field(default=None, gt=0)
    threads: int | None = Field(default=None, gt=0)
    attention: AttentionBackend = AttentionBackend.sdpa
    compile: bool = False
    decode_step: DecodeStep = DecodeStep.eager
    speculative: SpeculativeSpec | None = None  # unset: no speculative decoding
    kv_cache_dtype: KvCacheDtype = KvCacheDtype.auto

    @model_validator(mode="after")
    def _kv_cache_readable(self) -> EngineSpec:
        if self.kv_cache_dtype is KvCacheDtype.int8 and self.attention is AttentionBackend.flex:
            raise ValueError(KV_INT8_NEEDS_SDPA)
        return self


class ApiKeysSpec(_Spec):
    """Router API keys (`Authorization: Bearer`), one per line: the `key` of Secret `secretName` on
    Kubernetes, or the file `file` locally. Probes stay open; /metrics too unless `protectMetrics`."""

    secret_name: str | None = Field(default=None, min_length=1)
    key: str = Field(default="api-keys", min_length=1)
    file: str | None = Field(default=None, min_length=1)
    protect_metrics: bool = False

    @model_validator(mode="after")
    def _one_source(self) -> ApiKeysSpec:
        if not (self.secret_name or self.file):
            raise ValueError("security.apiKeys needs secretName (Kubernetes) or file (local)")
        return self


class TlsMode(StrEnum):
    auto = "auto"  # mutual TLS with per-role certificates: issued by the operator or `tandem up` unless given
    off = "off"  # plaintext gRPC: any pod that reaches a worker port may call it (a Warning says so)


class TlsSpec(_Spec):
    """Mutual TLS on every gRPC hop (router to workers, prefill to decode), on unless `mode: off`. Each
    process has its role's certificate (tandem.identity): the operator issues them into a Secret per service
    and `tandem up` under its run directory, unless `secretName` names cert-manager-style Secrets
    `<secretName>-<role>` (tls.crt, tls.key, ca.crt) or, locally, `dir` holds folders `<dir>/<role>/`.
    `tls: off` is short for `tls: {mode: off}`."""

    mode: TlsMode = TlsMode.auto
    secret_name: str | None = Field(default=None, min_length=1)
    dir: str | None = Field(default=None, min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        if value is False or value == "off":  # YAML reads an unquoted `off` as false
            return {"mode": "off"}
        if value is None or value is True or value == "on":  # null: the default, on
            return {}
        return value

    @model_validator(mode="after")
    def _sources_need_tls(self) -> TlsSpec:
        if self.mode is TlsMode.off and (self.secret_name or self.dir):
            raise ValueError("security.tls: mode off takes no secretName or dir")
        return self

    @property
    def enabled(self) -> bool:
        return self.mode is not TlsMode.off


PROMETHEUS_PEER: dict[str, Any] = {
    "namespaceSelector": {}, "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
}  # fmt: skip


class NetworkPolicySpec(_Spec):
    """One NetworkPolicy per pool: clients to the router, the router to the workers, prefill to decode,
    `metricsFrom` (NetworkPolicyPeers; default: Prometheus pods in any namespace) to the metrics ports."""

    enabled: bool = True
    metrics_from: list[dict[str, Any]] = Field(default_factory=lambda: [dict(PROMETHEUS_PEER)])


class SecuritySpec(_Spec):
    api_keys: ApiKeysSpec | None = None
    tls: TlsSpec = Field(default_factory=TlsSpec)
    network_policy: NetworkPolicySpec = Field(default_factory=NetworkPolicySpec)


class GatewayParentRef(_Spec):
    """A Gateway (gateway.networking.k8s.io) the service's HTTPRoute attaches to."""

    name: str = Field(min_length=1)
    namespace: str | None = None
    section_name: str | None = None


class FailureMode(StrEnum):
    fail_open = "FailOpen"
    fail_close = "FailClose"


class EndpointPickerRef(_Spec):
    """The Gateway API Inference Extension's endpoint picker Service for the service's InferencePool."""

    name: str = Field(min_length=1)
    port: int = Field(9002, ge=1, le=65535)
    failure_mode: FailureMode = FailureMode.fail_close


class GatewaySpec(_Spec):
    """Routing from Gateways: an upstream InferencePool over the router pods and an HTTPRoute for the served
    model name."""

    parent_refs: list[GatewayParentRef] = Field(min_length=1)
    endpoint_picker_ref: EndpointPickerRef


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
