"""Mixtral: the Llama decoder with every MLP a mixture of experts (top-k of `num_local_experts`, weights
renormalised); the checkpoint names the block `block_sparse_moe` and each expert's projections w1/w3/w2."""

from __future__ import annotations

from torch import nn

from tandem.worker.engine.layers.moe import SparseMoe
from tandem.worker.engine.models import llama
from tandem.worker.hf.config import ModelConfig

EXPERT_NAMES = ("w1", "w3", "w2")  # gate, up, down


def rename_on_load(module: nn.Module, old: str, new: str) -> None:
    """Load the checkpoint's `{prefix}{old}.*` tensors into the submodule `new`."""

    def hook(state_dict: dict, prefix: str, *args: object) -> None:
        for key in [k for k in state_dict if k.startswith(prefix + old + ".")]:
            state_dict[prefix + new + key[len(prefix + old) :]] = state_dict.pop(key)

    module._register_load_state_dict_pre_hook(hook)


class Model(llama.Transformer):
    def __init__(self, config: ModelConfig):
        super().__init__(config)
        for layer in self.model.layers:
            rename_on_load(layer, "block_sparse_moe", "mlp")

    @staticmethod
    def make_mlp(config: ModelConfig, layer: int) -> nn.Module:
        return SparseMoe(config, EXPERT_NAMES)


def moe_shapes(config: ModelConfig, layer: int, prefix: str) -> dict[str, tuple[int, ...]]:
    hidden, inter = config.hidden_size, config.moe_intermediate_size
    p = prefix + "block_sparse_moe."
    shapes: dict[str, tuple[int, ...]] = {p + "gate.weight": (config.num_experts, hidden)}
    for e in range(config.num_experts):
        w1, w3, w2 = (f"{p}experts.{e}.{n}.weight" for n in EXPERT_NAMES)
        shapes.update({w1: (inter, hidden), w2: (hidden, inter), w3: (inter, hidden)})
    return shapes


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    return llama.expected_shapes(config, moe_shapes)
