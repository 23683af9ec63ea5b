"""Optional 8-bit KV transfer compression: int8 payload with one absmax scale per block (pure)."""

from __future__ import annotations

import torch


def quantize_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[n, ...] -> (int8 [n, ...], float32 scales [n]) with x ~= q * scale per leading index."""
    flat = x.reshape(x.shape[0], -1).float()
    scales = flat.abs().amax(dim=1) / 127.0
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    q = torch.round(flat / safe[:, None]).clamp_(-127, 127).to(torch.int8)
    return q.reshape(x.shape), scales


def dequantize_int8(q: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    shape = (q.shape[0],) + (1,) * (q.dim() - 1)
    return (q.float() * scales.float().reshape(shape)).to(dtype)
