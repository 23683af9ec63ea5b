"""Optional torch.compile of the model's per-token layers, and the warm-up a worker runs before it serves.

Norms and MLPs are tensor-in, tensor-out, so they compile whole with dynamic token counts (one graph
for prefill chunks, one for decode batches; sizes 1 and 2+ specialise). Attention stays eager: its
inputs are the step's page tables. Compiling is slow (tens of seconds), so the worker runs `warm_up`
before it reports ready (compiled or not): the static decode step's buckets first (`engine.decodeStep`: each
compiled, and on CUDA captured), then requests that take every other path of a step (step_paths.py) once.
"""

from __future__ import annotations

import dataclasses
import logging

import torch

from tandem.worker.api.params import SamplingParams
from tandem.worker.engine.models.llama import DecoderLayer, Transformer
from tandem.worker.engine.runner.engine import Engine

log = logging.getLogger(__name__)


def compile_layers(model: Transformer) -> Transformer:
    """Compile each layer's norms and MLP and the final norm in place; returns the model."""
    layer: DecoderLayer
    for layer in model.model.layers:  # type: ignore[assignment]
        for name in ("input_layernorm", "post_attention_layernorm", "mlp"):
            getattr(layer, name).compile(dynamic=True)
    model.model.norm.compile(dynamic=True)
    return model


# A warm-up request that takes every sampling path at once (filters, seed, penalties, min_tokens, logprobs).
EVERY_SAMPLING_PATH = SamplingParams(
    max_tokens=3,
    temperature=0.8,
    top_k=5,
    top_p=0.9,
    min_p=0.05,
    seed=0,
    repetition_penalty=1.1,
    presence_penalty=0.1,
    frequency_penalty=0.1,
    min_tokens=1,
    logprobs=True,
    top_logprobs=2,
    ignore_eos=True,
)


def warm_up(engine: Engine) -> int:
    """Run every path a first request can take once, before the worker reports ready: the static decode step's
    buckets (compiled, and on CUDA captured), a short prompt, a prompt of one whole prefill chunk, a single
    and a batched decode, and each sampling path; returns the steps run. The engine is `ready` afterwards, and
    a path first taken later is logged and recorded (`Engine.cold_after_ready`)."""
    runner = engine.decode_step
    if runner is not None:
        kind = "captured as CUDA graphs" if runner.cuda_graphs else "compiled"
        seconds = runner.warm_up()
        log.info("decode step: %d buckets %s in %.1f s", len(runner.shapes), kind, seconds)
    greedy = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    config, block = engine.config, engine.config.block_size
    chunk = max(
        2, min(config.prefill_chunk_tokens, engine.max_model_len - 4, (config.num_kv_blocks // 2) * block - 1)
    )
    waves = [
        [([1] * 5, greedy)],
        [([1] * 5, greedy), ([1] * 6, greedy)],
        [([2] * chunk, dataclasses.replace(greedy, max_tokens=2))],
        [([3] * 5, EVERY_SAMPLING_PATH), ([1] * 5, greedy)],
    ]
    steps = 0
    for w, wave in enumerate(waves):
        for i, (prompt, params) in enumerate(wave):
            engine.add_request(prompt, params, request_id=f"warm-up-{w}-{i}")
        while engine.has_work():
            engine.step()
            steps += 1
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)
    engine.ready = True
    return steps
