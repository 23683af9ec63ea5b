"""Which pre-quantized checkpoint a `config.json` describes: the FP8 layouts we load, and a clear refusal of
the rest.

FP8 checkpoints from Hugging Face (`quant_method: fp8`), llm-compressor (`compressed-tensors`,
`float-quantized`) and NVIDIA ModelOpt (`modelopt`, `quant_algo: FP8`) store each quantized linear layer as
`weight` in float8_e4m3fn with a float32 `weight_scale` (one per tensor or one per output channel) and,
for static activation scaling, an `input_scale`; layers they leave out stay in bf16. Block-wise scales
(`weight_block_size`, `weight_scale_inv`) and integer or 4-bit schemes are refused by name.
"""

from __future__ import annotations

from typing import Any


class UnsupportedQuantization(ValueError):
    """A checkpoint quantized in a way this engine does not load."""


FP8_SCALE_STRATEGIES = ("tensor", "channel")


def checkpoint_quantization(hf: dict[str, Any]) -> str:
    """`none` or `fp8`: how the checkpoint's weights are stored, from its `quantization_config`."""
    qc = hf.get("quantization_config")
    if not qc:
        return "none"
    method = qc.get("quant_method")
    if method == "fp8":
        if qc.get("weight_block_size"):
            raise UnsupportedQuantization(
                f"block-wise FP8 (weight_block_size {qc['weight_block_size']}) is not supported; "
                "per-tensor and per-channel FP8 scales are"
            )
        return "fp8"
    if method == "compressed-tensors":
        for name, group in (qc.get("config_groups") or {}).items():
            weights = group.get("weights") or {}
            if (weights.get("type"), weights.get("num_bits")) != ("float", 8):
                raise UnsupportedQuantization(
                    f"compressed-tensors group {name}: weights of type {weights.get('type')} with "
                    f"{weights.get('num_bits')} bits are not supported; only FP8 (float, 8 bits) is"
                )
            if weights.get("strategy") not in FP8_SCALE_STRATEGIES:
                raise UnsupportedQuantization(
                    f"compressed-tensors group {name}: weight scale strategy {weights.get('strategy')!r} is "
                    f"not supported; use one of {', '.join(FP8_SCALE_STRATEGIES)}"
                )
        return "fp8"
    if method == "modelopt":
        algo = qc.get("quant_algo") or (hf.get("quantization") or {}).get("quant_algo")
        if algo != "FP8":
            raise UnsupportedQuantization(f"ModelOpt quant_algo {algo!r} is not supported; only FP8 is")
        return "fp8"
    raise UnsupportedQuantization(
        f"quantization_config.quant_method {method!r} is not supported; load a bf16 checkpoint "
        "(quantized as it loads with model.quantization int8 or fp8) or an FP8 one"
    )
