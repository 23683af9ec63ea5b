"""Which model file serves a Hugging Face `architectures` entry, and the ModelConfig fields it fixes.

Torch-free, so the router can check a model directory without loading torch. Adding an architecture is
one file under models/ (a `Model` class and its `expected_shapes`: the checkpoint's tensor names) and one
line in ARCHITECTURES.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any


@dataclass(frozen=True)
class Architecture:
    module: str  # the file under models/ with its `Model` class and `expected_shapes`
    fixed: dict[str, Any] = field(
        default_factory=dict
    )  # ModelConfig fields it always has (Qwen2: q/k/v bias)


ARCHITECTURES: dict[str, Architecture] = {
    "LlamaForCausalLM": Architecture("llama"),
    "MistralForCausalLM": Architecture("llama"),
    "Qwen2ForCausalLM": Architecture("llama", fixed={"attention_bias": True}),
    "Qwen3ForCausalLM": Architecture("llama", fixed={"qk_norm": True}),
    "MixtralForCausalLM": Architecture("mixtral", fixed={"norm_topk_prob": True}),
    "Qwen2MoeForCausalLM": Architecture("qwen2_moe", fixed={"attention_bias": True}),
    "Qwen3MoeForCausalLM": Architecture(
        "qwen2_moe", fixed={"qk_norm": True}
    ),  # no shared expert in its config
}


def model_module(architecture: str) -> ModuleType:
    """The module under models/ that builds `architecture` (imports torch)."""
    return importlib.import_module(f"{__package__}.{ARCHITECTURES[architecture].module}")
