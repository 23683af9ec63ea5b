"""What `tandem up` starts for an InferenceService on this machine: a pure plan of processes and ports."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tandem.launch import drain_timeout_seconds, pool_replicas, router_argv, worker_argv, worker_pools
from tandem.spec import InferenceService


@dataclass(frozen=True)
class ProcessPlan:
    name: str  # e.g. "prefill-0"
    role: str  # prefill | decode | colocated | router
    argv: list[str]
    address: str = ""  # host:port of its gRPC or HTTP endpoint
    metrics_port: int = 0
    env: dict[str, str] = field(default_factory=dict)


def model_dir(svc: InferenceService, base: Path) -> Path:
    source = svc.spec.model.source
    path = source.path or source.host_path
    if path is None:
        raise ValueError("the local backend serves models from model.source.path or hostPath only")
    p = Path(path)
    return p if p.is_absolute() else base / p


def worker_threads(svc: InferenceService, num_workers: int, cpus: int) -> int:
    """Torch threads per worker: the spec's, or the cores shared evenly so workers don't oversubscribe."""
    return svc.spec.engine.threads or max(1, cpus // max(1, num_workers))


def local_tls_dir(svc: InferenceService, base: Path) -> str | None:
    """The mutual-TLS directory of a local stack (security.tls.dir), or None without TLS."""
    tls = svc.spec.security.tls
    if tls is not None and not tls.dir:
        raise ValueError("the local backend reads TLS files from security.tls.dir, not a Secret")
    return str(base / tls.dir) if tls is not None and tls.dir else None


def worker_plan(
    svc: InferenceService, base: Path, role: str, index: int, host: str, grpc_port: int, threads: int
) -> ProcessPlan:
    """One worker process: gRPC on `grpc_port`, metrics on the port above it."""
    argv = worker_argv(
        svc.spec, svc.name, role, str(model_dir(svc, base)), host, grpc_port, grpc_port + 1, threads,
        f"{svc.name}-{role}-{index}", tls_dir=local_tls_dir(svc, base), drain_timeout_s=drain_timeout_seconds(svc.spec),
    )  # fmt: skip
    return ProcessPlan(f"{role}-{index}", role, [sys.executable, "-m", "tandem", *argv], f"{host}:{grpc_port}", grpc_port + 1)


def plan(
    svc: InferenceService,
    base: Path,
    host: str = "127.0.0.1",
    port: int = 8000,
    first_worker_port: int = 50100,
    workers_file: Path | None = None,
    cpus: int | None = None,
) -> list[ProcessPlan]:
    spec = svc.spec
    pools = worker_pools(spec)
    threads = worker_threads(svc, sum(pool_replicas(spec, p) for p in pools), cpus or os.cpu_count() or 1)
    python = [sys.executable, "-m", "tandem"]
    mdir = str(model_dir(svc, base))
    tls_dir = local_tls_dir(svc, base)
    procs: list[ProcessPlan] = []
    next_port = first_worker_port
    for role in pools:
        for i in range(pool_replicas(spec, role)):
            procs.append(worker_plan(svc, base, role, i, host, next_port, threads))
            next_port += 2
    addresses = None if workers_file else {role: [p.address for p in procs if p.role == role] for role in pools}
    keys = spec.security.api_keys
    if keys is not None and not keys.file:
        raise ValueError("the local backend reads API keys from security.apiKeys.file, not a Secret")
    keys_file = str(base / keys.file) if keys is not None and keys.file else None
    router = router_argv(
        spec, svc.name, mdir, addresses, str(workers_file) if workers_file else None, host, port,
        api_keys_file=keys_file, tls_dir=tls_dir,
    )  # fmt: skip
    procs.append(ProcessPlan("router", "router", python + router, f"{host}:{port}"))
    return procs


def workers_document(procs: list[ProcessPlan]) -> dict[str, list[str]]:
    """The router's workers file: worker addresses by role."""
    doc: dict[str, list[str]] = {"prefill": [], "decode": [], "colocated": []}
    for p in procs:
        if p.role in doc:
            doc[p.role].append(p.address)
    return doc
