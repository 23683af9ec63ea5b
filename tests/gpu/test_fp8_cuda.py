"""FP8 weights on a GPU with FP8 tensor cores: `torch._scaled_mm` against the quantization math, the FP8 model
against the bf16 one by a stated bound, the CUDA-graph decode step with FP8 weights, and the refusal on an
older GPU."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tandem.worker.devtools.accuracy import agreement
from tandem.worker.engine.layers.weight_fp8 import (
    MIN_CAPABILITY,
    Fp8Linear,
    dequantize_weight,
    quantize_activation,
)
from tandem.worker.engine.loading import load_model
from tandem.worker.engine.runner.compiled import warm_up
from tandem.worker.engine.runner.engine import Engine, EngineConfig
from tests.decode_parity import requests, run_lockstep

HAS_FP8 = torch.cuda.is_available() and torch.cuda.get_device_capability() >= MIN_CAPABILITY
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
needs_fp8 = pytest.mark.skipif(not HAS_FP8, reason="needs FP8 tensor cores (compute capability 8.9+)")

SMALL = dict(block_size=4, num_kv_blocks=128, max_running_sequences=8, max_model_len=64)


@needs_fp8
@pytest.mark.parametrize("static", [False, True])
def test_scaled_mm_matches_the_quantization_math(static):
    torch.manual_seed(0)
    layer = Fp8Linear.from_linear(nn.Linear(512, 256, bias=True).to("cuda", torch.bfloat16))
    assert layer.uses_kernel
    if static:
        layer.input_scale = torch.tensor(0.01, device="cuda")
    x = torch.randn(7, 512, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        got = layer(x).float()
        xq, xs = quantize_activation(x, layer.input_scale)
        want = (xq.float() * xs) @ dequantize_weight(layer.weight, layer.weight_scale, torch.float32).t()
        want = want + layer.bias.float()
    torch.testing.assert_close(got, want, atol=1e-2 * float(want.abs().max()), rtol=0)  # bf16 output


@needs_fp8
def test_fp8_logits_stay_within_the_bound_of_bf16(tiny_model_dir):
    ref = load_model(tiny_model_dir, "bfloat16", "cuda")
    fp8 = load_model(tiny_model_dir, "bfloat16", "cuda", quantization="fp8")
    prompt = list(range(3, 23))
    result = agreement(ref, fp8, prompt, n=64)
    # the CPU measures rel error about 0.1 on this tiny model (nearly flat logits; e4m3 keeps 3 mantissa bits)
    assert result.rel_error < 0.2 and result.top1_agreement >= 0.6, result
    cpu = load_model(tiny_model_dir, "bfloat16", "cpu", quantization="fp8")
    same = agreement(cpu, fp8, prompt, n=32)  # the same quantized weights: only accumulation order differs
    assert same.rel_error < 0.05, same


@needs_fp8
def test_fp8_weights_with_cuda_graphs(tiny_model_dir):
    # float32 activations: a bf16 difference between the paths could flip an e4m3 rounding and, with this tiny
    # model's flat logits, a token (the compiled step on the CPU: 59 of 59 tokens equal, logits within 0.004)
    model = load_model(tiny_model_dir, "float32", "cuda", quantization="fp8")
    graphs = Engine(model, EngineConfig(**SMALL, decode_step="cudaGraphs"))
    warm_up(graphs)
    run = run_lockstep(Engine(model, EngineConfig(**SMALL)), graphs, requests(6, longest=12))
    assert run.static_steps > 5 and graphs.blocks.num_used == 0
    pairs = [
        (a, b) for rid in run.tokens[0] for a, b in zip(run.tokens[0][rid], run.tokens[1][rid], strict=True)
    ]
    assert sum(a == b for a, b in pairs) >= 0.9 * len(pairs), run.max_logit_diff


@pytest.mark.skipif(HAS_FP8, reason="this GPU has FP8 tensor cores: the refusal is for older ones")
def test_a_gpu_without_fp8_refuses_it(tiny_model_dir):
    with pytest.raises(ValueError, match="compute capability 8.9 or newer"):
        load_model(tiny_model_dir, "bfloat16", "cuda", quantization="fp8")
