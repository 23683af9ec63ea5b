"""`spec.engine`: the engine knobs of every worker (batching, KV cache, attention, decode step, speculative
decoding). A knob named alike here, in the worker's options and in the engine's config flows through by name
(tandem/options.py)."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field, model_validator

from tandem.spec_base import Spec


class AttentionBackend(StrEnum):
    sdpa = "sdpa"  # the reference: each context gathered from the paged cache, then SDPA
    flex = "flex"  # FlexAttention reading the paged cache in place (compiled on CUDA)
    triton = "triton"  # our Triton kernel reading the paged cache in place, the 8-bit one too (CUDA only)


class SpeculativeMethod(StrEnum):
    ngram = "ngram"  # prompt lookup: drafts copied from where the text's last n-gram occurred before
    draft = "draft"  # self-speculative: the model's own first layers draft (early exit), see draftModel


class DraftModelSpec(Spec):
    """The draft of method `draft`: the served model's first `layers` layers, then its final norm and LM
    head. Their KV is the target's own (already in the cache the prefill worker sent), so drafting needs no
    second checkpoint and no KV memory of its own; `layers` must be below the model's layer count."""

    layers: int = Field(ge=1)


DRAFT_MODEL_FOR_DRAFT_ONLY = "engine.speculative.draftModel is required by method draft and only by it"


class SpeculativeSpec(Spec):
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
    float32 scale per token and head (about twice the sequences in the same memory; sdpa or triton attention).
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
    "engine.kvCacheDtype int8 needs engine.attention sdpa or triton: the flex backend reads the cache in place and "
    "cannot unpack 8-bit pages"
)


class EngineSpec(Spec):
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
