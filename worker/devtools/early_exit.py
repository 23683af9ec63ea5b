"""A target whose upper layers contribute little, so that exiting after its first layers mostly agrees with
it.

LayerSkip-trained models are trained for early exit; a random checkpoint is not, so tests and benchmarks of
the self-speculative draft construct one: the attention and MLP outputs of the layers past the draft are
scaled down, and the residual stream after the draft's layers is then (nearly, or at 0 exactly) the final one.
"""

from __future__ import annotations

import torch

from tandem.worker.engine.models.llama import Transformer


def upper_layers_scaled(model: Transformer, from_layer: int, factor: float) -> Transformer:
    """`model` with the o_proj and down_proj weights of layers >= `from_layer` multiplied by `factor`, in
    place."""
    with torch.no_grad():
        for layer in model.model.layers[from_layer:]:
            layer.self_attn.o_proj.weight.mul_(factor)
            layer.mlp.down_proj.weight.mul_(factor)
    return model
