"""FP8 weights (`model.quantization: fp8`): per-channel e4m3 rounding bounds, the `_scaled_mm` layer against
the quantization math, FP8 checkpoints in the Hugging Face layouts loaded as stored (the same weights as
quantizing the bf16 checkpoint at load), and the refusals. torch's CPU `_scaled_mm` runs the real matmul
here."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from tandem.worker.devtools.accuracy import agreement
from tandem.worker.engine.layers import weight_fp8
from tandem.worker.engine.layers.weight_fp8 import (
    FP8,
    FP8_MAX,
    Fp8Linear,
    dequantize_weight,
    fp8_problem,
    quantize_activation,
    quantize_weight,
)
from tandem.worker.engine.loading import SINGLE_FILE, load_model
from tandem.worker.hf.config import ModelLoadError

E4M3_HALF_ULP = 2.0**-4  # 3 mantissa bits: a normal value rounds within 1/16 of itself
E4M3_SUBNORMAL_HALF_STEP = 2.0**-10  # below 2^-6 the step is 2^-9, times the row's scale

COMPRESSED_TENSORS_CHANNEL = {
    "quant_method": "compressed-tensors",
    "format": "float-quantized",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {
                "num_bits": 8,
                "type": "float",
                "strategy": "channel",
                "dynamic": False,
                "symmetric": True,
            },
            "input_activations": {
                "num_bits": 8,
                "type": "float",
                "strategy": "token",
                "dynamic": True,
                "symmetric": True,
            },
        }
    },
    "ignore": [],
}
HF_FP8_STATIC = {"quant_method": "fp8", "activation_scheme": "static"}


def test_per_channel_rounding_is_within_e4m3_precision_of_each_weight():
    w = torch.randn(64, 48) * torch.logspace(-3, 1, 64)[:, None]  # rows of very different magnitudes
    q, scales = quantize_weight(w)
    assert q.dtype == FP8 and scales.shape == (64,) and scales.dtype == torch.float32
    assert bool((q.float().abs().amax(dim=1) == FP8_MAX).all())  # each row uses its full range
    err = (dequantize_weight(q, scales, torch.float32) - w).abs()
    bound = w.abs() * E4M3_HALF_ULP + scales[:, None] * E4M3_SUBNORMAL_HALF_STEP
    assert bool((err <= bound * 1.0001).all())
    assert float((err / w.abs().clamp_min(1e-12)).median()) < 0.03  # most weights far inside the bound


def test_activations_are_scaled_per_token_or_by_the_static_scale():
    x = torch.randn(5, 32) * torch.tensor([1e-3, 1.0, 10.0, 100.0, 0.5])[:, None]
    xq, scale = quantize_activation(x)
    assert scale.shape == (5, 1) and bool((xq.float().abs().amax(dim=1) == FP8_MAX).all())
    err = (xq.float() * scale - x).abs()
    assert bool((err <= x.abs() * E4M3_HALF_ULP + scale * E4M3_SUBNORMAL_HALF_STEP).all())
    xq, scale = quantize_activation(x, torch.tensor(0.01))  # static: the largest rows saturate at +-448
    assert bool((scale == 0.01).all()) and float(xq.float().abs().max()) == FP8_MAX


@pytest.mark.parametrize("static", [False, True])
def test_fp8_linear_matches_the_quantization_math(static):
    torch.manual_seed(0)
    linear = nn.Linear(64, 48, bias=True).to(torch.bfloat16)
    layer = Fp8Linear.from_linear(linear)
    if static:
        layer.input_scale = torch.tensor(0.004)
    x = torch.randn(2, 3, 64).to(torch.bfloat16)
    with torch.no_grad():
        got = layer(x)
        xq, xs = quantize_activation(x.reshape(-1, 64), layer.input_scale)
        want = (xq.float() * xs) @ dequantize_weight(layer.weight, layer.weight_scale, torch.float32).t()
        want = want.view(2, 3, 48) + linear.bias.float()
    assert got.shape == (2, 3, 48) and got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, atol=1e-2 * float(want.abs().max()), rtol=0)  # bf16 output


def _fp8_checkpoint(src: Path, dst: Path, quantization_config: dict, per_tensor: bool = False) -> Path:
    """`src`'s model written as an FP8 checkpoint: each projection and lm_head as e4m3 `weight` +
    `weight_scale` (per channel [out, 1] as compressed-tensors writes it, or one per tensor with an
    `input_scale`)."""
    shutil.copytree(src, dst)
    config = json.loads((src / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**config, "quantization_config": quantization_config}))
    state = load_file(str(src / SINGLE_FILE))
    out: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        if not name.endswith(("_proj.weight", "lm_head.weight")):
            out[name] = t
            continue
        w = t.to(torch.bfloat16)  # what load_model(..., "bfloat16") quantizes
        prefix = name.removesuffix("weight")
        if per_tensor:
            scale = (w.float().abs().amax() / FP8_MAX).reshape(1)
            out[name] = (w.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
            out[prefix + "weight_scale"] = scale
            out[prefix + "input_scale"] = torch.rand(1) * 0.01 + 0.001
        else:
            out[name], scale = quantize_weight(w)
            out[prefix + "weight_scale"] = scale[:, None]
    save_file(out, str(dst / SINGLE_FILE))
    return dst


def _fp8_buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: b for n, b in model.named_buffers() if n.endswith(("weight", "weight_scale"))}


def test_an_fp8_checkpoint_loads_to_the_weights_quantizing_the_bf16_one_gives(tiny_model_dir, tmp_path):
    fp8_dir = _fp8_checkpoint(Path(tiny_model_dir), tmp_path / "fp8", COMPRESSED_TENSORS_CHANNEL)
    at_load = load_model(tiny_model_dir, "bfloat16", quantization="fp8")
    stored = load_model(fp8_dir, "bfloat16", quantization="fp8")
    assert stored.config.checkpoint_quantization == "fp8"
    want, got = _fp8_buffers(at_load), _fp8_buffers(stored)
    assert (
        got.keys() == want.keys()
        and "model.layers.0.self_attn.qkv_proj.weight" in got
        and "lm_head.weight" in got
    )
    for name in want:  # bit for bit, the fused q/k/v and gate/up included
        assert got[name].dtype == want[name].dtype and torch.equal(
            got[name].view(torch.uint8) if got[name].dtype == FP8 else got[name],
            want[name].view(torch.uint8) if want[name].dtype == FP8 else want[name],
        ), name
    prompt = list(range(3, 23))
    assert agreement(at_load, stored, prompt, n=16).max_abs_error == 0


def test_a_per_tensor_fp8_checkpoint_keeps_static_input_scales(tiny_model_dir, tmp_path):
    fp8_dir = _fp8_checkpoint(Path(tiny_model_dir), tmp_path / "fp8", HF_FP8_STATIC, per_tensor=True)
    model = load_model(fp8_dir, "bfloat16", quantization="fp8")
    state = load_file(str(fp8_dir / SINGLE_FILE))
    qkv = model.model.layers[0].self_attn.qkv_proj
    p = "model.layers.0.self_attn."
    assert isinstance(qkv, Fp8Linear) and qkv.input_scale is not None
    assert float(qkv.input_scale) == max(
        float(state[f"{p}{x}_proj.input_scale"]) for x in "qkv"
    )  # fused: the largest
    q_rows = state[p + "q_proj.weight"].shape[0]
    assert bool(
        (qkv.weight_scale[:q_rows] == state[p + "q_proj.weight_scale"]).all()
    )  # one per tensor, repeated
    assert torch.equal(qkv.weight[:q_rows].view(torch.uint8), state[p + "q_proj.weight"].view(torch.uint8))
    # without fp8, the same checkpoint is dequantized into the model's dtype and stays near the original
    dequantized = load_model(fp8_dir, "float32")
    assert not any(isinstance(m, Fp8Linear) for m in dequantized.modules())
    ref = load_model(tiny_model_dir, "float32")
    assert (
        agreement(ref, dequantized, list(range(3, 23)), n=32).rel_error < 0.2
    )  # measured: 0.11 (flat logits)


def test_fp8_at_load_stays_close_to_the_unquantized_model(tiny_model_dir):
    ref = load_model(tiny_model_dir, "float32")
    quant = load_model(tiny_model_dir, "float32", quantization="fp8")
    assert sum(isinstance(m, Fp8Linear) for m in quant.modules()) == 4 * quant.config.num_layers + 1
    results = [
        agreement(
            ref,
            quant,
            torch.randint(3, 1000, (20,), generator=torch.Generator().manual_seed(s)).tolist(),
            n=64,
        )
        for s in (0, 1, 2)
    ]
    # e4m3 keeps 3 mantissa bits (int8 per channel keeps ~7 at a row's largest weight), on weights and
    # activations; measured on the seed-0 tiny model, whose logits are nearly flat: rel error about 0.1
    assert max(r.rel_error for r in results) < 0.2, results
    assert sum(r.top1_agreement for r in results) / len(results) >= 0.6, results


def test_block_wise_and_other_checkpoint_quantizations_are_refused(tiny_model_dir, tmp_path):
    for i, (qc, match) in enumerate(
        [
            ({"quant_method": "fp8", "weight_block_size": [128, 128]}, "block-wise FP8"),
            ({"quant_method": "gptq", "bits": 4}, "quant_method 'gptq' is not supported"),
            (
                {
                    "quant_method": "compressed-tensors",
                    "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int"}}},
                },
                "only FP8",
            ),
        ]
    ):
        d = tmp_path / str(i)
        shutil.copytree(tiny_model_dir, d)
        config = json.loads((d / "config.json").read_text())
        (d / "config.json").write_text(json.dumps({**config, "quantization_config": qc}))
        with pytest.raises(ModelLoadError, match=match):
            load_model(d, quantization="fp8")


def test_a_gpu_without_fp8_is_refused_with_the_reason(monkeypatch):
    # the device queries are the edge faked here; tests/gpu runs the real ones
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(weight_fp8, "_row_wise_scaled_mm_works", lambda device: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    problem = fp8_problem("cuda")
    assert (
        problem is not None
        and "compute capability 8.9 or newer" in problem
        and "A100" in problem
        and "8.0" in problem
    )
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert fp8_problem("cuda") is None
    monkeypatch.undo()
    assert fp8_problem("cpu") is None  # this torch's CPU _scaled_mm serves (the tests above run it)
    assert "meta" in (fp8_problem("meta") or "")
    with pytest.raises(ValueError, match="quantization fp8 needs"):
        weight_fp8.check_fp8("meta")
