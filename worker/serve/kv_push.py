"""The prefill side's per-layer KV read for a push, off the compute stream on CUDA.

On CUDA the layer's blocks are gathered on a copy stream that first waits for the compute stream (so it
sees the layer just written), then, unless the KV goes device to device (the CUDA IPC ring), copied into
pinned host buffers without blocking. The next layer's compute is not held up by the copy; the event
recorded on the copy stream tells the sender's thread when the bytes are ready. On the CPU this is
`PagedKv.read_blocks`, unchanged.
"""

from __future__ import annotations

import torch

from tandem.worker.engine.models.protocol import PagedKv


class LayerKvReader:
    def __init__(self, kv: PagedKv):
        self.kv = kv
        device = kv.k[0].device
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def read(
        self, layer: int, block_ids: list[int], to_host: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.cuda.Event | None]:
        """(keys, values, ready event or None): the blocks of `layer`, on the host when `to_host`."""
        if self.stream is None:
            k, v = self.kv.read_blocks(layer, block_ids)
            return k, v, None
        self.stream.wait_stream(torch.cuda.current_stream(self.stream.device))
        with torch.cuda.stream(self.stream):
            k, v = self.kv.read_blocks(layer, block_ids)
            if to_host:
                k = torch.empty(k.shape, dtype=k.dtype, pin_memory=True).copy_(k, non_blocking=True)
                v = torch.empty(v.shape, dtype=v.dtype, pin_memory=True).copy_(v, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record(self.stream)
        return k, v, ready
