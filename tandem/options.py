"""The command lines of `tandem worker` and `tandem router` as typed options: one dataclass per process whose
fields are its flags (the spec's enums inside, the defaults here or in the spec), written by `launch.py`
(`to_argv`) and read by the process (`from_argv`), so both ends agree by construction.

An engine knob the spec (`EngineSpec`) and the engine (`EngineConfig`) name alike flows through by name. The
knobs declared below carry their own flag names, help and worker defaults; every other `EngineSpec` field is
a flag of its own all the same (`--field-name`, typed, checked and defaulted by the spec), carried in
`WorkerOptions.engine_knobs`. So a new knob is its spec field, its CRD line and the engine code that reads
it: nothing here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from enum import StrEnum
from typing import Any, ClassVar

from pydantic.fields import FieldInfo

from tandem import names
from tandem.flags import Options, opt, spec_defaults
from tandem.slo import DEFAULT as DEFAULT_SLO
from tandem.spec import InferenceServiceSpec, Mode
from tandem.spec_engine import (
    AttentionBackend,
    DecodeStep,
    EngineSpec,
    KvCacheDtype,
    SpeculativeMethod,
    SpeculativeSpec,
)
from tandem.spec_model import Dtype, Quantization
from tandem.spec_router import DisaggregationMode, DisaggregationSpec, RouterSpec, WakeQueueSpec
from tandem.spec_workers import KvTransferSpec, Transport

ENGINE_STALL_S = (
    120.0  # an engine loop that has not come round for this long is stuck (the longest step is far shorter)
)
MAX_BODY_BYTES = 4 * 1024 * 1024  # a 128k-token prompt as token ids is about 1 MiB of JSON
BODY_TIMEOUT_S = 30.0
MAX_CONNECTIONS = 2048
HEADER_TIMEOUT_S = 10.0
KEEP_ALIVE_S = 5.0

_ENGINE, _KV, _DISAGGREGATION, _ROUTER = EngineSpec(), KvTransferSpec(), DisaggregationSpec(), RouterSpec()
_WAKE = WakeQueueSpec()
SPECULATIVE_TOKENS = SpeculativeSpec().num_tokens


class Role(StrEnum):
    prefill = names.POOL_PREFILL
    decode = names.POOL_DECODE
    colocated = names.POOL_COLOCATED


@dataclass(frozen=True)
class WorkerOptions(Options):
    """`tandem worker`: one engine served over gRPC in one role."""

    PROG: ClassVar[str] = "tandem worker"
    DESCRIPTION: ClassVar[str] = "serve one engine over gRPC as a prefill, decode or colocated worker"

    role: Role = opt()
    model_dir: str = opt()
    served_name: str = opt("model")
    service: str = opt("default", "InferenceService name, for metric labels")
    host: str = opt("127.0.0.1")
    port: int = opt(names.GRPC_PORT)
    metrics_port: int = opt(0, "Prometheus /metrics port (0: off)")
    health_port: int = opt(
        0,
        "also serve grpc.health.v1 alone, in plaintext, on its own server and threads (the kubelet's probes; "
        "0: off)",
    )
    worker_id: str | None = opt(None)
    dtype: Dtype = opt(Dtype.float32)
    device: str | None = opt(None, "torch device (default: cuda when available, else cpu)")
    quantization: Quantization = opt(
        Quantization.none,
        "weights: int8 or fp8 (e4m3, FP8 matmuls; compute capability 8.9+) quantizes every decoder "
        "projection and an untied lm_head as the checkpoint loads",
    )
    max_model_len: int | None = opt(None)
    tensor_parallel: int | None = opt(
        None,
        "ranks the model is split across (the pool's resources.gpus): one GPU each, or CPU processes where "
        "there is no GPU (default: 1)",
    )
    # Engine knobs: named as in EngineSpec and EngineConfig, so that they flow through by name.
    block_size: int = opt(_ENGINE.block_size)
    num_kv_blocks: int | None = opt(None, "default: from --kv-memory-percent")
    kv_cache_memory_percent: int = opt(
        _ENGINE.kv_cache_memory_percent,
        "KV cache share of the GPU memory free after the weights load, less the "
        "warm-up batch's activations (CPU: of a 1 GiB budget)",
        flag="--kv-memory-percent",
    )
    max_running_sequences: int = opt(_ENGINE.max_running_sequences, flag="--max-running")
    max_batch_tokens: int = opt(_ENGINE.max_batch_tokens)
    prefill_chunk_tokens: int = opt(_ENGINE.prefill_chunk_tokens, flag="--prefill-chunk")
    max_prefill_tokens_with_decodes: int | None = opt(
        None, "stall-free batching: most prompt tokens in a step that carries decodes (default: no cap)"
    )
    threads: int | None = opt(None, "torch CPU threads")
    attention: AttentionBackend = opt(_ENGINE.attention, "attention over the paged cache")
    kv_cache_dtype: KvCacheDtype = opt(
        _ENGINE.kv_cache_dtype,
        "KV cache storage: auto (the model's dtype) or int8 (values and a scale per token and head)",
    )
    compile: bool = opt(_ENGINE.compile, "torch.compile norms and MLPs; warmed up before ready")
    decode_step: DecodeStep = opt(
        _ENGINE.decode_step,
        "pure-decode steps: eager, compiled (static shapes, torch.compile), cudaGraphs (captured per bucket)",
    )
    speculative: SpeculativeMethod | None = opt(
        None,
        "speculative decoding: ngram drafts from prompt lookup, draft from the model's own first layers, "
        "verified in one pass per step (default: off)",
    )
    speculative_tokens: int | None = opt(
        None, f"draft tokens per sequence per step (default: {SPECULATIVE_TOKENS})"
    )
    speculative_draft_layers: int | None = opt(
        None,
        "--speculative draft: the model's first this many layers draft (then its final norm and LM head)",
    )
    # KV transfer.
    kv_compression: str = opt(_KV.compression, choices=("none", "int8"))
    kv_transport: Transport = opt(
        _KV.transport,
        "KV transfer: auto (shared memory on one host when the cache is on the CPU, else gRPC), grpc, shm",
    )
    kv_lease_ms: int = opt(
        _KV.lease_ms,
        "the longest a decode worker holds reserved blocks for a transfer; a Reserve asking more gets this",
    )
    # The process.
    tls_dir: str | None = opt(None, "mutual TLS: tls.crt, tls.key, ca.crt (default: plaintext)")
    tls_server_name: str | None = opt(None, "name in the peers' certificates (dialled by IP)")
    role_file: str | None = opt(
        None,
        "a prefill or decode worker takes the role this pod labels file (downward API) names in its "
        "serving.tandem.dev/role label, whenever it changes",
    )
    max_streams: int | None = opt(
        None,
        "token streams (StreamTokens, Generate) served at once; past it RESOURCE_EXHAUSTED (default: 2 x "
        "--max-running)",
    )
    max_transfers: int | None = opt(
        None,
        "Reserve and Prefill RPCs served at once (KV pushes: as many as streams); past it RESOURCE_EXHAUSTED "
        "(default: --max-running)",
    )
    engine_stall_seconds: float = opt(
        ENGINE_STALL_S, "liveness fails when the engine loop has not come round for this long"
    )
    drain_timeout: float = opt(
        help="on SIGTERM or a Drain RPC, seconds to finish held work before exiting anyway",
        factory=lambda: float(os.environ.get("TANDEM_DRAIN_SECONDS", "600")),
    )
    # Every EngineSpec field not declared above, by name (each a flag of its own; see the module docstring).
    engine_knobs: dict[str, Any] = field(default_factory=lambda: spec_defaults(WorkerOptions))

    @classmethod
    def _spec_flags(cls) -> dict[str, FieldInfo]:
        """The EngineSpec fields this class does not declare: each a flag typed and defaulted by the spec."""
        declared = {f.name for f in fields(cls)}
        return {name: info for name, info in EngineSpec.model_fields.items() if name not in declared}

    @classmethod
    def from_spec(cls, spec: InferenceServiceSpec, role: str, **process: Any) -> WorkerOptions:
        """A spec's worker of `role`; `process` sets the rest (service, model_dir, host, port, ...)."""
        engine = spec.engine
        if role == Role.prefill:  # a prefill worker never decodes
            engine = engine.model_copy(
                update={
                    "decode_step": DecodeStep.eager,
                    "speculative": None,
                    "max_prefill_tokens_with_decodes": None,
                }
            )
        knobs = {f.name: getattr(engine, f.name) for f in fields(cls) if f.name in EngineSpec.model_fields}
        knobs["engine_knobs"] = {name: getattr(engine, name) for name in cls._spec_flags()}
        speculative = engine.speculative
        if speculative is not None:
            knobs.update(
                speculative=speculative.method,
                speculative_tokens=speculative.num_tokens,
                speculative_draft_layers=speculative.draft_model.layers if speculative.draft_model else None,
            )
        model = spec.model
        base = dict(
            role=Role(role),
            served_name=model.served_name,
            dtype=model.dtype,
            quantization=model.quantization,
            max_model_len=model.max_context_length,
            kv_compression=spec.kv_transfer.compression,
            kv_transport=spec.kv_transfer.transport,
            kv_lease_ms=spec.kv_transfer.lease_ms,
        )
        gpus = (
            spec.prefill if role == Role.prefill else spec.decode
        ).resources.gpus  # colocated: the decode pool's
        if gpus > 1:
            base["tensor_parallel"] = gpus
        opts = cls(**{**base, **knobs, **process})
        return opts if opts.threads or not engine.threads else replace(opts, threads=engine.threads)


@dataclass(frozen=True)
class RouterOptions(Options):
    """`tandem router`: the OpenAI API in front of the worker pools."""

    PROG: ClassVar[str] = "tandem router"
    DESCRIPTION: ClassVar[str] = "OpenAI-compatible router for tandem workers"

    model_dir: str = opt(help="Hugging Face model directory (tokenizer, config)")
    served_name: str = opt(help="the model name clients send")
    service: str = opt("default", "InferenceService name (metric label)")
    host: str = opt("127.0.0.1")
    port: int = opt(names.HTTP_PORT)
    metrics_port: int = opt(0, "serve /metrics on this port instead of the API port (0: on the API port)")
    public_metrics: bool = opt(False, "/metrics on the API port even with --metrics-port")
    docs: bool = opt(False, "serve /docs and /openapi.json on the API port")
    mode: Mode = opt(Mode.disaggregated)
    disaggregation: DisaggregationMode = opt(
        _DISAGGREGATION.mode,
        "disaggregated mode: every prompt on the prefill pool (always), on its decode worker "
        "(never), or by prompt length and prefill queue (conditional)",
    )
    local_prefill_max_tokens: int = opt(
        _DISAGGREGATION.local_prefill_max_tokens,
        "conditional: prompts of at most this many uncached tokens are prefilled on the decode worker",
    )
    prefill_queue_tokens: int = opt(
        _DISAGGREGATION.prefill_queue_tokens,
        "conditional: past this many queued prompt tokens on every prefill worker, prefill on a decode "
        "worker with room",
    )
    local_prefill_max_tpot_fraction: float = opt(
        _DISAGGREGATION.local_prefill_max_tpot_fraction,
        "conditional: no local prefill on a decode worker whose streams' recent TPOT is above this fraction "
        "of --slo-tpot-ms (0: no check)",
    )
    mixed_decode_ratio: float = opt(
        _DISAGGREGATION.mixed_decode_ratio,
        "conditional: a prefill worker runs whole requests itself while it has fewer than this fraction of "
        "the decode worker's streams and its queue has room (0: never)",
    )
    prefill: list[str] = opt(help="prefill worker addresses, comma-separated", factory=list)
    decode: list[str] = opt(help="decode worker addresses, comma-separated", factory=list)
    colocated: list[str] = opt(help="colocated worker addresses, comma-separated", factory=list)
    workers_file: str | None = opt(
        None, 'JSON {"prefill": [...], "decode": [...], "colocated": [...]}, re-read as it changes'
    )
    max_queued: int = opt(_ROUTER.max_queued_requests, "requests in flight before answering 429")
    max_held: int = opt(
        _WAKE.max_requests,
        "requests held at once while a pool they need has no worker (scaled to zero, waking); past it 503 "
        "with Retry-After (0: refuse at once)",
    )
    hold_timeout: float = opt(
        float(_WAKE.timeout_seconds),
        "seconds a request is held waiting for a pool to wake before 503 with Retry-After",
    )
    kv_lease_ms: int = opt(
        _KV.lease_ms,
        "how long a decode worker keeps blocks reserved for a KV transfer that has not completed",
    )
    max_model_len: int | None = opt(
        None, "context length the workers serve (their --max-model-len); default: the model's positions"
    )
    max_body_bytes: int = opt(MAX_BODY_BYTES, "larger request bodies get 413")
    body_timeout: float = opt(BODY_TIMEOUT_S, "seconds a client may take to send its request body before 408")
    max_connections: int = opt(
        MAX_CONNECTIONS, "open HTTP connections; past it a request gets 503 with Retry-After"
    )
    header_timeout: float = opt(
        HEADER_TIMEOUT_S, "seconds a connection may take to send a request's headers before it is closed"
    )
    keep_alive_timeout: float = opt(KEEP_ALIVE_S, "seconds an idle kept-alive connection stays open")
    slo_ttft_ms: float = opt(DEFAULT_SLO.ttft_ms, "TTFT target each request is judged against")
    slo_tpot_ms: float = opt(DEFAULT_SLO.tpot_ms, "TPOT target each request is judged against")
    slo_percentile: float = opt(DEFAULT_SLO.percentile, "percent of requests that must meet the targets")
    api_keys_file: str | None = opt(None, "require Authorization: Bearer <key>; keys one per line")
    api_keys_env: str | None = opt(
        None, "require Authorization: Bearer <key>; keys in this environment variable"
    )
    protect_metrics: bool = opt(False, "/metrics also needs an API key")
    tls_dir: str | None = opt(None, "mutual TLS to the workers: tls.crt, tls.key, ca.crt")
    tls_server_name: str | None = opt(None, "name in the workers' certificates (dialled by IP)")
    log_level: str = opt("info", choices=("debug", "info", "warning", "error"))

    @classmethod
    def from_spec(cls, spec: InferenceServiceSpec, **process: Any) -> RouterOptions:
        """A spec's router; `process` sets the rest (service, model_dir, host, port, workers, ...)."""
        slo = spec.slo.to_slo()
        opts = cls(
            served_name=spec.model.served_name,
            mode=spec.mode,
            max_queued=spec.router.max_queued_requests,
            kv_lease_ms=spec.kv_transfer.lease_ms,
            max_model_len=spec.model.max_context_length,
            slo_ttft_ms=slo.ttft_ms,
            slo_tpot_ms=slo.tpot_ms,
            slo_percentile=slo.percentile,
            max_held=spec.router.wake_queue.max_requests,
            hold_timeout=float(spec.router.wake_queue.timeout_seconds),
            **process,
        )
        if spec.mode is Mode.colocated:
            return opts
        d = spec.router.disaggregation
        return replace(
            opts,
            disaggregation=d.mode,
            local_prefill_max_tokens=d.local_prefill_max_tokens,
            prefill_queue_tokens=d.prefill_queue_tokens,
            local_prefill_max_tpot_fraction=d.local_prefill_max_tpot_fraction,
            mixed_decode_ratio=d.mixed_decode_ratio,
        )
