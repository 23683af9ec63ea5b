"""The engine bench's matmul floor times every decoder linear layer once and the LM head on sampled rows."""

from __future__ import annotations

from torch import nn

from bench.engine_floor import floor_seconds, linears
from tandem.worker.engine.loading import build_engine
from tandem.worker.engine.runner.engine import EngineConfig


def test_linears_are_every_decoder_projection_and_the_head_apart(tiny_model_dir):
    engine, _ = build_engine(tiny_model_dir, EngineConfig(num_kv_blocks=8), "float32", "cpu")
    layers, head = linears(engine.model)
    n = engine.model.config.num_layers
    assert len(layers) == 4 * n  # fused qkv, o, fused gate/up, down per layer
    assert head is engine.model.lm_head and all(lin is not head for lin in layers)


def test_floor_feeds_each_layer_the_token_rows_and_the_head_the_sampled_rows():
    seen: list[tuple[str, int]] = []
    model = nn.Module()
    model.a = nn.Linear(4, 8)
    model.b = nn.Linear(8, 4)
    model.lm_head = nn.Linear(4, 10)
    for name in ("a", "b", "lm_head"):
        getattr(model, name).register_forward_hook(
            lambda m, i, o, name=name: seen.append((name, i[0].shape[0]))
        )
    assert floor_seconds(model, tokens=7, sampled=2, repeats=1) >= 0
    assert seen == [("a", 7), ("b", 7), ("lm_head", 2)] * 2  # the warm-up pass, then the timed one
