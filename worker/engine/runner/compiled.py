"""Optional torch.compile of the model's per-token layers, and the warm-up a worker runs before it serves.

Norms and MLPs are tensor-in, tensor-out, so they compile whole with dynamic token counts (one graph
for prefill chunks, one for decode batches; sizes 1 and 2+ specialise). Attention stays eager: its
inputs are the step's page tables. Compiling is slow (tens of seconds), so the worker runs `warm_up`
before it reports ready: the static decode step's buckets first (`engine.decodeStep`: each compiled, and
on CUDA captured), then a short prompt, a single decode and a batched decode hit every graph.
"""

from __future__ import annotations

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


def warm_up(engine: Engine) -> int:
    """Warm up the static decode step's buckets, then run a few tiny requests to completion (prefill, single and
    batched decode); returns the steps run."""
    runner = engine.decode_step
    if runner is not None:
        kind = "captured as CUDA graphs" if runner.cuda_graphs else "compiled"
        seconds = runner.warm_up()
        log.info("decode step: %d buckets %s in %.1f s", len(runner.shapes), kind, seconds)
    greedy = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    engine.add_request([1] * 5, greedy, request_id="warm-up-0")
    steps = 0
    while engine.has_work():
        engine.step()
        steps += 1
    for i in (1, 2):
        engine.add_request([1] * (4 + i), greedy, request_id=f"warm-up-{i}")
    while engine.has_work():
        engine.step()
        steps += 1
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)
    return steps
