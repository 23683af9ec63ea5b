"""Weight-only int8 (`model.quantization: int8`): per-channel rounding bounds, the int8 kernel against the
fallback, and the tiny model quantized at load against itself unquantized (logits, greedy, bytes)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tandem.worker.devtools.accuracy import agreement
from tandem.worker.engine.layers.weight_int8 import (
    Int8Linear,
    dequantize_weight,
    kernel_ok,
    quantize_model,
    quantize_weight,
    weight_nbytes,
)
from tandem.worker.engine.loading import load_model

PROMPT_SEEDS = (0, 1, 2)


def _prompt(vocab: int, seed: int, n: int = 20) -> list[int]:
    return torch.randint(3, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_per_channel_rounding_is_within_half_a_step_of_each_row():
    w = torch.randn(64, 48) * torch.logspace(-3, 1, 64)[:, None]  # rows of very different magnitudes
    q, scales = quantize_weight(w, torch.float32)
    assert q.dtype == torch.int8 and scales.shape == (64,)
    assert int(q.abs().amax(dim=1).min()) == 127  # each row uses its full range
    err = (dequantize_weight(q, scales, torch.float32) - w).abs()
    assert bool((err <= scales[:, None] * 0.5 + 1e-12).all())


def test_a_bfloat16_scale_costs_no_accuracy_beyond_the_rounding():
    w = torch.randn(32, 64)
    q, scales = quantize_weight(w, torch.bfloat16)
    err = (dequantize_weight(q, scales, torch.float32) - w).abs()
    assert bool((err <= scales.float()[:, None] * 0.5 * 1.01).all())


@pytest.mark.parametrize(
    ("dtype", "in_features"), [(torch.bfloat16, 64), (torch.bfloat16, 100), (torch.float32, 64)]
)
def test_int8_linear_matches_the_dequantized_weight(dtype, in_features):
    linear = nn.Linear(in_features, 40, bias=True).to(dtype)
    layer = Int8Linear.from_linear(linear)
    assert layer.uses_kernel == (dtype == torch.bfloat16 and in_features % 8 == 0)
    x = torch.randn(2, 3, in_features).to(dtype)
    with torch.no_grad():
        want = torch.nn.functional.linear(
            x.float(), dequantize_weight(layer.weight_int8, layer.scales, torch.float32)
        )
        want = want + linear.bias.float()
        got = layer(x)
    assert got.shape == (2, 3, 40) and got.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), want, atol=tol * float(want.abs().max()), rtol=0)


def test_the_cpu_kernel_is_chosen_only_where_it_is_right_and_fast():
    assert kernel_ok("cpu", torch.bfloat16, 256)
    assert not kernel_ok("cpu", torch.bfloat16, 100)  # wrong results or a crash below a multiple of 8
    assert not kernel_ok("cpu", torch.float32, 256)  # row by row: far slower than the fallback
    assert not kernel_ok("meta", torch.bfloat16, 256)


def test_every_decoder_projection_and_the_untied_head_are_quantized(tiny_model_dir):
    model = load_model(tiny_model_dir, "float32", quantization="int8")
    linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    int8 = {n for n, m in model.named_modules() if isinstance(m, Int8Linear)}
    assert linears == []
    layers = model.config.num_layers
    assert len(int8) == 4 * layers + 1 and "lm_head" in int8
    assert "model.layers.0.self_attn.qkv_proj" in int8 and "model.layers.0.mlp.gate_up_proj" in int8
    assert model.model.embed_tokens.weight.dtype == torch.float32


def test_a_tied_head_stays_the_embedding():
    from tandem.worker.hf.config import ModelConfig
    from tests.hf_reference import QWEN2_BIAS, hf_model, ours_from

    model = ours_from(hf_model(QWEN2_BIAS))
    assert ModelConfig.from_hf(dict(QWEN2_BIAS)).tie_word_embeddings
    quantize_model(model)
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_unknown_quantization_is_refused(tiny_model_dir):
    with pytest.raises(ValueError, match="quantization"):
        load_model(tiny_model_dir, quantization="int4")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_quantized_logits_and_greedy_tokens_stay_close(tiny_model_dir, dtype):
    ref = load_model(tiny_model_dir, dtype)
    quant = load_model(tiny_model_dir, dtype, quantization="int8")
    results = [agreement(ref, quant, _prompt(ref.config.vocab_size, s), n=64) for s in PROMPT_SEEDS]
    # measured on the seed-0 tiny model: rel error 0.018-0.031, top-1 agreement 0.84-0.97 (its logits
    # are nearly flat, so near-ties flip easily; a real checkpoint's are far more peaked)
    assert max(r.rel_error for r in results) < 0.06, results
    assert sum(r.top1_agreement for r in results) / len(results) >= 0.8, results
    assert all(r.positions == 64 for r in results)


def test_weight_memory_shrinks(tiny_model_dir):
    for dtype, most in (("float32", 0.35), ("bfloat16", 0.6)):  # the embeddings stay in the model's dtype
        full = weight_nbytes(load_model(tiny_model_dir, dtype))
        quant = weight_nbytes(load_model(tiny_model_dir, dtype, quantization="int8"))
        assert quant < most * full, (dtype, quant, full)
