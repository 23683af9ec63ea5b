"""The GPU path: a staging ring whose data region is a CUDA buffer shared between processes by CUDA IPC.

The decode worker allocates the buffer on its cache's device and describes it in ReserveReply.cuda_ipc
(plain fields: device, handle bytes, sizes, torch's reference-counter name); the prefill worker rebuilds
the tensor from those fields, copies KV device-to-device into it, and the decode worker copies it into
its cache. The ring's control block stays in host shared memory. Only for workers on the same host (and
GPUs that can reach each other). Nothing a peer sends is ever unpickled.
"""

from __future__ import annotations

import re

import torch

from tandem.v1 import decode_pb2

from .base import KvTransferError
from .staging import StagingRing

MAX_REF_COUNTER_OFFSET = 1 << 20  # slots in torch's reference-counter file
MAX_HANDLE_BYTES = 4096  # cudaIpcMemHandle_t is 64 bytes; expandable segments send a longer record
# torch names its IPC reference counters "/torch_<pid>_<random>_<n>" (at::NewProcessWideShmHandle)
_REF_COUNTER = re.compile(r"/torch_[0-9A-Za-z_]{1,64}")


def create_cuda_ring(capacity: int, device: int | str | torch.device = 0) -> StagingRing:
    region = torch.zeros(capacity, dtype=torch.uint8, device=device)
    return StagingRing.with_region(region)


def export_buffer(ring: StagingRing) -> decode_pb2.CudaIpcBuffer:
    """The ring's CUDA buffer as explicit fields, for ReserveReply.cuda_ipc."""
    region = ring.region
    if not region.is_cuda or region.storage_offset() != 0 or not region.is_contiguous():
        raise ValueError("not a whole, contiguous CUDA staging buffer")
    (device, handle, size, offset, ref_name, ref_offset, event, sync) = (
        region.untyped_storage()._share_cuda_()
    )
    return decode_pb2.CudaIpcBuffer(
        device=device,
        handle=handle,
        storage_size=size,
        storage_offset=offset,
        ref_counter_name=ref_name.decode() if isinstance(ref_name, bytes) else ref_name,
        ref_counter_offset=ref_offset,
        event_handle=event or b"",
        event_sync_required=sync,
    )


def check_buffer(buf: decode_pb2.CudaIpcBuffer, capacity: int, local_device: int) -> list[str]:
    """Why a peer's buffer description must not be opened (pure); empty when it may."""
    problems = []
    if local_device < 0:
        problems.append("this worker's KV cache is not on a GPU")
    elif buf.device != local_device:
        problems.append(f"buffer on cuda:{buf.device}, this worker's cache on cuda:{local_device}")
    if not 0 < len(buf.handle) <= MAX_HANDLE_BYTES:
        problems.append(f"memory handle of {len(buf.handle)} bytes")
    if len(buf.event_handle) > MAX_HANDLE_BYTES:
        problems.append(f"event handle of {len(buf.event_handle)} bytes")
    if not _REF_COUNTER.fullmatch(buf.ref_counter_name):
        problems.append(f"reference counter name {buf.ref_counter_name[:80]!r} is not torch's")
    if capacity <= 0 or buf.storage_size != capacity:
        problems.append(f"buffer of {buf.storage_size} bytes, ring control says {capacity}")
    if buf.storage_offset != 0:  # the ring exports a whole allocation: an offset would reach past it
        problems.append(f"storage offset {buf.storage_offset}, not 0")
    if not 0 <= buf.ref_counter_offset < MAX_REF_COUNTER_OFFSET:
        problems.append(f"reference counter offset {buf.ref_counter_offset} out of range")
    return problems


def attach_cuda_ring(control_name: str, buf: decode_pb2.CudaIpcBuffer, local_device: int) -> StagingRing:
    """The sender's view of a decode worker's CUDA staging ring, rebuilt from plain fields."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    control = StagingRing.attach_control(control_name, torch.empty(0, dtype=torch.uint8))
    problems = check_buffer(buf, control.capacity, local_device)
    if problems:
        control.close()
        raise KvTransferError("refusing the CUDA staging buffer: " + "; ".join(problems))
    region = rebuild_cuda_tensor(
        torch.Tensor,
        (buf.storage_size,),
        (1,),
        0,
        torch.storage.TypedStorage,
        torch.uint8,
        buf.device,
        buf.handle,
        buf.storage_size,
        buf.storage_offset,
        False,
        buf.ref_counter_name.encode(),
        buf.ref_counter_offset,
        buf.event_handle,
        buf.event_sync_required,
    )
    control.region = region
    return control
