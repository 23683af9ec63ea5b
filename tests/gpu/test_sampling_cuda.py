"""Sampling on the GPU: a decode step's sampler waits for the device once (the sampled ids), whatever mix of
greedy, filtered, seeded, penalised and min_tokens rows it draws, and once more per kind of logprobs asked."""

from __future__ import annotations

import dataclasses
import random
import warnings

import pytest
import torch

from tandem.worker.api.params import SamplingParams
from tandem.worker.engine.loading import load_model
from tandem.worker.engine.runner.engine import Engine, EngineConfig
from tests.unit.test_sampling_batched import random_params

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA GPU (counts its stream synchronisations)"
    ),
]


def syncs_per_draw(engine: Engine, monkeypatch) -> list[int]:
    """Run the engine's sampler under torch's sync debug mode: each synchronisation it makes warns once."""
    draw, counts = engine._draw, []

    def counted(*args):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                return draw(*args)
            finally:
                torch.cuda.set_sync_debug_mode("default")
                counts.append(sum("synchroniz" in str(w.message) for w in caught))

    monkeypatch.setattr(engine, "_draw", counted)
    return counts


def test_one_sync_per_step_for_the_sampled_ids(tiny_model_dir, monkeypatch):
    engine = Engine(
        load_model(tiny_model_dir, "float32", "cuda"), EngineConfig(num_kv_blocks=64, block_size=4)
    )
    for i, params in enumerate(random_params(random.Random(5), 8)):
        engine.add_request([5 + i, 9, 13], dataclasses.replace(params, min_tokens=2, max_tokens=6))
    counts = syncs_per_draw(engine, monkeypatch)
    for _ in range(4):
        engine.step()
    assert counts == [1, 1, 1, 1], counts
    engine.add_request([4, 4], SamplingParams(max_tokens=2, logprobs=True, top_logprobs=2))
    engine.step()
    assert counts[-1] == 3, counts  # the ids, the logprobs, the alternatives
