"""Qwen2-MoE and Qwen3-MoE: sparse layers route each token to the top k experts (renormalised only when
`norm_topk_prob`), plus, in Qwen2-MoE, a shared expert on every token behind a sigmoid gate;
`decoder_sparse_step` and `mlp_only_layers` keep some layers dense. Their attention differs only in what
the registry fixes (Qwen2-MoE: q/k/v bias; Qwen3-MoE: per-head q/k norms)."""

from __future__ import annotations

from torch import nn

from tandem.worker.engine.layers.moe import SparseMoe
from tandem.worker.engine.models import llama
from tandem.worker.hf.config import ModelConfig

EXPERT_NAMES = ("gate_proj", "up_proj", "down_proj")


class Model(llama.Transformer):
    @staticmethod
    def make_mlp(config: ModelConfig, layer: int) -> nn.Module:
        if not config.is_moe_layer(layer):
            return llama.MLP(config)
        shared = config.shared_expert_intermediate_size
        return SparseMoe(config, EXPERT_NAMES, llama.MLP(config, shared) if shared else None)


def moe_shapes(config: ModelConfig, layer: int, prefix: str) -> dict[str, tuple[int, ...]]:
    if not config.is_moe_layer(layer):
        return llama.dense_mlp_shapes(config, layer, prefix)
    hidden, inter, shared = (
        config.hidden_size,
        config.moe_intermediate_size,
        config.shared_expert_intermediate_size,
    )
    p = prefix + "mlp."
    shapes: dict[str, tuple[int, ...]] = {p + "gate.weight": (config.num_experts, hidden)}
    for e in range(config.num_experts):
        gate, up, down = (f"{p}experts.{e}.{n}.weight" for n in EXPERT_NAMES)
        shapes.update({gate: (inter, hidden), up: (inter, hidden), down: (hidden, inter)})
    if shared:
        s = p + "shared_expert."
        shapes.update({s + "gate_proj.weight": (shared, hidden), s + "up_proj.weight": (shared, hidden)})
        shapes.update(
            {s + "down_proj.weight": (hidden, shared), p + "shared_expert_gate.weight": (1, hidden)}
        )
    return shapes


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    return llama.expected_shapes(config, moe_shapes)
