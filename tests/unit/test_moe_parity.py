"""Mixtral, Qwen2-MoE and Qwen3-MoE against transformers on random tiny checkpoints (fp32): written by
transformers' save_pretrained, read by our loader (per-expert tensors stacked as they load), run through our
engine."""

from __future__ import annotations

import pytest
import torch

from tandem.worker.engine.layers.moe import Experts, SparseMoe, route
from tandem.worker.engine.layers.weight_int8 import Int8Linear
from tandem.worker.engine.loading import load_model
from tests.hf_reference import MIXTRAL, QWEN2_MOE, QWEN3_MOE, engine_for, hf_greedy, hf_model
from tests.unit.test_model_parity import _forward, _prompt, _run, assert_prompt_and_decode_steps_match

CONFIGS = {
    "mixtral-odd-kv-untied": MIXTRAL,
    "qwen2-moe-shared-tied": QWEN2_MOE,
    "qwen3-moe-qk-norm": QWEN3_MOE,
}


@pytest.fixture(scope="module", params=list(CONFIGS))
def pair(request, tmp_path_factory):
    hf = hf_model(CONFIGS[request.param])
    model_dir = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(model_dir)
    return hf, load_model(model_dir), model_dir


def test_prompt_and_decode_logits_match_transformers(pair):
    hf, ours, _ = pair
    assert_prompt_and_decode_steps_match(hf, ours, prompt_len=29, steps=6)


def test_continuous_batch_greedy_tokens_match_transformers_over_32_tokens(pair):
    hf, ours, _ = pair
    prompts = [_prompt(n, seed=n) for n in (5, 19, 11)]
    got = _run(engine_for(ours, prefill_chunk_tokens=8), prompts, 32)
    for rid, prompt in zip(got, prompts, strict=True):
        assert got[rid] == hf_greedy(hf, prompt, 32)


def test_dense_qwen3_shares_the_qk_norm_attention(tmp_path):
    dense = {
        k: v
        for k, v in QWEN3_MOE.items()
        if k not in ("num_experts", "num_experts_per_tok", "moe_intermediate_size")
    }
    hf = hf_model({**dense, "architectures": ["Qwen3ForCausalLM"]})
    hf.save_pretrained(tmp_path)
    ours = load_model(tmp_path)
    prompt = _prompt(21, seed=4)
    logits = _forward(ours, engine_for(ours).kv, prompt, 0, list(range(4)), 8)
    with torch.no_grad():
        ref = hf(torch.tensor([prompt])).logits[0]
    torch.testing.assert_close(logits, ref, atol=1e-4, rtol=0)


def test_grouped_experts_equal_each_token_through_its_experts():
    torch.manual_seed(0)
    experts = Experts(5, 16, 12, ("gate", "up", "down"))
    with torch.no_grad():
        experts.gate_up.normal_()
        experts.down.normal_()
        x = torch.randn(9, 16)
        weights, chosen = route(torch.randn(9, 5), 2, renormalize=True)
        got = experts(x, weights, chosen)
    assert torch.allclose(weights.sum(-1), torch.ones(9))
    for t in range(9):
        want = torch.zeros(16)
        for w, e in zip(weights[t], chosen[t], strict=True):
            gate, up = (experts.gate_up[e] @ x[t]).split(12)
            want += w * (experts.down[e] @ (torch.nn.functional.silu(gate) * up))
        torch.testing.assert_close(got[t], want, atol=1e-5, rtol=1e-5)
    with torch.no_grad():  # the static-shape path a compiled or captured decode step takes
        torch.testing.assert_close(experts.dense(x, weights, chosen), got, atol=1e-5, rtol=1e-5)


def test_routing_without_renormalisation_keeps_the_softmax_weights():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    weights, chosen = route(logits, 2, renormalize=False)
    probs = torch.softmax(logits, -1)[0]
    assert chosen.tolist() == [[0, 1]]
    torch.testing.assert_close(weights[0], probs[:2])


@pytest.mark.parametrize("arch", ["mixtral", "qwen2_moe"])
def test_create_tiny_moe_loads_in_transformers_and_matches_ours(tmp_path, arch):
    import transformers

    from tandem.cli import main as tandem_main

    argv = [
        "model",
        "create-tiny",
        str(tmp_path),
        "--arch",
        arch,
        "--layers",
        "2",
        "--hidden",
        "64",
        "--heads",
        "4",
    ]
    assert (
        tandem_main(
            [*argv, "--kv-heads", "2", "--intermediate", "96", "--experts", "6", "--experts-per-token", "2"]
        )
        == 0
    )
    hf = (
        transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager")
        .float()
        .eval()
    )
    ours = load_model(tmp_path)
    assert ours.config.num_experts == 6 and ours.config.num_experts_per_tok == 2
    prompt = _prompt(17, seed=2)
    logits = _forward(ours, engine_for(ours).kv, prompt, 0, list(range(4)), 8)
    with torch.no_grad():
        ref = hf(torch.tensor([prompt])).logits[0]
    torch.testing.assert_close(logits, ref, atol=1e-4, rtol=0)


def _greedy(engine, prompts: list[list[int]], n: int) -> list[list[int]]:
    return list(_run(engine, prompts, n).values())


PROMPTS = [_prompt(n, seed=n) for n in (6, 23)]


def test_int8_weights_quantize_attention_and_dense_layers_and_keep_routing_exact(pair):
    _, ours, model_dir = pair
    quantized = load_model(model_dir, quantization="int8")
    moe = next(layer.mlp for layer in quantized.model.layers if isinstance(layer.mlp, SparseMoe))
    ref = next(layer.mlp for layer in ours.model.layers if isinstance(layer.mlp, SparseMoe))
    assert isinstance(quantized.model.layers[0].self_attn.qkv_proj, Int8Linear)
    assert torch.equal(moe.gate.weight, ref.gate.weight) and torch.equal(
        moe.experts.gate_up, ref.experts.gate_up
    )
    if moe.shared_expert is not None:
        assert isinstance(moe.shared_expert.gate_up_proj, Int8Linear)
    prompt = PROMPTS[1]
    table = list(range(4))
    got = _forward(quantized, engine_for(quantized).kv, prompt, 0, table, 8)
    want = _forward(ours, engine_for(ours).kv, prompt, 0, table, 8)
    # int8 attention can move a token across a routing boundary, so compare on average, not per element
    error = float((got - want).abs().mean() / want.abs().mean())
    assert error < 0.1


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_speculative_decoding_keeps_greedy_tokens(pair, method):
    from tandem.worker.engine.speculative.proposer import SpeculativeConfig

    _, ours, _ = pair
    spec = SpeculativeConfig(method=method, num_tokens=3, draft_layers=1 if method == "draft" else None)
    assert _greedy(engine_for(ours, speculative=spec), PROMPTS, 24) == _greedy(engine_for(ours), PROMPTS, 24)


def test_8bit_kv_cache_runs_moe_close_to_the_full_cache(pair):
    _, ours, _ = pair
    prompt = PROMPTS[1]
    full = _forward(ours, engine_for(ours).kv, prompt, 0, list(range(4)), 8)
    packed = _forward(ours, engine_for(ours, kv_cache_dtype="int8").kv, prompt, 0, list(range(4)), 8)
    assert float((packed - full).abs().max()) < 0.05 * float(full.abs().max())
    assert _greedy(engine_for(ours, kv_cache_dtype="int8"), PROMPTS, 8)


def test_static_decode_step_matches_the_general_path(pair):
    from tandem.worker.engine.runner.engine import Engine, EngineConfig
    from tests.decode_parity import requests, run_lockstep, static_engine

    _, ours, _ = pair
    small = dict(block_size=8, num_kv_blocks=64, max_running_sequences=4)
    run = run_lockstep(
        Engine(ours, EngineConfig(**small)), static_engine(ours, False, **small), requests(5, vocab=500)
    )
    assert run.tokens[0] == run.tokens[1] and run.static_steps > 0
    assert run.max_logit_diff < 1e-4
