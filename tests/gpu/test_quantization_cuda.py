"""Int8 weights and the 8-bit KV cache on CUDA: the int8 matmul (kernel or fallback) is right, and the
quantized model on the GPU stays near the unquantized one and near the same model on the CPU."""

from __future__ import annotations

import pytest
import torch

from tandem.worker.devtools.accuracy import agreement, greedy_continuation
from tandem.worker.engine.layers.weight_int8 import Int8Linear, dequantize_weight
from tandem.worker.engine.loading import load_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_int8_linear_on_cuda_matches_the_dequantized_weight(dtype):
    linear = torch.nn.Linear(256, 96).to("cuda", dtype)
    layer = Int8Linear.from_linear(linear)
    x = torch.randn(5, 256, device="cuda", dtype=dtype)
    with torch.no_grad():
        want = torch.nn.functional.linear(
            x.float(), dequantize_weight(layer.weight_int8, layer.scales, torch.float32)
        )
        got = layer(x).float()
    torch.testing.assert_close(got, want + linear.bias.float(), atol=2e-2 * float(want.abs().max()), rtol=0)


def test_quantized_model_on_cuda_agrees_with_the_unquantized(tiny_model_dir):
    ref = load_model(tiny_model_dir, "float32", "cuda")
    quant = load_model(tiny_model_dir, "float32", "cuda", quantization="int8")
    prompt = list(range(3, 23))
    result = agreement(ref, quant, prompt, n=64, kv_cache_dtype="int8")
    assert result.rel_error < 0.06 and result.top1_agreement >= 0.75, result
    cpu = load_model(tiny_model_dir, "float32", "cpu", quantization="int8")
    tokens = greedy_continuation(cpu, prompt, 32, "int8")  # CPU and GPU round differently: near, not equal
    on_gpu = agreement(cpu, quant, prompt, kv_cache_dtype="int8", continuation=tokens)
    assert on_gpu.top1_agreement >= 0.9, on_gpu
