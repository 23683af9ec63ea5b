"""Tensor parallelism on the CPU: two ranks (this process and one it starts, over gloo) against one rank, on
random tiny checkpoints: fp32 logits within 1e-4 and greedy tokens identical over 32 tokens, for an odd
per-rank head count and an odd vocabulary, tied and untied embeddings, q/k/v bias and a mixture of experts
with a shared expert; and the KV blocks a transfer reads and writes hold every rank's heads."""

from __future__ import annotations

import pytest
import torch

from tandem.worker.engine.loading import load_model
from tandem.worker.engine.tp.group import start_ranks
from tandem.worker.engine.tp.model import load_tensor_parallel
from tandem.worker.hf.config import ModelLoadError
from tests.hf_reference import LLAMA_GQA, MIXTRAL, QWEN2_BIAS, QWEN2_MOE, engine_for, hf_model
from tests.unit.test_model_parity import _forward, _prompt, _run

ODD_HEADS = {
    **LLAMA_GQA,
    "num_attention_heads": 6,
    "num_key_value_heads": 2,
    "hidden_size": 96,
    "vocab_size": 509,
}
CONFIGS = {
    "llama-3-heads-per-rank-odd-vocab-untied": ODD_HEADS,
    "qwen2-bias-tied": QWEN2_BIAS,
    "qwen2-moe-shared-expert-tied": QWEN2_MOE,
}


@pytest.fixture(scope="module")
def group():
    g = start_ranks(2, "cpu", threads=1)
    yield g
    g.stop()


@pytest.fixture(scope="module", params=list(CONFIGS))
def models(request, group, tmp_path_factory):
    model_dir = tmp_path_factory.mktemp(request.param)
    hf_model(CONFIGS[request.param]).save_pretrained(model_dir)
    return load_model(model_dir), load_tensor_parallel(model_dir, "float32", "none", group)


def test_prompt_and_decode_logits_match_one_rank(models):
    one, two = models
    prompt, table = _prompt(29, seed=3), list(range(8))
    ref = _forward(one, engine_for(one).kv, prompt, 0, table, 8)
    kv = engine_for(two).kv
    got = _forward(two, kv, prompt, 0, table, 8)
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=0)
    assert got.shape[-1] == one.config.vocab_size  # the padded rows of the last rank's vocabulary are cut


def test_greedy_tokens_match_one_rank_over_32_tokens(models):
    one, two = models
    prompts = [_prompt(n, seed=n) for n in (5, 19, 11)]
    assert _run(engine_for(two, prefill_chunk_tokens=8), prompts, 32) == _run(
        engine_for(one, prefill_chunk_tokens=8), prompts, 32
    )


def test_kv_blocks_read_with_every_rank_s_heads_and_written_back_to_each(models):
    one, two = models
    prompt, table = _prompt(21, seed=5), [3, 1, 4]
    kv_one, kv_two = engine_for(one).kv, engine_for(two).kv
    _forward(one, kv_one, prompt, 0, table, 8)
    _forward(two, kv_two, prompt, 0, table, 8)
    for layer in range(one.config.num_layers):
        k1, v1 = kv_one.read_blocks(layer, table)
        k2, v2 = kv_two.read_blocks(layer, table)
        assert k2.shape == k1.shape  # every KV head, as a peer of any split expects
        torch.testing.assert_close(k2, k1, atol=1e-5, rtol=0)
        torch.testing.assert_close(v2, v1, atol=1e-5, rtol=0)
        kv_two.write_blocks(layer, [7, 8, 9], k1, v1)  # as a decode worker lands a transfer
        k3, v3 = kv_two.read_blocks(layer, [7, 8, 9])
        assert torch.equal(k3, k1) and torch.equal(v3, v1)


def test_a_model_whose_kv_heads_two_ranks_cannot_split_is_refused_naming_the_field(group, tmp_path):
    hf_model(MIXTRAL).save_pretrained(tmp_path)  # 3 KV heads
    with pytest.raises(
        ModelLoadError, match=r"resources.gpus: 2 does not divide the model's num_key_value_heads \(3\)"
    ):
        load_tensor_parallel(tmp_path, "float32", "none", group)
