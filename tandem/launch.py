"""The command lines of tandem's processes, from a spec: one place for the local backend and the operator.

`tandem up` runs these as processes on this machine; the operator puts the same arguments in the pods.
"""

from __future__ import annotations

from tandem import names
from tandem.options import RouterOptions, WorkerOptions
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
    """Arguments of `tandem worker` (without the program name); `tls_dir` holds the mutual-TLS files (its
    role's certificate: a local directory or the mounted Secret), `health_port` a plaintext probe port."""
    opts = WorkerOptions.from_spec(
        spec,
        role,
        service=service,
        model_dir=model_dir,
        host=host,
        port=port,
        metrics_port=metrics_port,
        threads=threads,
        worker_id=worker_id,
        health_port=health_port or 0,
        drain_timeout=drain_timeout_s or drain_timeout_seconds(spec),
    )
    return ["worker", *opts.to_argv(), *tls_argv(spec, tls_dir)]


def tls_argv(spec: InferenceServiceSpec, tls_dir: str | None) -> list[str]:
    """The mutual-TLS flags workers and the router share: the folder with this process's role certificate."""
    return ["--tls-dir", tls_dir] if tls_dir else []


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
    keys = spec.security.api_keys
    opts = RouterOptions.from_spec(
        spec,
        service=service,
        model_dir=model_dir,
        host=host,
        port=port,
        metrics_port=metrics_port or 0,
        workers_file=workers_file,
        api_keys_file=api_keys_file,
        protect_metrics=bool(api_keys_file and keys is not None and keys.protect_metrics),
        **{pool: list(addresses) for pool, addresses in (workers or {}).items()},
    )
    return ["router", *opts.to_argv(), *tls_argv(spec, tls_dir)]
