"""bench.gpu_engine's FP8 rows: our engine with FP8 weights at Llama-3.1-8B's shape beside vLLM's FP8 figures.

The comparison point is `tandem/profiles/h200-llama-3.1-8b-fp8.json`, NVIDIA's measurement of vLLM serving
Llama-3.1-8B-Instruct-FP8 on one H200: decode at batch 1 (context 350), at batch 49 with 2,997-token
contexts, and a 2,134-token prefill. A random bf16 checkpoint at that shape is written with the tiny-model
tools and loaded with `quantization="fp8"` (quantized as it loads); decode runs through the CUDA-graph step.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from bench._roofline import Result
from bench.engine_timing import random_prompts, time_engine
from tandem.worker.engine.loading import load_model
from tandem.worker.engine.runner.compiled import warm_up
from tandem.worker.engine.runner.engine import Engine, EngineConfig

PROFILE = Path(__file__).resolve().parents[1] / "tandem/profiles/h200-llama-3.1-8b-fp8.json"
DECODE_POINTS = ((1, 512), (64, 512), (49, 3072))  # (batch, context): the rows
PREFILL_TOKENS = 2134
BLOCK_SIZE = 16


def vllm_figures(profile: dict) -> dict[str, float]:
    """The profile's figures the rows stand beside: ms per step at batch 1 and at batch 49 with ~3k contexts,
    and the prefill ms of 2,134 tokens (pure)."""
    steps = {(d["batch"], d["context_tokens"]): d["step_ms"] for d in profile["decode"]}
    batch1 = min((c, ms) for (b, c), ms in steps.items() if b == 1)[1]  # the shortest context measured
    batch49 = min((abs(c - 3072), ms) for (b, c), ms in steps.items() if b == 49)[1]
    prefill = next(p["ms"] for p in profile["prefill"] if p["prompt_tokens"] == PREFILL_TOKENS)
    return {"batch 1": batch1, "batch 49": batch49, "prefill": prefill}


def fp8_rows(
    args: argparse.Namespace,
    model_dir: Path,
    device: str,
    points=DECODE_POINTS,
    prefill_tokens: int = PREFILL_TOKENS,
) -> list[Result]:
    """ms per decode step at each (batch, context) and the prefill ms, each metric naming vLLM's figure."""
    vllm = vllm_figures(json.loads(PROFILE.read_text()))
    model = load_model(model_dir, args.dtype, device, quantization="fp8")
    longest = max(max(c for _, c in points), prefill_tokens) + args.new_tokens
    batch = max(b for b, _ in points)
    engine = Engine(
        model,
        EngineConfig(
            block_size=BLOCK_SIZE,
            num_kv_blocks=batch * -(-longest // BLOCK_SIZE) + 64,
            max_running_sequences=batch,
            max_batch_tokens=max(prefill_tokens, 8192),
            prefill_chunk_tokens=max(prefill_tokens, 8192),
            max_model_len=longest,
            decode_step="cudaGraphs" if device == "cuda" else "eager",
        ),
        eos_token_ids=(),
    )
    warm_up(engine)
    vocab = model.config.vocab_size
    results = []
    for b, context in points:
        time_engine(engine, random_prompts(b, context, vocab, seed=900 + b), 4)  # this shape, once
        tok_s = statistics.median(
            time_engine(
                engine, random_prompts(b, context, vocab, seed=901 + b + i), args.new_tokens
            ).decode_tok_s
            for i in range(args.repeats)
        )
        beside = {1: f"vLLM FP8 {vllm['batch 1']:.2f}", 49: f"vLLM FP8 {vllm['batch 49']:.2f} at 2,997"}.get(
            b, ""
        )
        results.append(
            Result(
                f"fp8 decode batch {b}, context {context}: ms/step ({beside or 'no vLLM figure'})",
                1e3 * b / tok_s,
                "ms",
            )
        )
    prefill_ms = statistics.median(
        1e3 * time_engine(engine, random_prompts(1, prefill_tokens, vocab, seed=950 + i), 1).prefill_s
        for i in range(args.repeats + 1)
    )
    results.append(
        Result(f"fp8 prefill {prefill_tokens} tokens: ms (vLLM FP8 {vllm['prefill']:.1f})", prefill_ms, "ms")
    )
    del engine, model
    if device == "cuda":
        torch.cuda.empty_cache()
    return results
