"""The GPU path: a staging ring whose data region is a CUDA buffer shared between processes by CUDA IPC.

The decode worker allocates the buffer on its cache's device and sends its IPC handle in ReserveReply;
the prefill worker copies KV device-to-device into it, and the decode worker copies it into its cache.
The ring's control block stays in host shared memory. Only for workers on the same host (and GPUs
that can reach each other); the handle is a pickle, so accept it only from a trusted peer.
"""

from __future__ import annotations

import pickle

import torch

from .staging import StagingRing


def available() -> bool:
    return torch.cuda.is_available()


def create_cuda_ring(capacity: int, device: int | str | torch.device = 0) -> StagingRing:
    region = torch.zeros(capacity, dtype=torch.uint8, device=device)
    return StagingRing.with_region(region)


def export_handle(ring: StagingRing) -> bytes:
    """The IPC handle of the ring's CUDA buffer, for ReserveReply.cuda_ipc_handle."""
    from torch.multiprocessing.reductions import reduce_tensor

    if not ring.region.is_cuda:
        raise ValueError("not a CUDA staging ring")
    return pickle.dumps(reduce_tensor(ring.region))


def attach_cuda_ring(control_name: str, handle: bytes) -> StagingRing:
    """The sender's view of a decode worker's CUDA staging ring."""
    rebuild, args = pickle.loads(handle)  # noqa: S301 - from the peer we reserved with
    return StagingRing.attach_control(control_name, rebuild(*args))
