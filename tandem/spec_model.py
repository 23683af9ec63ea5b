"""`spec.model`: the model to serve, where its weights come from, its precision and its longest context."""

from __future__ import annotations

from enum import StrEnum

from pydantic import ConfigDict, Field, model_validator

from tandem.spec_base import Spec, cel, rules
from tandem.spec_k8s import DNS_SUBDOMAIN


class Dtype(StrEnum):
    float32 = "float32"
    float16 = "float16"
    bfloat16 = "bfloat16"


class SecretKeyRef(Spec):
    name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)
    """Name of the Secret in the InferenceService's namespace."""
    key: str = Field(default="token", min_length=1, max_length=253, pattern="^[-._a-zA-Z0-9]+$")
    """Key of the token in the Secret."""


class PvcSource(Spec):
    claim_name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)
    """Name of the PersistentVolumeClaim in the InferenceService's namespace."""
    path: str = ""
    """Folder of the model inside the volume; empty: its root."""


class HuggingFaceSource(Spec):
    repo_id: str = Field(pattern="^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
    """Repository id, owner/name (for example meta-llama/Llama-3.1-8B-Instruct)."""
    revision: str = Field(default="main", min_length=1)
    """Branch, tag or commit to download."""
    token_secret_ref: SecretKeyRef | None = None
    """Secret holding a Hub token, for gated or private repositories."""


SOURCE_EXACTLY_ONE = "spec.model.source must set exactly one of path, pvc, hostPath, image, huggingFace"


class ModelSource(Spec):
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


class ModelSpec(Spec):
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
