"""Weight-only int8 for the model's linear layers (`model.quantization: int8`), quantized as a checkpoint
loads.

Decode reads every weight once per step, so a weight stored in 8 bits instead of 16 or 32 halves (or
quarters) the bytes a step moves. Each linear layer keeps its weight as int8 [out, in] with one scale per
output channel (absmax / 127, symmetric); activations stay in the model's dtype.

What is quantized, explicitly: every projection of every decoder layer (the fused q/k/v, o, the fused
gate/up and down) and `lm_head` unless it is tied to the embeddings (`QUANTIZE_LM_HEAD`). The token
embeddings stay in the model's dtype: a step reads only the rows of its tokens, so 8 bits there saves
memory but not time, and a tied `lm_head` shares that tensor.

The matmul: torch's own `aten._weight_int8pack_mm` where it is both present and a win, else a correct
dequantize-then-matmul (`linear(x, w.to(dtype)) * scale`). On the CPU the kernel is used for bfloat16
only: for float32 and float16 it runs row by row (a batch of 32 is ~30x slower than the fallback), and
with bfloat16 it is wrong or crashes when `in_features` is not a multiple of 8, so such layers fall back.
On CUDA the kernel is probed once per dtype (it must exist and agree with the fallback).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

QUANTIZE_LM_HEAD = True  # an untied lm_head is the largest matrix of a small model; tied, it stays as is
KERNEL_K_MULTIPLE = 8


def quantize_weight(weight: torch.Tensor, scale_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """[out, in] -> (int8 [out, in], scales [out] in `scale_dtype`) with weight ~= q * scale[:, None].

    The weight is rounded against the scale as stored, so a lower-precision scale costs no accuracy."""
    w = weight.detach().float()
    scales = (w.abs().amax(dim=1) / 127.0).clamp_min(torch.finfo(torch.float32).tiny).to(scale_dtype)
    q = torch.round(w / scales.float()[:, None]).clamp_(-127, 127).to(torch.int8)
    return q.contiguous(), scales


def dequantize_weight(q: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (q.float() * scales.float()[:, None]).to(dtype)


def kernel_ok(device_type: str, dtype: torch.dtype, in_features: int) -> bool:
    """Whether `_weight_int8pack_mm` serves this layer (pure, given the probe on CUDA)."""
    if in_features % KERNEL_K_MULTIPLE or not hasattr(torch.ops.aten, "_weight_int8pack_mm"):
        return False
    if device_type == "cpu":
        return dtype == torch.bfloat16
    if device_type == "cuda":
        return _cuda_kernel_agrees(dtype)
    return False


@functools.cache
def _cuda_kernel_agrees(dtype: torch.dtype) -> bool:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 64, generator=gen).to("cuda", dtype)
    q, s = quantize_weight(torch.randn(32, 64, generator=gen), dtype)
    q, s = q.cuda(), s.cuda()
    try:
        got = torch.ops.aten._weight_int8pack_mm(x, q, s)
    except (RuntimeError, NotImplementedError):
        return False
    want = F.linear(x.float(), dequantize_weight(q, s, torch.float32))
    return bool(torch.allclose(got.float(), want, rtol=2e-2, atol=2e-2 * float(want.abs().max())))


class Int8Linear(nn.Module):
    """y = x W^T (+ b) with W held as int8 [out, in] and one scale per output channel."""

    def __init__(self, q: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.out_features, self.in_features = q.shape
        self.register_buffer("weight_int8", q)
        self.register_buffer("scales", scales)
        self.bias = nn.Parameter(bias.detach(), requires_grad=False) if bias is not None else None

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Int8Linear:
        q, scales = quantize_weight(linear.weight, linear.weight.dtype)
        return cls(q, scales, linear.bias)

    @functools.cached_property
    def uses_kernel(self) -> bool:
        scales: torch.Tensor = self.scales  # type: ignore[assignment]
        return kernel_ok(scales.device.type, scales.dtype, self.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q: torch.Tensor = self.weight_int8  # type: ignore[assignment]
        scales: torch.Tensor = self.scales  # type: ignore[assignment]
        if self.uses_kernel and x.dtype == scales.dtype:
            flat = x.reshape(-1, self.in_features).contiguous()
            y = torch.ops.aten._weight_int8pack_mm(flat, q, scales).view(*x.shape[:-1], self.out_features)
        else:
            y = F.linear(x, q.to(x.dtype)) * scales.to(x.dtype)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per-channel"


def quantize_model(model: nn.Module, lm_head: bool = QUANTIZE_LM_HEAD) -> nn.Module:
    """Replace the decoder layers' linear layers (and an untied `lm_head` when `lm_head`) with `Int8Linear`,
    in place and one at a time, so each full-precision weight is freed as its int8 copy is made."""
    tied = getattr(getattr(model, "config", None), "tie_word_embeddings", False)
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if not isinstance(child, nn.Linear):
                continue
            full = f"{name}.{child_name}" if name else child_name
            if full == "lm_head" and (tied or not lm_head):
                continue
            setattr(module, child_name, Int8Linear.from_linear(child))
    return model


def weight_nbytes(model: nn.Module) -> int:
    """Bytes the model's parameters and buffers hold (a tied tensor counted once)."""
    seen: dict[int, int] = {}
    for t in [*model.parameters(), *model.buffers()]:
        seen[t.data_ptr()] = max(seen.get(t.data_ptr(), 0), t.numel() * t.element_size())
    return sum(seen.values())
