"""The static decode step captured as CUDA graphs: the same logits and greedy tokens as the general path on
the GPU across batch and page-table buckets, replays only of captured buckets, and the KV pool left empty."""

from __future__ import annotations

import pytest
import torch

from tandem.worker.engine.loading import load_model
from tandem.worker.engine.runner.compiled import warm_up
from tandem.worker.engine.runner.engine import Engine, EngineConfig
from tests.decode_parity import requests, run_lockstep

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CUDA graphs)"),
]

SMALL = dict(block_size=4, num_kv_blocks=128, max_running_sequences=8, max_model_len=64)


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "int8"])
def test_cuda_graphs_match_the_general_path(tiny_model_dir, kv_cache_dtype):
    model = load_model(tiny_model_dir, "float32", "cuda")
    config = {**SMALL, "kv_cache_dtype": kv_cache_dtype}
    general = Engine(model, EngineConfig(**config))
    graphs = Engine(model, EngineConfig(**config, decode_step="cudaGraphs"))
    runner = graphs.decode_step
    assert runner is not None and runner.cuda_graphs
    warm_up(graphs)
    # before serving: the buckets a first request can take, and only those (capture is what made start slow)
    assert set(runner._graphs) == set(runner.start_shapes) == {s for s in runner.shapes if s[0] == 2}
    assert graphs.blocks.num_used == 0
    with torch.compiler.set_stance(
        "fail_on_recompile"
    ):  # larger batches' buckets captured on first use, no recompile
        run = run_lockstep(general, graphs, requests(9, longest=12), late=3)
    assert set(run.shapes) <= set(runner._graphs) and len(runner._graphs) > len(runner.start_shapes)
    assert run.tokens[0] == run.tokens[1]
    assert run.max_logit_diff < 1e-3, run.max_logit_diff  # TF32 off by default: fp32 matmuls on both paths
    assert run.static_steps > 10 and len(run.shapes) >= 3, run.shapes
    assert graphs.blocks.num_used == 0


def test_compiled_step_without_graphs_on_cuda(tiny_model_dir):
    model = load_model(tiny_model_dir, "bfloat16", "cuda")
    compiled = Engine(model, EngineConfig(**SMALL, decode_step="compiled"))
    warm_up(compiled)
    run = run_lockstep(Engine(model, EngineConfig(**SMALL)), compiled, requests(6, longest=12))
    assert run.static_steps > 5 and compiled.blocks.num_used == 0
    # bf16: padding may change a reduction's order, so a near tie can flip a token; most must agree
    pairs = [
        (a, b) for rid in run.tokens[0] for a, b in zip(run.tokens[0][rid], run.tokens[1][rid], strict=True)
    ]
    assert sum(a == b for a, b in pairs) >= 0.9 * len(pairs)
