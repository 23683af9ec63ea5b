"""What `tandem up` starts for an InferenceService on this machine: a pure plan of processes and ports."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tandem.spec import InferenceService, Mode


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


def plan(
    svc: InferenceService,
    base: Path,
    host: str = "127.0.0.1",
    port: int = 8000,
    first_worker_port: int = 50100,
    workers_file: Path | None = None,
    cpus: int | None = None,
) -> list[ProcessPlan]:
    spec, engine = svc.spec, svc.spec.engine
    roles = ["colocated"] if spec.mode is Mode.colocated else ["prefill", "decode"]
    counts = {"colocated": spec.decode.replicas, "prefill": spec.prefill.replicas, "decode": spec.decode.replicas}
    threads = worker_threads(svc, sum(counts[r] for r in roles), cpus or os.cpu_count() or 1)
    python = [sys.executable, "-m", "tandem"]
    procs: list[ProcessPlan] = []
    next_port = first_worker_port
    for role in roles:
        for i in range(counts[role]):
            grpc_port, metrics_port = next_port, next_port + 1
            next_port += 2
            argv = python + [
                "worker", "--role", role, "--model-dir", str(model_dir(svc, base)),
                "--served-name", spec.model.served_name, "--service", svc.name,
                "--host", host, "--port", str(grpc_port), "--metrics-port", str(metrics_port),
                "--dtype", spec.model.dtype.value, "--block-size", str(engine.block_size),
                "--max-running", str(engine.max_running_sequences),
                "--max-batch-tokens", str(engine.max_batch_tokens), "--prefill-chunk", str(engine.prefill_chunk_tokens),
                "--max-model-len", str(spec.model.max_context_length), "--threads", str(threads),
                "--kv-compression", spec.kv_transfer.compression,
                "--worker-id", f"{svc.name}-{role}-{i}",
            ]  # fmt: skip
            if engine.num_kv_blocks:
                argv += ["--num-kv-blocks", str(engine.num_kv_blocks)]
            else:
                argv += ["--kv-memory-percent", str(engine.kv_cache_memory_percent)]
            if spec.kv_transfer.transport.value == "grpc":
                argv.append("--no-shm")
            procs.append(ProcessPlan(f"{role}-{i}", role, argv, f"{host}:{grpc_port}", metrics_port))
    router = python + [
        "router", "--model-dir", str(model_dir(svc, base)), "--served-name", spec.model.served_name,
        "--service", svc.name, "--host", host, "--port", str(port), "--mode", spec.mode.value,
        "--max-queued", str(spec.router.max_queued_requests),
    ]  # fmt: skip
    if workers_file is not None:
        router += ["--workers-file", str(workers_file)]
    else:
        for role in roles:
            router += [f"--{role}", ",".join(p.address for p in procs if p.role == role)]
    procs.append(ProcessPlan("router", "router", router, f"{host}:{port}"))
    return procs


def workers_document(procs: list[ProcessPlan]) -> dict[str, list[str]]:
    """The router's workers file: worker addresses by role."""
    doc: dict[str, list[str]] = {"prefill": [], "decode": [], "colocated": []}
    for p in procs:
        if p.role in doc:
            doc[p.role].append(p.address)
    return doc
