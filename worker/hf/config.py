"""Model configuration read from a Hugging Face `config.json`, reduced to what our model files need."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tandem.worker.engine.models.registry import ARCHITECTURES
from tandem.worker.hf.quantization import UnsupportedQuantization, checkpoint_quantization


class ModelLoadError(ValueError):
    """A model directory that cannot be served, with a message that says why."""


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    attention_bias: bool = False  # Qwen2 has q/k/v bias
    qk_norm: bool = False  # Qwen3: an RMSNorm over each query and key head before rotary
    tie_word_embeddings: bool = False
    architecture: str = "LlamaForCausalLM"
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    # mixture of experts (0 experts: every layer's MLP is dense)
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0  # each routed expert's MLP width
    shared_expert_intermediate_size: int = 0  # Qwen2-MoE's always-on expert (0: none)
    norm_topk_prob: bool = False  # renormalise the top-k routing weights to sum to 1 (Mixtral always does)
    decoder_sparse_step: int = 1  # every this many layers is sparse (Qwen2-MoE)
    mlp_only_layers: tuple[int, ...] = ()  # layers that keep a dense MLP (Qwen2-MoE)
    checkpoint_quantization: str = "none"  # none | fp8: how the checkpoint stores its linear weights

    def is_moe_layer(self, layer: int) -> bool:
        """Whether `layer`'s MLP is routed experts (the rule transformers' Qwen2-MoE and Mixtral follow)."""
        return (
            self.num_experts > 0
            and layer not in self.mlp_only_layers
            and (layer + 1) % self.decoder_sparse_step == 0
        )

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> ModelConfig:
        archs = hf.get("architectures") or ["LlamaForCausalLM"]
        arch = archs[0]
        if arch not in ARCHITECTURES:
            raise ModelLoadError(f"unsupported architecture {arch!r}; supported: {', '.join(ARCHITECTURES)}")
        family = ARCHITECTURES[arch]
        heads = hf["num_attention_heads"]
        eos = hf.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
        # transformers >= 5 writes `rope_parameters`; older configs have `rope_theta` + `rope_scaling`
        rope = hf.get("rope_parameters") or {}
        rope_theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
        rope_scaling = hf.get("rope_scaling")
        if rope and rope.get("rope_type", "default") != "default":
            rope_scaling = rope
        fields: dict[str, Any] = dict(
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=hf.get("num_key_value_heads") or heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
            max_position_embeddings=hf.get("max_position_embeddings", 4096),
            rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            attention_bias=bool(hf.get("attention_bias", False)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            architecture=arch,
            bos_token_id=hf.get("bos_token_id"),
            eos_token_ids=eos_ids,
            num_experts=hf.get("num_experts")
            or hf.get("num_local_experts")
            or 0,  # Mixtral's key, and Qwen3-MoE's as transformers 5 writes it
            num_experts_per_tok=hf.get("num_experts_per_tok") or 0,
            moe_intermediate_size=hf.get("moe_intermediate_size") or hf["intermediate_size"],
            shared_expert_intermediate_size=hf.get("shared_expert_intermediate_size") or 0,
            norm_topk_prob=bool(hf.get("norm_topk_prob", False)),
            decoder_sparse_step=hf.get("decoder_sparse_step") or 1,
            mlp_only_layers=tuple(hf.get("mlp_only_layers") or ()),
            checkpoint_quantization=_checkpoint_quantization(hf),
        )
        config = cls(**{**fields, **family.fixed})
        if config.num_experts and not 0 < config.num_experts_per_tok <= config.num_experts:
            raise ModelLoadError(
                f"num_experts_per_tok must be in [1, {config.num_experts}], got {config.num_experts_per_tok}"
            )
        return config

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> ModelConfig:
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise ModelLoadError(f"{model_dir}: missing config.json")
        try:
            return cls.from_hf(json.loads(path.read_text()))
        except json.JSONDecodeError as e:
            raise ModelLoadError(f"{path}: not valid JSON ({e})") from None
        except KeyError as e:
            raise ModelLoadError(f"{path}: missing required key {e.args[0]!r}") from None


def _checkpoint_quantization(hf: dict[str, Any]) -> str:
    try:
        return checkpoint_quantization(hf)
    except UnsupportedQuantization as e:
        raise ModelLoadError(str(e)) from None


def served_context_length(model_max_positions: int, requested: int | None) -> int:
    """The context length a deployment serves: the spec's `maxContextLength` when set, never more than the
    model's positions. Router and workers both call this, so they refuse the same requests."""
    if requested is None or requested <= 0:
        return model_max_positions
    return min(requested, model_max_positions)
