"""Engine state to tandem.v1 messages: token events, load reports and worker info, for every worker server."""

from __future__ import annotations

import socket

import torch

from tandem.v1 import common_pb2
from tandem.worker.api.wire import FINISH_REASONS, prompt_logprobs_to_proto, top_logprobs_to_proto
from tandem.worker.engine.runner.engine import Engine, StepOutput
from tandem.worker.engine.runner.engine_loop import LoadSnapshot, StreamEnd
from tandem.worker.kv_transport import transports
from tandem.worker.kv_transport.base import PROTOCOL_VERSION, dtype_name

ROLES = {
    "prefill": common_pb2.WORKER_ROLE_PREFILL,
    "decode": common_pb2.WORKER_ROLE_DECODE,
    "colocated": common_pb2.WORKER_ROLE_COLOCATED,
}


def token_event(request_id: str, item: StepOutput | StreamEnd, index: int) -> common_pb2.TokenEvent:
    if isinstance(item, StreamEnd):
        return common_pb2.TokenEvent(
            request_id=request_id,
            finish_reason=FINISH_REASONS.get(item.finish_reason, 4),
            error=item.error,
            index=index,
        )
    return common_pb2.TokenEvent(
        request_id=request_id,
        token_id=item.token_id,
        logprob=item.logprob,
        finish_reason=FINISH_REASONS[item.finish_reason] if item.finish_reason else 0,
        index=index,
        has_token=True,
        top_logprobs=top_logprobs_to_proto(item.top_logprobs),
        prompt_logprobs=prompt_logprobs_to_proto(item.prompt_logprobs or []),
    )


def host_id() -> str:
    """Identifies this host (and its /dev/shm) so two workers can tell they may share memory."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}:{boot}"


def offered_transports(kv_transport: str, device: str) -> list[int]:
    """What a worker offers for KV, best first (the registry's; ValueError for a setting the device
    refuses)."""
    return transports.offered_transports(kv_transport, device)


def cuda_device_uuid(device: torch.device) -> str:
    """The GPU's UUID ("" on the CPU): two workers whose caches share one may use CUDA IPC."""
    if device.type != "cuda":
        return ""
    return str(torch.cuda.get_device_properties(device).uuid)


def worker_info(
    engine: Engine, worker_id: str, role: str, model_name: str, transports: list[int] | None = None
) -> common_pb2.WorkerInfo:
    cfg = engine.model.config
    transports = transports if transports is not None else [common_pb2.KV_TRANSPORT_GRPC]
    shm = common_pb2.KV_TRANSPORT_SHM in transports
    return common_pb2.WorkerInfo(
        worker_id=worker_id,
        role=ROLES[role],
        model_name=model_name,
        dtype=dtype_name(engine.dtype),
        num_layers=cfg.num_layers,
        num_kv_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        block_size=engine.config.block_size,
        host_id=host_id(),
        transports=transports,
        shm_capable=shm,
        cuda_device=engine.device.index
        if engine.device.type == "cuda" and engine.device.index is not None
        else -1,
        protocol_version=PROTOCOL_VERSION,
        kv_cache_dtype=engine.config.kv_cache_dtype,
        cuda_device_uuid=cuda_device_uuid(engine.device),
    )


def load_report(
    load: LoadSnapshot, worker_id: str, role: str, reserved_blocks: int = 0, draining: bool = False
) -> common_pb2.LoadReport:
    return common_pb2.LoadReport(
        worker_id=worker_id,
        queued_prompt_tokens=load.queued_prompt_tokens,
        running_sequences=load.running,
        waiting_sequences=load.waiting,
        free_kv_blocks=load.free_kv_blocks,
        total_kv_blocks=load.total_kv_blocks,
        reserved_kv_blocks=reserved_blocks,
        draining=draining,
        role=ROLES[role],
    )
