"""The command lines of tandem's processes, from a spec: one place for the local backend and the operator.

`tandem up` runs these as processes on this machine; the operator puts the same arguments in the pods.
"""

from __future__ import annotations

from tandem import names
from tandem.spec import InferenceServiceSpec, Mode


def worker_pools(spec: InferenceServiceSpec) -> list[str]:
    """The worker pools a spec asks for."""
    return [names.POOL_COLOCATED] if spec.mode is Mode.colocated else [names.POOL_PREFILL, names.POOL_DECODE]


def pool_replicas(spec: InferenceServiceSpec, pool: str) -> int:
    """A colocated pool is sized by `spec.decode`."""
    return spec.prefill.replicas if pool == names.POOL_PREFILL else spec.decode.replicas


# Time per output token a drain allows: twice the default TPOT target. It is a constant, not the spec's
# SLO, because the grace period is part of the pod template: an SLO edit must not roll the GPU pods.
DRAIN_MS_PER_TOKEN = 100
# What the pod needs beyond the drain itself: the preStop call, closing the server, the process exit.
TERMINATION_MARGIN_S = 15


def drain_timeout_seconds(spec: InferenceServiceSpec) -> int:
    """How long a draining worker may take to finish what it holds: the longest generation the spec
    allows (maxContextLength tokens at DRAIN_MS_PER_TOKEN) plus one KV reservation lease."""
    longest_generation_ms = spec.model.max_context_length * DRAIN_MS_PER_TOKEN
    return -(-(longest_generation_ms + spec.kv_transfer.lease_ms) // 1000)


def termination_grace_seconds(spec: InferenceServiceSpec) -> int:
    """A worker pod's terminationGracePeriodSeconds: its drain timeout and the margin to exit after it."""
    return drain_timeout_seconds(spec) + TERMINATION_MARGIN_S


def worker_argv(
    spec: InferenceServiceSpec,
    service: str,
    role: str,
    model_dir: str,
    host: str = "0.0.0.0",
    port: int = names.GRPC_PORT,
    metrics_port: int = names.METRICS_PORT,
    threads: int | None = None,
    worker_id: str | None = None,
    tls_dir: str | None = None,
    health_port: int | None = None,
    drain_timeout_s: int | None = None,
) -> list[str]:
    """Arguments of `tandem worker` (without the program name); `tls_dir` holds the mutual-TLS files
    (spec.security.tls: a local directory or the mounted Secret), `health_port` a plaintext probe port."""
    engine = spec.engine
    argv = [
        "worker", "--role", role, "--model-dir", model_dir,
        "--served-name", spec.model.served_name, "--service", service,
        "--host", host, "--port", str(port), "--metrics-port", str(metrics_port),
        "--dtype", spec.model.dtype.value, "--block-size", str(engine.block_size),
        "--max-running", str(engine.max_running_sequences),
        "--max-batch-tokens", str(engine.max_batch_tokens), "--prefill-chunk", str(engine.prefill_chunk_tokens),
        "--max-model-len", str(spec.model.max_context_length),
        "--kv-compression", spec.kv_transfer.compression, "--kv-transport", spec.kv_transfer.transport.value,
    ]  # fmt: skip
    if engine.max_prefill_tokens_with_decodes and role != names.POOL_PREFILL:  # a prefill worker never decodes
        argv += ["--max-prefill-tokens-with-decodes", str(engine.max_prefill_tokens_with_decodes)]
    if engine.num_kv_blocks:
        argv += ["--num-kv-blocks", str(engine.num_kv_blocks)]
    else:
        argv += ["--kv-memory-percent", str(engine.kv_cache_memory_percent)]
    if engine.attention.value != "sdpa":
        argv += ["--attention", engine.attention.value]
    if spec.model.quantization.value != "none":
        argv += ["--quantization", spec.model.quantization.value]
    if engine.kv_cache_dtype.value != "auto":
        argv += ["--kv-cache-dtype", engine.kv_cache_dtype.value]
    if engine.compile:
        argv.append("--compile")
    if engine.decode_step.value != "eager" and role != names.POOL_PREFILL:  # a prefill worker never decodes
        argv += ["--decode-step", engine.decode_step.value]
    if engine.speculative is not None and role != names.POOL_PREFILL:  # a prefill worker never decodes
        argv += ["--speculative", engine.speculative.method.value]
        argv += ["--speculative-tokens", str(engine.speculative.num_tokens)]
        if engine.speculative.draft_model is not None:
            argv += ["--speculative-draft-layers", str(engine.speculative.draft_model.layers)]
    if threads or engine.threads:
        argv += ["--threads", str(threads or engine.threads)]
    if worker_id:
        argv += ["--worker-id", worker_id]
    argv += ["--drain-timeout", str(drain_timeout_s or drain_timeout_seconds(spec))]
    argv += tls_argv(spec, tls_dir)
    if health_port:
        argv += ["--health-port", str(health_port)]
    return argv


def tls_argv(spec: InferenceServiceSpec, tls_dir: str | None) -> list[str]:
    """The mutual-TLS flags workers and the router share."""
    if not tls_dir:
        return []
    argv = ["--tls-dir", tls_dir]
    if spec.security.tls is not None and spec.security.tls.server_name:
        argv += ["--tls-server-name", spec.security.tls.server_name]
    return argv


def router_argv(
    spec: InferenceServiceSpec,
    service: str,
    model_dir: str,
    workers: dict[str, list[str]] | None = None,
    workers_file: str | None = None,
    host: str = "0.0.0.0",
    port: int = names.HTTP_PORT,
    metrics_port: int | None = None,
    api_keys_file: str | None = None,
    tls_dir: str | None = None,
) -> list[str]:
    """Arguments of `tandem router`: worker addresses by pool (`host:port` or `dns:///name:port`,
    resolved again as pods come and go), or a workers file; `api_keys_file` where the keys are
    (spec.security.apiKeys: a local file, or the mounted Secret's key)."""
    argv = [
        "router", "--model-dir", model_dir, "--served-name", spec.model.served_name,
        "--service", service, "--host", host, "--port", str(port), "--mode", spec.mode.value,
        "--max-queued", str(spec.router.max_queued_requests), "--kv-lease-ms", str(spec.kv_transfer.lease_ms),
        "--max-model-len", str(spec.model.max_context_length),
        "--slo-ttft-ms", str(spec.slo.ttft_ms), "--slo-tpot-ms", str(spec.slo.tpot_ms),
        "--slo-percentile", str(spec.slo.percentile),
    ]  # fmt: skip
    if spec.mode is Mode.disaggregated:
        d = spec.router.disaggregation
        argv += [
            "--disaggregation", d.mode.value, "--local-prefill-max-tokens", str(d.local_prefill_max_tokens),
            "--prefill-queue-tokens", str(d.prefill_queue_tokens),
            "--local-prefill-max-tpot-fraction", str(d.local_prefill_max_tpot_fraction),
        ]  # fmt: skip
    if metrics_port:
        argv += ["--metrics-port", str(metrics_port)]
    if workers_file:
        argv += ["--workers-file", workers_file]
    if api_keys_file:
        argv += ["--api-keys-file", api_keys_file]
        if spec.security.api_keys is not None and spec.security.api_keys.protect_metrics:
            argv.append("--protect-metrics")
    argv += tls_argv(spec, tls_dir)
    for pool, addresses in (workers or {}).items():
        if addresses:
            argv += [f"--{pool}", ",".join(addresses)]
    return argv
