"""What the engine calls on a model: the small contract every model class (and tensor parallelism's rank-0
view) meets.

The engine, its static decode step, the draft proposer and the KV-cache sizing see a model only through
`CausalLM`, so a new architecture (or a wrapper that runs one across ranks) needs these members and no others.
mypy holds every model class to it (the assignment at the bottom), and a unit test holds the registry to that
list.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Protocol

import torch
from torch import nn

from tandem.worker.engine.layers.attention import StepBatch
from tandem.worker.hf.config import ModelConfig

LayerHook = Callable[[int], None]  # called with a layer's index once it has written its KV


class PagedKv(Protocol):
    """A model's paged KV cache as the engine and the KV transfer use it: per layer `k[layer]`, `v[layer]`."""

    k: list[torch.Tensor]
    v: list[torch.Tensor]
    num_blocks: int
    block_size: int
    dtype: torch.dtype
    kv_cache_dtype: str

    @property
    def num_layers(self) -> int: ...

    def read_blocks(self, layer: int, block_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]: ...

    def write_blocks(self, layer: int, block_ids: list[int], k: torch.Tensor, v: torch.Tensor) -> None: ...


class CausalLM(Protocol):
    """A decoder over a paged KV cache: hidden states for a flat batch of tokens, then logits for chosen
    rows."""

    config: ModelConfig  # the whole model's (vocabulary, context, layers)

    @property
    def kv_config(self) -> ModelConfig:
        """The config the KV cache is shaped by (a tensor-parallel rank's share of the KV heads)."""
        ...

    def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]: ...

    def kv_cache(
        self, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device, kv_cache_dtype: str
    ) -> PagedKv: ...

    def forward(
        self,
        input_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        k_caches: list[torch.Tensor],  # per layer [num_blocks, block_size, KVH, D]
        v_caches: list[torch.Tensor],
        batch: StepBatch,
        layer_hook: LayerHook | None = None,
        num_layers: int | None = None,  # only the first this many layers, then the final norm (early exit)
    ) -> torch.Tensor: ...  # [T, H] final hidden states

    def __call__(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        k_caches: list[torch.Tensor],
        v_caches: list[torch.Tensor],
        batch: StepBatch,
        layer_hook: LayerHook | None = None,
        num_layers: int | None = None,
    ) -> torch.Tensor: ...

    def logits(
        self, hidden: torch.Tensor
    ) -> torch.Tensor: ...  # [N, H] -> [N, V] float32, the whole vocabulary


if (
    TYPE_CHECKING
):  # mypy checks each class against the protocol here; test_model_protocol holds the registry to it
    # relative: mypy resolves these by the files' own paths (the package-dir mapping hides `tandem.worker`
    # from it)
    from ..tp.model import TensorParallelModel
    from . import llama, mixtral, qwen2_moe

    MODEL_CLASSES: tuple[type[CausalLM], ...] = (
        llama.Transformer,
        mixtral.Model,
        qwen2_moe.Model,
        TensorParallelModel,
    )
