"""Each rank's share of the model, and rank 0's view of the whole: a model and a KV cache that send every
call to the other ranks before running their own share, so the engine, the scheduler and the KV transfer
run on rank 0 unchanged.

Rank 0 holds one lock over each exchange with the others (a step's forward with its layer hooks, a KV read
or write), so a KV transfer's thread and the engine's thread never interleave commands. The KV cache's
blocks travel whole (every KV head): a read gathers each rank's heads, a write scatters them, so the wire
format and the peer's own split do not matter.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from tandem.worker.engine.layers import weight_fp8, weight_int8
from tandem.worker.engine.layers.attention import AttentionBatch, StepBatch
from tandem.worker.engine.layers.kv_cache import KvCache
from tandem.worker.engine.loading import load_state_dict, parse_dtype
from tandem.worker.engine.meta_init import on_meta_uninitialised
from tandem.worker.engine.models.llama import LayerHook, Transformer, rope_inv_freq
from tandem.worker.engine.models.registry import model_module
from tandem.worker.engine.tp.group import TpGroup
from tandem.worker.engine.tp.split import check_split, local_config, local_vocab, shard_tensor
from tandem.worker.hf.config import ModelConfig


class VocabParallelEmbedding(nn.Embedding):
    """This rank's rows of the token embedding; ids outside them read zeros, and the ranks' rows are
    summed."""

    def __init__(self, rows: int, dim: int, first: int):
        super().__init__(rows, dim)
        self.first = first
        self.reduce: Callable[[torch.Tensor], torch.Tensor] = lambda x: x

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.first
        outside = (local < 0) | (local >= self.num_embeddings)
        return self.reduce(
            F.embedding(local.masked_fill(outside, 0), self.weight).masked_fill(outside[:, None], 0)
        )


def load_shard(
    model_dir: str | Path, dtype: str, device: torch.device, quantization: str, group: TpGroup
) -> Transformer:
    """This rank's share of the checkpoint in our model, with the ranks' collectives in its forward."""
    config = ModelConfig.from_dir(model_dir)
    check_split(config, group.ranks)
    mine = local_config(config, group.ranks)
    state = load_state_dict(
        model_dir,
        config,
        parse_dtype(dtype),
        "cpu",
        shard=functools.partial(_slice, rank=group.rank, ranks=group.ranks),
    )
    state = {name: t.to(device) for name, t in state.items()}
    with on_meta_uninitialised():
        model: Transformer = model_module(config.architecture).Model(mine)
        embed = VocabParallelEmbedding(
            mine.vocab_size, config.hidden_size, group.rank * local_vocab(config.vocab_size, group.ranks)
        )
        model.model.embed_tokens = embed
    model.load_state_dict(state, strict=True, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.inv_freq = rope_inv_freq(mine).to(device)
    embed.reduce = group.all_reduce
    model.reduce = group.all_reduce
    model.gather_vocab = functools.partial(group.gather_last, size=config.vocab_size)
    del state
    if quantization == "int8":
        weight_int8.quantize_model(model)
    elif quantization == "fp8":  # each rank quantizes its own slice, per output channel
        weight_fp8.check_fp8(device)
        weight_fp8.quantize_model(model)
    return model.eval()


def _slice(name: str, tensor: torch.Tensor, rank: int, ranks: int) -> torch.Tensor:
    return shard_tensor(name, tensor, rank, ranks)


def portable(batch: AttentionBatch) -> tuple:
    """An attention batch as plain values, to send to the other ranks."""
    assert batch.table is not None
    return (
        batch.query_lens,
        batch.context_lens,
        batch.block_tables,
        batch.slot_mapping.cpu(),
        batch.block_size,
        batch.backend,
        batch.table.cpu(),
    )


def rebuilt(fields: tuple, device: torch.device) -> AttentionBatch:
    query_lens, context_lens, tables, slots, block_size, backend, table = fields
    return AttentionBatch(
        query_lens, context_lens, tables, slots.to(device), block_size, backend, table=table.to(device)
    )


class ShardedKvCache:
    """Rank 0's KV cache: its own heads for its forward (`k`, `v`), every rank's heads for a KV transfer."""

    def __init__(self, local: KvCache, group: TpGroup, lock: threading.RLock):
        self.local, self.group, self.lock = local, group, lock
        self.k, self.v = local.k, local.v
        self.num_blocks, self.block_size, self.dtype = local.num_blocks, local.block_size, local.dtype
        self.kv_cache_dtype = local.kv_cache_dtype

    @property
    def num_layers(self) -> int:
        return self.local.num_layers

    def read_blocks(self, layer: int, block_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        with self.lock:
            self.group.send(("read", layer, list(block_ids)))
            return read_shard(self.local, self.group, layer, block_ids)  # type: ignore[return-value]

    def write_blocks(self, layer: int, block_ids: list[int], k: torch.Tensor, v: torch.Tensor) -> None:
        with self.lock:
            self.group.send(("write", layer, list(block_ids)))
            write_shard(self.local, self.group, layer, block_ids, k, v)


def read_shard(
    kv: KvCache, group: TpGroup, layer: int, block_ids: list[int]
) -> tuple[torch.Tensor | None, ...]:
    """Every rank: send this rank's heads of the blocks; rank 0 gets them all (the others None)."""
    k, v = kv.read_blocks(layer, block_ids)
    return group.gather_heads(k), group.gather_heads(v)


def write_shard(kv: KvCache, group: TpGroup, layer: int, block_ids: list[int], k=None, v=None) -> None:  # noqa: ANN001
    """Every rank: write this rank's heads of rank 0's full blocks `k`, `v`."""
    like = kv.k[layer][: len(block_ids)]
    kv.write_blocks(layer, block_ids, group.scatter_heads(k, like), group.scatter_heads(v, like))


class TensorParallelModel(nn.Module):
    """Rank 0's model: the whole model's config, its own share's weights, and each call run on every rank."""

    def __init__(self, local: Transformer, config: ModelConfig, group: TpGroup):
        super().__init__()
        self.local, self.config, self.group = local, config, group
        self.lock = threading.RLock()

    @property
    def kv_config(self) -> ModelConfig:
        return self.local.config

    def kv_cache(
        self, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device, kv_cache_dtype: str
    ) -> ShardedKvCache:
        with self.lock:
            self.group.send(("kv", num_blocks, block_size, dtype, kv_cache_dtype))
            local = self.local.kv_cache(num_blocks, block_size, dtype, device, kv_cache_dtype)
        return ShardedKvCache(local, self.group, self.lock)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        k_caches: list[torch.Tensor],
        v_caches: list[torch.Tensor],
        batch: StepBatch,
        layer_hook: LayerHook | None = None,
        num_layers: int | None = None,
    ) -> torch.Tensor:
        if not isinstance(
            batch, AttentionBatch
        ):  # tensor_parallel_problem refuses a static decode step first
            raise TypeError("tensor-parallel ranks run the general step only (engine.decodeStep eager)")
        with self.lock:
            self.group.send(
                (
                    "forward",
                    input_ids.cpu(),
                    positions.cpu(),
                    portable(batch),
                    layer_hook is not None,
                    num_layers,
                )
            )
            hook = None
            if layer_hook is not None:
                user_hook = layer_hook

                def hook(layer: int) -> None:
                    try:
                        user_hook(layer)  # may read KV from every rank
                    finally:
                        self.group.send(("next",))

            return self.local(input_ids, positions, k_caches, v_caches, batch, hook, num_layers)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        with self.lock:
            self.group.send(("logits", hidden.cpu()))
            return self.local.logits(hidden)

    def stop(self) -> None:
        with self.lock:
            self.group.stop()


def load_tensor_parallel(
    model_dir: str | Path, dtype: str, quantization: str, group: TpGroup
) -> TensorParallelModel:
    """Rank 0: every rank loads its share of the checkpoint; rank 0's model runs them all."""
    model_dir = Path(model_dir).resolve()
    config = ModelConfig.from_dir(model_dir)
    check_split(config, group.ranks)  # here, before the other ranks are told to load
    with torch.inference_mode(False):
        group.send(("load", str(model_dir), str(dtype), quantization))
        local = load_shard(model_dir, dtype, group.device, quantization, group)
    return TensorParallelModel(local, config, group)
