"""On a GPU the KV cache is sized after the weights and a warm-up batch: weights + cache + activations fit,
and a step at the largest batch runs after the whole cache is allocated."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tandem.worker.api.params import SamplingParams
from tandem.worker.devtools.tiny import TinySpec, create_tiny_model
from tandem.worker.engine.loading import engine_for_model, load_model
from tandem.worker.engine.memory import plan_kv_cache
from tandem.worker.engine.runner.engine import EngineConfig

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

# ~0.4B parameters: big enough that weights and activations are a visible share of what the cache may take
SPEC = TinySpec(layers=8, hidden=2048, heads=16, kv_heads=8, intermediate=5632, max_positions=8192)


def test_cache_takes_what_weights_and_activations_leave_and_a_max_batch_still_runs(tmp_path):
    model_dir = create_tiny_model(tmp_path / "m", SPEC)
    torch.cuda.empty_cache()
    free_before, _ = torch.cuda.mem_get_info()
    model = load_model(model_dir, "bfloat16", "cuda")
    weights = torch.cuda.memory_allocated()
    config = EngineConfig(max_batch_tokens=4096, prefill_chunk_tokens=1024, max_model_len=8192)
    percent = 90  # the spec default
    plan = plan_kv_cache(model, config, memory_percent=percent)
    assert plan.total_bytes <= (free_before - weights) * percent // 100
    assert plan.num_blocks * plan.block_size >= 8192  # at least one full context
    engine, _ = engine_for_model(model, model_dir, dataclasses.replace(config, num_kv_blocks=plan.num_blocks))
    for _ in range(4):
        engine.add_request([1] * 1024, SamplingParams(max_tokens=1, ignore_eos=True))
    outputs = engine.step()  # 4096 prompt tokens in one step, with the whole cache allocated
    assert len(outputs) == 4
    torch.cuda.synchronize()
    assert torch.cuda.mem_get_info()[0] > 0
