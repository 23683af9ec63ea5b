"""What one engine step of a model has to move and compute, and our engine timed against an H200's peaks
(bench/gpu_engine.py's measurements: memory-bandwidth and FLOP utilisation, decode step times)."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from bench.engine_timing import random_prompts, time_engine
from tandem.worker.api.params import SamplingParams
from tandem.worker.engine.runner.engine import Engine
from tandem.worker.hf.config import ModelConfig

PEAK_BANDWIDTH = 4.8e12  # H200 HBM3e, bytes/s
PEAK_BF16_FLOPS = 790e12  # dense bf16 FLOP/s


# --- what a step has to move and compute ---------------------------------------------------------
def weight_bytes_per_step(model: torch.nn.Module) -> int:
    """Bytes of weights one decode step reads: every distinct parameter, except the embedding table
    when it is not tied (a lookup reads only a few rows; tied, lm_head reads it all)."""
    params = {p.data_ptr(): p for p in model.parameters()}
    total = sum(p.numel() * p.element_size() for p in params.values())
    embed = model.model.embed_tokens.weight
    if not model.config.tie_word_embeddings:
        total -= embed.numel() * embed.element_size()
    return total


def kv_bytes_per_token(config: ModelConfig, dtype: torch.dtype) -> int:
    """Bytes of keys and values one cached token holds across all layers."""
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * torch.finfo(dtype).bits // 8


def linear_params(config: ModelConfig) -> int:
    """Weights of the per-token matmuls in the layers (embedding lookup and lm_head excluded)."""
    h, q, kv = config.hidden_size, config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * config.intermediate_size
    return config.num_layers * per_layer


def prefill_flops(config: ModelConfig, tokens: int) -> float:
    """FLOPs of a causal prefill of `tokens`: the layer matmuls, causal attention, and lm_head for one row."""
    matmuls = 2 * linear_params(config) * tokens
    attention = (
        2 * config.num_layers * tokens * tokens * config.num_heads * config.head_dim
    )  # QK^T + PV, causal half
    return matmuls + attention + 2 * config.hidden_size * config.vocab_size


# --- measurements ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Result:
    metric: str
    value: float
    unit: str
    target: float | None = None  # minimum value

    @property
    def met(self) -> bool | None:
        return None if self.target is None else self.value >= self.target


def decode_step_times(engine: Engine, prompt: list[int], new_tokens: int) -> list[float]:
    """Seconds of each decode step (after the first token) of one sequence."""
    engine.add_request(prompt, SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True))
    times = []
    while engine.has_work():
        start = time.perf_counter()
        outs = engine.step()  # synchronises: the logits are copied to the host
        times.append(time.perf_counter() - start)
        assert len(outs) == 1
    return times[1:]


def decode_bandwidth(engine: Engine, context: int, new_tokens: int, seed: int) -> tuple[float, float]:
    """(bandwidth utilisation, median step seconds) of batch-1 decode after a `context`-token prompt."""
    config = engine.model.config
    prompt = random_prompts(1, context, config.vocab_size, seed)[0]
    step_s = statistics.median(decode_step_times(engine, prompt, new_tokens))
    mean_context = context + new_tokens / 2
    read = weight_bytes_per_step(engine.model) + mean_context * kv_bytes_per_token(config, engine.dtype)
    return read / step_s / PEAK_BANDWIDTH, step_s


def prefill_utilisation(engine: Engine, tokens: int, seed: int) -> tuple[float, float]:
    """(FLOP utilisation, seconds) of one `tokens`-long prompt prefilled in a single step."""
    prompt = random_prompts(1, tokens, engine.model.config.vocab_size, seed)[0]
    seconds = time_engine(engine, [prompt], 2).prefill_s
    return prefill_flops(engine.model.config, tokens) / seconds / PEAK_BF16_FLOPS, seconds


def median_of(repeats: int, measure, seed: int) -> tuple[float, float]:
    runs = [measure(seed + i) for i in range(repeats)]
    return statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
