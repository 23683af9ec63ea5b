"""How a model splits across tensor-parallel ranks: the rule for `resources.gpus`, each rank's share of the
config, and each checkpoint tensor's slice (pure: no process group).

Attention splits by head (q/k/v by rows, o_proj by columns), every MLP and every expert's MLP by its
intermediate width (gate/up by rows, down by columns), so each rank's partial outputs sum to the layer's
output; the embedding and LM head split the vocabulary by rows, padded to a multiple of the ranks. Norms,
the MoE router and Qwen2-MoE's shared-expert gate are replicated.
"""

from __future__ import annotations

import dataclasses

import torch

from tandem.worker.hf.config import ModelConfig, ModelLoadError

GPUS_FIELD = "resources.gpus"
ROWS = (
    "q_proj.weight",
    "q_proj.bias",
    "k_proj.weight",
    "k_proj.bias",
    "v_proj.weight",
    "v_proj.bias",
    "gate_proj.weight",
    "up_proj.weight",
    "w1.weight",
    "w3.weight",
)
COLUMNS = ("o_proj.weight", "down_proj.weight", "w2.weight")
VOCAB = ("model.embed_tokens.weight", "lm_head.weight")


def is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def split_problem(config: ModelConfig, ranks: int) -> str | None:
    """Why `config` cannot run on `ranks` tensor-parallel ranks, naming the field; None when it can."""
    if ranks <= 1:
        return None
    if not is_power_of_two(ranks):
        return f"{GPUS_FIELD} must be a power of two to split the model across GPUs, got {ranks}"
    widths = {
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "intermediate_size": config.intermediate_size,
    }
    if config.num_experts:
        widths["moe_intermediate_size"] = config.moe_intermediate_size
    if config.shared_expert_intermediate_size:
        widths["shared_expert_intermediate_size"] = config.shared_expert_intermediate_size
    for name, width in widths.items():
        if width % ranks:
            return (
                f"{GPUS_FIELD}: {ranks} does not divide the model's {name} ({width}); "
                f"use a power of two that divides it"
            )
    return None


def tensor_parallel_problem(
    config: ModelConfig, ranks: int, device: str, decode_step: str, compiled: bool, cuda_devices: int | None
) -> str | None:
    """Why a worker cannot run `config` on `ranks` ranks here (the split, the devices, the engine knobs)."""
    problem = split_problem(config, ranks)
    if problem or ranks <= 1:
        return problem
    if cuda_devices is not None and cuda_devices < ranks:
        return f"{GPUS_FIELD}: {ranks} ranks need {ranks} GPUs, this node shows {cuda_devices}"
    if str(decode_step) != "eager" or compiled:
        return f"{GPUS_FIELD} > 1 runs eager steps: set engine.decodeStep eager and engine.compile false"
    return None


def check_split(config: ModelConfig, ranks: int) -> None:
    problem = split_problem(config, ranks)
    if problem:
        raise ModelLoadError(problem)


def local_vocab(vocab_size: int, ranks: int) -> int:
    """Rows of the embedding and LM head each rank holds (the last rank's padded with zeros)."""
    return -(-vocab_size // ranks)


def local_config(config: ModelConfig, ranks: int) -> ModelConfig:
    """One rank's share: 1/N of the heads, KV heads, MLP widths and (padded) vocabulary; head_dim
    unchanged."""
    if ranks <= 1:
        return config
    check_split(config, ranks)
    return dataclasses.replace(
        config,
        vocab_size=local_vocab(config.vocab_size, ranks),
        num_heads=config.num_heads // ranks,
        num_kv_heads=config.num_kv_heads // ranks,
        intermediate_size=config.intermediate_size // ranks,
        moe_intermediate_size=config.moe_intermediate_size // ranks,
        shared_expert_intermediate_size=config.shared_expert_intermediate_size // ranks,
    )


def shard_tensor(name: str, tensor: torch.Tensor, rank: int, ranks: int) -> torch.Tensor:
    """Rank `rank`'s slice of the checkpoint tensor `name` (by its Hugging Face name), a copy of its own."""
    if ranks <= 1:
        return tensor
    if name in VOCAB:
        rows = local_vocab(tensor.shape[0], ranks)
        part = tensor[rank * rows : (rank + 1) * rows]
        if part.shape[0] < rows:  # the last rank: zero rows past the vocabulary (their logits are dropped)
            part = torch.cat([part, part.new_zeros(rows - part.shape[0], *part.shape[1:])])
        return part.clone()
    if name.endswith(ROWS):
        return tensor.chunk(ranks, dim=0)[rank].clone()
    if name.endswith(COLUMNS):
        return tensor.chunk(ranks, dim=1)[rank].contiguous()
    return tensor
