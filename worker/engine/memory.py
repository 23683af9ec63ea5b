"""Sizes the KV cache from the memory left once the weights are loaded and one warm-up pass at the largest
batch has run, as vLLM and nano-vllm do: the cache never takes memory the weights or activations need.

The arithmetic is pure (`kv_budget_bytes`, `decode_gather_bytes`, `blocks_for_budget`, `KvCachePlan`);
`read_cuda_memory` and `warm_up` are the only parts that touch the device.
"""

from __future__ import annotations

import dataclasses
import gc
from dataclasses import dataclass

import torch

from tandem.worker.api.params import SamplingParams
from tandem.worker.engine.layers.kv_cache import kv_block_nbytes
from tandem.worker.engine.models.protocol import CausalLM
from tandem.worker.engine.runner.engine import Engine, EngineConfig
from tandem.worker.hf.config import served_context_length

CPU_KV_BUDGET_BYTES = 1 << 30  # a KV cache on the CPU shares host memory with everything else: a fixed budget
GIB = 1 << 30


class KvCacheTooSmall(ValueError):
    """The memory left cannot hold one sequence at the model's context."""


@dataclass(frozen=True)
class MemoryReading:
    """Device memory after the weights loaded and the warm-up pass ran (its scratch state freed)."""

    free_bytes: int  # free on the device now: weights, CUDA context and other processes already out
    peak_bytes: int  # the most torch held during the warm-up: weights plus the largest batch's activations
    allocated_bytes: int  # what torch holds now: the weights

    @property
    def activation_bytes(self) -> int:
        return max(0, self.peak_bytes - self.allocated_bytes)


def kv_budget_bytes(reading: MemoryReading, memory_percent: int) -> int:
    """Bytes the KV cache may take: `memory_percent` of what is free once the weights are in, less the room
    the largest batch needs for its activations (released after the warm-up, needed again on every step)."""
    return reading.free_bytes * memory_percent // 100 - reading.activation_bytes


def decode_gather_bytes(
    budget_bytes: int,
    block_bytes: int,
    block_size: int,
    num_layers: int,
    max_context_tokens: int,
    gathered_block_bytes: int | None = None,
    padded: bool = False,
    attention: str = "sdpa",
) -> int:
    """The room a decode step over full contexts needs beyond the warm-up's: paged attention gathers one
    layer's keys and values of every decoding sequence (at most `max_context_tokens` = running x context,
    and at most what a cache of `budget_bytes` holds), a 1/num_layers share of those tokens' KV.
    `gathered_block_bytes` is what one block takes once gathered when that differs from the cache's (an
    8-bit cache: the packed copy and the one unpacked to the model's dtype). `padded`: the static decode step
    (`engine.decodeStep`) gathers every padded row's whole page-table bucket, whatever the cache holds.
    Only `sdpa` gathers: the `flex` and `triton` backends read the cache in place and need no room."""
    if attention != "sdpa":
        return 0
    tokens = (
        max_context_tokens
        if padded
        else min(max_context_tokens, max(0, budget_bytes) // block_bytes * block_size)
    )
    return tokens * ((gathered_block_bytes or block_bytes) // block_size) // num_layers


def blocks_for_budget(budget_bytes: int, block_bytes: int, min_blocks: int) -> int:
    """Whole blocks in the budget; at least `min_blocks` (one sequence at the full context) or an error."""
    blocks = max(0, budget_bytes) // block_bytes
    if blocks < min_blocks:
        raise KvCacheTooSmall(
            f"the KV cache gets {max(0, budget_bytes) / GIB:.2f} GiB = {blocks} blocks, fewer than the "
            f"{min_blocks} one sequence at the model's context needs: lower the context "
            "(model.maxContextLength), maxBatchTokens or the dtype, raise kvCacheMemoryPercent, or give the "
            "worker a larger GPU"
        )
    return blocks


@dataclass(frozen=True)
class KvCachePlan:
    """How many KV blocks a worker allocates, and what that holds."""

    num_blocks: int
    block_size: int
    block_bytes: int  # one block, all layers, keys and values
    max_model_len: int  # the context the worker serves
    source: str  # how the number was chosen, for the log

    @property
    def total_bytes(self) -> int:
        return self.num_blocks * self.block_bytes

    @property
    def max_concurrent_sequences(self) -> float:
        """Sequences at the full context the cache holds at once."""
        return self.num_blocks * self.block_size / self.max_model_len

    def describe(self) -> str:
        return (
            f"KV cache: {self.num_blocks} blocks of {self.block_size} tokens ({self.total_bytes / GIB:.2f} "
            f"GiB, {self.source}); {self.max_concurrent_sequences:.1f} concurrent sequences at the context "
            f"of {self.max_model_len} tokens"
        )


def min_blocks(max_model_len: int, block_size: int) -> int:
    return -(-max_model_len // block_size)


def warm_up(model: CausalLM, config: EngineConfig) -> int:
    """Run one engine step at the largest batch the scheduler can form (`max_batch_tokens` of prompt, in
    chunks of at most `prefill_chunk_tokens`, at most `max_running_sequences` of them) into a scratch KV
    cache that is freed afterwards. Returns the tokens the step computed."""
    max_len = served_context_length(model.config.max_position_embeddings, config.max_model_len)
    per_seq = max(1, min(config.prefill_chunk_tokens, config.max_batch_tokens, max_len - 1))
    lens: list[int] = []
    left = config.max_batch_tokens
    while left > 0 and len(lens) < config.max_running_sequences:
        lens.append(min(per_seq, left))
        left -= lens[-1]
    scratch = sum(min_blocks(n + 1, config.block_size) for n in lens)
    engine = Engine(model, dataclasses.replace(config, num_kv_blocks=scratch, enable_prefix_caching=False))
    for n in lens:
        engine.add_request([0] * n, SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
    engine.step()
    computed = engine.last_schedule.num_tokens if engine.last_schedule else 0
    del engine
    gc.collect()
    return computed


def read_cuda_memory(device: torch.device) -> MemoryReading:
    """Memory of `device` now, with the peak torch reached since the last `reset_peak_memory_stats`."""
    torch.cuda.synchronize(device)
    gc.collect()
    torch.cuda.empty_cache()
    free, _total = torch.cuda.mem_get_info(device)
    return MemoryReading(
        free_bytes=free,
        peak_bytes=torch.cuda.max_memory_allocated(device),
        allocated_bytes=torch.cuda.memory_allocated(device),
    )


def plan_kv_cache(
    model: CausalLM, config: EngineConfig, num_kv_blocks: int | None = None, memory_percent: int = 90
) -> KvCachePlan:
    """The KV cache for `model` (weights already loaded): `num_kv_blocks` if given; on a GPU, `memory_percent`
    of the memory left after a warm-up pass at the largest batch; on the CPU, that share of a fixed budget."""
    param = next(model.parameters())
    block_bytes = kv_block_nbytes(model.kv_config, config.block_size, param.dtype, config.kv_cache_dtype)
    gathered = block_bytes
    if config.kv_cache_dtype != "auto":
        gathered += kv_block_nbytes(model.kv_config, config.block_size, param.dtype)
    max_len = served_context_length(model.config.max_position_embeddings, config.max_model_len)

    def plan(blocks: int, source: str) -> KvCachePlan:
        return KvCachePlan(blocks, config.block_size, block_bytes, max_len, source)

    if num_kv_blocks:
        return plan(num_kv_blocks, "numKvBlocks")
    need = min_blocks(max_len, config.block_size)
    if param.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(param.device)
        warm_up(model, config)
        reading = read_cuda_memory(param.device)
        budget = kv_budget_bytes(reading, memory_percent)
        gather = decode_gather_bytes(
            budget,
            block_bytes,
            config.block_size,
            model.config.num_layers,
            config.max_running_sequences * max_len,
            gathered,
            padded=config.decode_step != "eager",
            attention=config.attention,
        )
        blocks = blocks_for_budget(budget - gather, block_bytes, need)
        return plan(
            blocks,
            f"{memory_percent}% of {reading.free_bytes / GIB:.2f} GiB free after the weights "
            f"({reading.allocated_bytes / GIB:.2f} GiB), less {reading.activation_bytes / GIB:.2f} GiB of "
            f"activations and {gather / GIB:.2f} GiB for decode attention",
        )
    budget = CPU_KV_BUDGET_BYTES * memory_percent // 100
    return plan(
        blocks_for_budget(budget, block_bytes, need),
        f"{memory_percent}% of a {CPU_KV_BUDGET_BYTES / GIB:.0f} GiB CPU budget",
    )
