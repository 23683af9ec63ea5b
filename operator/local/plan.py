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


TLS_STATE_DIR = "tls"  # under the run directory: tandem up's throwaway CA's certificates, a folder per role


def local_tls_root(svc: InferenceService, base: Path, state: Path | None) -> Path | None:
    """The folder holding a folder per role with its mutual-TLS files: security.tls.dir, else the run
    directory's (`state`), None with `security.tls.mode: off`."""
    tls = svc.spec.security.tls
    if not tls.enabled:
        return None
    if tls.secret_name:
        raise ValueError(
            "the local backend reads TLS files from security.tls.dir or makes its own, not a Secret"
        )
    if tls.dir:
        return base / tls.dir
    if state is None:
        raise ValueError("mutual TLS on (security.tls) needs a run directory for its certificates")
    return state / TLS_STATE_DIR


def role_tls_dir(root: Path | None, role: str) -> str | None:
    return str(root / role) if root is not None else None


def worker_plan(
    svc: InferenceService,
    base: Path,
    role: str,
    index: int,
    host: str,
    grpc_port: int,
    threads: int,
    tls_root: Path | None = None,
) -> ProcessPlan:
    """One worker process: gRPC on `grpc_port`, metrics on the port above it."""
    argv = worker_argv(
        svc.spec,
        svc.name,
        role,
        str(model_dir(svc, base)),
        host,
        grpc_port,
        grpc_port + 1,
        threads,
        f"{svc.name}-{role}-{index}",
        tls_dir=role_tls_dir(tls_root, role),
        drain_timeout_s=drain_timeout_seconds(svc.spec),
    )
    return ProcessPlan(
        f"{role}-{index}", role, [sys.executable, "-m", "tandem", *argv], f"{host}:{grpc_port}", grpc_port + 1
    )


def plan(
    svc: InferenceService,
    base: Path,
    host: str = "127.0.0.1",
    port: int = 8000,
    first_worker_port: int = 50100,
    workers_file: Path | None = None,
    cpus: int | None = None,
    tls_root: Path | None = None,
) -> list[ProcessPlan]:
    """The processes of `svc`; `tls_root` holds their certificates, a folder per role (local_tls_root)."""
    spec = svc.spec
    pools = worker_pools(spec)
    threads = worker_threads(svc, sum(pool_replicas(spec, p) for p in pools), cpus or os.cpu_count() or 1)
    python = [sys.executable, "-m", "tandem"]
    mdir = str(model_dir(svc, base))
    procs: list[ProcessPlan] = []
    next_port = first_worker_port
    for role in pools:
        for i in range(pool_replicas(spec, role)):
            procs.append(worker_plan(svc, base, role, i, host, next_port, threads, tls_root))
            next_port += 2
    addresses = (
        None if workers_file else {role: [p.address for p in procs if p.role == role] for role in pools}
    )
    keys = spec.security.api_keys
    if keys is not None and not keys.file:
        raise ValueError("the local backend reads API keys from security.apiKeys.file, not a Secret")
    keys_file = str(base / keys.file) if keys is not None and keys.file else None
    router = router_argv(
        spec,
        svc.name,
        mdir,
        addresses,
        str(workers_file) if workers_file else None,
        host,
        port,
        api_keys_file=keys_file,
        tls_dir=role_tls_dir(tls_root, "router"),
    )
    procs.append(ProcessPlan("router", "router", python + router, f"{host}:{port}"))
    return procs


def workers_document(procs: list[ProcessPlan]) -> dict[str, list[str]]:
    """The router's workers file: worker addresses by role."""
    doc: dict[str, list[str]] = {"prefill": [], "decode": [], "colocated": []}
    for p in procs:
        if p.role in doc:
            doc[p.role].append(p.address)
    return doc
