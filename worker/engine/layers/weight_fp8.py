"""FP8 weights for the model's linear layers (`model.quantization: fp8`): e4m3 weights, FP8 matmuls.

Each linear layer keeps its weight as float8_e4m3fn [out, in] with one float32 scale per output channel
(absmax / 448, symmetric). Activations are quantized to e4m3 as they arrive: per token (dynamic, the default)
or against one static per-tensor scale when the checkpoint carries an `input_scale`. The matmul is
`torch._scaled_mm` with row-wise scales (x's per token, W's per channel), accumulating in float32 and
writing bfloat16, so a decode step reads one byte per weight and the tensor cores run at their FP8 rate.

What is quantized is what int8 quantizes (weight_int8): every decoder projection and an untied lm_head;
the embeddings stay in the model's dtype. On CUDA the FP8 matmul needs compute capability 8.9 (Ada,
Hopper) or newer, and dimensions that are multiples of 16; a layer whose dimensions are not runs the same
math through a dequantized weight. The row-wise `_scaled_mm` is probed once per device (recent torch has
it on the CPU too, where the tests run it).
"""

from __future__ import annotations

import functools

import torch
from torch import nn

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)  # 448
MIN_CAPABILITY = (8, 9)
DIM_MULTIPLE = 16  # _scaled_mm on CUDA: K and N multiples of 16
OUT_DTYPE = torch.bfloat16  # row-wise scaled FP8 matmuls write bfloat16 on CUDA
_TINY = torch.finfo(torch.float32).tiny


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[out, in] -> (e4m3 [out, in], float32 scales [out]) with weight ~= q * scale[:, None]."""
    w = weight.detach().float()
    scales = (w.abs().amax(dim=1) / FP8_MAX).clamp_min(_TINY)
    return (w / scales[:, None]).clamp_(-FP8_MAX, FP8_MAX).to(FP8).contiguous(), scales


def dequantize_weight(q: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (q.float() * scales.float().reshape(-1, 1)).to(dtype)


def quantize_activation(
    x: torch.Tensor, static_scale: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """[M, K] -> (e4m3 [M, K], float32 scales [M, 1]): each row's absmax / 448 (per token), or `static_scale`
    for every row (per tensor, values past the range saturate)."""
    x32 = x.float()
    if static_scale is None:
        scale = (x32.abs().amax(dim=-1, keepdim=True) / FP8_MAX).clamp_min(_TINY)
    else:
        scale = static_scale.float().reshape(1, 1).expand(x.shape[0], 1).contiguous()
    return (x32 / scale).clamp_(-FP8_MAX, FP8_MAX).to(FP8), scale


def fp8_problem(device: torch.device | str) -> str | None:
    """Why FP8 weights cannot serve on `device`, or None when they can (pure but for the device query)."""
    device = torch.device(device)
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        if (major, minor) < MIN_CAPABILITY:
            name = torch.cuda.get_device_name(device)
            return (
                f"model.quantization fp8 needs a GPU with FP8 tensor cores (compute capability 8.9 or newer: "
                f"Ada, Hopper, Blackwell); {name} has {major}.{minor}. Use quantization int8 or none on this "
                "GPU"
            )
    if device.type in ("cuda", "cpu") and _row_wise_scaled_mm_works(str(device)):
        return None
    return (
        f"model.quantization fp8 needs torch._scaled_mm with row-wise scales on {device}, which this torch "
        f"{torch.__version__} lacks"
    )


@functools.cache
def _row_wise_scaled_mm_works(device: str) -> bool:
    """One small row-wise scaled FP8 matmul on `device` runs and is right (probed once per device)."""
    a = torch.ones(16, 16, device=device).to(FP8)
    scale_a, scale_b = torch.ones(16, 1, device=device), torch.full((1, 16), 2.0, device=device)
    try:
        y = torch._scaled_mm(a, a.t(), scale_a, scale_b, out_dtype=OUT_DTYPE)
    except (RuntimeError, NotImplementedError):
        return False
    return bool((y.float() == 32).all())


def check_fp8(device: torch.device | str) -> None:
    problem = fp8_problem(device)
    if problem:
        raise ValueError(problem)


class Fp8Linear(nn.Module):
    """y = x W^T (+ b) with W as e4m3 [out, in], one float32 scale per output channel, and x quantized on the
    fly. The buffers carry the checkpoint's names (`weight`, `weight_scale`, `input_scale`), so an FP8
    checkpoint loads into them as it is."""

    weight: torch.Tensor  # [out, in] e4m3
    weight_scale: torch.Tensor  # [out] float32
    input_scale: torch.Tensor | None  # [] float32: static per-tensor activations; None: per token

    def __init__(
        self,
        weight: torch.Tensor,
        weight_scale: torch.Tensor,
        bias: torch.Tensor | None,
        input_scale: torch.Tensor | None = None,
    ):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.register_buffer("weight", weight)
        self.register_buffer("weight_scale", weight_scale.reshape(-1))
        self.register_buffer("input_scale", input_scale.reshape(()) if input_scale is not None else None)
        self.bias = nn.Parameter(bias.detach(), requires_grad=False) if bias is not None else None

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Fp8Linear:
        q, scales = quantize_weight(linear.weight)
        return cls(q, scales, linear.bias)

    @classmethod
    def empty(cls, linear: nn.Linear, static_input: bool) -> Fp8Linear:
        """A layer of `linear`'s shape with uninitialised buffers on `linear`'s device (meta: to be
        assigned)."""
        w = linear.weight
        return cls(
            torch.empty(w.shape, dtype=FP8, device=w.device),
            torch.empty(w.shape[0], device=w.device),
            linear.bias,
            torch.empty((), device=w.device) if static_input else None,
        )

    @functools.cached_property
    def uses_kernel(self) -> bool:
        return self.weight.device.type == "cpu" or not (
            self.in_features % DIM_MULTIPLE or self.out_features % DIM_MULTIPLE
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        xq, x_scale = quantize_activation(flat, self.input_scale)
        w_scale = self.weight_scale.reshape(1, -1)
        if self.uses_kernel:
            y = torch._scaled_mm(xq, self.weight.t(), x_scale, w_scale, out_dtype=OUT_DTYPE)
        else:
            y = (xq.float() @ self.weight.float().t()) * x_scale * w_scale
        y = y.to(x.dtype).view(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        act = "static per-tensor" if self.input_scale is not None else "dynamic per-token"
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, fp8 e4m3 per-channel, {act}"
        )


def fp8_linears(model: nn.Module, lm_head: bool = True) -> list[tuple[nn.Module, str, nn.Linear]]:
    """(parent, attribute, layer) for each linear layer FP8 covers: the decoder's, and an untied `lm_head`."""
    tied = getattr(getattr(model, "config", None), "tie_word_embeddings", False)
    found = []
    for name, module in model.named_modules():
        for child_name, child in module.named_children():
            full = f"{name}.{child_name}" if name else child_name
            if isinstance(child, nn.Linear) and not (full == "lm_head" and (tied or not lm_head)):
                found.append((module, child_name, child))
    return found


def quantize_model(model: nn.Module, lm_head: bool = True) -> nn.Module:
    """Replace each linear layer `fp8_linears` names with an `Fp8Linear`, in place, one at a time."""
    for parent, name, linear in fp8_linears(model, lm_head):
        setattr(parent, name, Fp8Linear.from_linear(linear))
    return model
