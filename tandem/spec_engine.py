"""`spec.engine`: the engine knobs of every worker (batching, KV cache, attention, decode step, speculative
decoding). A knob named alike here, in the worker's options and in the engine's config flows through by name
(tandem/options.py)."""

from __future__ import annotations

from enum import StrEnum

from pydantic import ConfigDict, Field, model_validator

from tandem.spec_base import Spec, cel, rules


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
    """Layers the draft runs: the first N of the model's; must be fewer than the model has (the worker refuses
    the model otherwise)."""


DRAFT_MODEL_FOR_DRAFT_ONLY = "engine.speculative.draftModel is required by method draft and only by it"


class SpeculativeSpec(Spec):
    """Speculative decoding in the decode pool: `numTokens` drafts per sequence per step, verified by the
    model in one batched pass; greedy output is unchanged, sampled output keeps its distribution (rejection
    sampling), and a sequence whose drafts keep failing decodes plainly for a while."""

    model_config = ConfigDict(
        json_schema_extra=rules(
            cel(
                "(has(self.method) && self.method == 'draft') == has(self.draftModel)",
                DRAFT_MODEL_FOR_DRAFT_ONLY,
                ".draftModel",
            )
        )
    )

    method: SpeculativeMethod = SpeculativeMethod.ngram
    """ngram: prompt lookup, drafts copied from where the text's last few tokens occurred before in the prompt
    or output (no extra model). draft: self-speculative, the model's own first draftModel.layers layers
    draft (early exit into its final norm and LM head), over the KV already in the cache."""
    num_tokens: int = Field(default=4, ge=1, le=16)
    """Draft tokens per sequence per step."""
    draft_model: DraftModelSpec | None = None  # method draft only
    """The draft of method draft (required by it, refused otherwise): the served model's first layers, then
    its final norm and LM head. Their KV is the model's own, already in the cache the prefill worker sent, so
    drafting needs no second checkpoint and no KV memory of its own."""

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
    "engine.kvCacheDtype int8 needs engine.attention sdpa or triton: the flex backend reads the cache in "
    "place and cannot unpack 8-bit pages"
)


class EngineSpec(Spec):
    model_config = ConfigDict(
        json_schema_extra=rules(
            cel(
                "!has(self.kvCacheDtype) || self.kvCacheDtype != 'int8' || !has(self.attention) || "
                "self.attention != 'flex'",
                KV_INT8_NEEDS_SDPA,
                ".kvCacheDtype",
            )
        )
    )

    block_size: int = Field(default=16, gt=0)
    """Tokens per KV cache block (also the prefix-cache granularity)."""
    kv_cache_memory_percent: int = Field(default=90, gt=0, le=100)
    """Share of the GPU memory left after the weights and a warm-up batch given to the KV cache (CPU: of 1
    GiB)."""
    num_kv_blocks: int | None = Field(default=None, gt=0)
    """A fixed number of KV blocks instead of kvCacheMemoryPercent."""
    max_running_sequences: int = Field(default=64, gt=0)
    """Most sequences one worker batches at once."""
    max_batch_tokens: int = Field(default=2048, gt=0)
    """Most tokens one engine step processes."""
    prefill_chunk_tokens: int = Field(default=512, gt=0)
    """Prompt tokens per prefill chunk (long prompts run in chunks)."""
    max_prefill_tokens_with_decodes: int | None = Field(default=None, gt=0)
    """Stall-free batching: an engine step that carries decodes carries at most this many prompt tokens, so a
    prompt that reaches a busy decode or colocated worker is prefilled a slice per step and adds a bounded
    amount to the running sequences' TPOT. Unset: prompts share the whole maxBatchTokens budget."""
    threads: int | None = Field(default=None, gt=0)
    """CPU threads per worker for torch; unset: the cores shared evenly."""
    attention: AttentionBackend = AttentionBackend.sdpa
    """Attention over the paged KV cache: sdpa gathers each context (the reference), flex reads the cache in
    place (compiled on CUDA), triton reads it in place through our own kernel (CUDA only)."""
    compile: bool = False
    """torch.compile the model's per-token layers on CUDA; the worker warms them up before it reports
    ready."""
    decode_step: DecodeStep = DecodeStep.eager
    """Pure-decode steps in the decode pool: eager (the general path), compiled (one static-shape step padded
    to batch and page-table buckets, torch.compiled whole), cudaGraphs (that step captured as one CUDA graph
    per bucket; CUDA only). Every bucket is warmed up before the worker reports ready."""
    speculative: SpeculativeSpec | None = None  # unset: no speculative decoding
    """Speculative decoding in the decode pool: draft tokens verified by the model in one batched pass per
    step. Greedy output is unchanged and sampled output keeps its distribution (rejection sampling); a
    sequence whose drafts keep failing decodes plainly for a while. Unset: off."""
    kv_cache_dtype: KvCacheDtype = KvCacheDtype.auto
    """KV cache storage: auto in model.dtype; int8 with one float32 scale per token and head (about twice the
    sequences in the same memory; sdpa or triton attention; kvTransfer.compression is then a no-op)."""

    @model_validator(mode="after")
    def _kv_cache_readable(self) -> EngineSpec:
        if self.kv_cache_dtype is KvCacheDtype.int8 and self.attention is AttentionBackend.flex:
            raise ValueError(KV_INT8_NEEDS_SDPA)
        return self
