"""Model configuration read from a Hugging Face `config.json`, reduced to what our model files need."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tandem.worker.engine.models.registry import ARCHITECTURES


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
    tie_word_embeddings: bool = False
    architecture: str = "LlamaForCausalLM"
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)

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
        )
        for name, key in family.renamed.items():
            if key in hf:
                fields[name] = hf[key]
        return cls(**{**fields, **family.fixed})

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


def served_context_length(model_max_positions: int, requested: int | None) -> int:
    """The context length a deployment serves: the spec's `maxContextLength` when set, never more than the
    model's positions. Router and workers both call this, so they refuse the same requests."""
    if requested is None or requested <= 0:
        return model_max_positions
    return min(requested, model_max_positions)
