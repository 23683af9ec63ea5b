"""What a worker's GPUs may split (the rule behind resources.gpus) and each rank's slice of a checkpoint."""

from __future__ import annotations

import dataclasses

import pydantic
import pytest
import torch

from tandem.spec import InferenceServiceSpec
from tandem.worker.engine.tp.split import local_config, shard_tensor, split_problem, tensor_parallel_problem
from tandem.worker.hf.config import ModelConfig

CONFIG = ModelConfig(
    vocab_size=509,
    hidden_size=96,
    intermediate_size=64,
    num_layers=2,
    num_heads=6,
    num_kv_heads=2,
    head_dim=16,
    max_position_embeddings=256,
)


@pytest.mark.parametrize("gpus", [3, 6])
def test_a_spec_refuses_gpus_that_are_not_a_power_of_two_naming_the_field(gpus):
    with pytest.raises(pydantic.ValidationError) as e:
        InferenceServiceSpec.model_validate(
            {"model": {"source": {"path": "/m"}, "servedName": "m"}, "decode": {"resources": {"gpus": gpus}}}
        )
    assert "resources.gpus" in str(e.value) and "power of two" in str(e.value) and "decode" in str(e.value)


def test_a_spec_takes_powers_of_two_and_cpu_workers():
    for gpus in (0, 1, 2, 8, 64):
        spec = InferenceServiceSpec.model_validate(
            {"model": {"source": {"path": "/m"}, "servedName": "m"}, "prefill": {"resources": {"gpus": gpus}}}
        )
        assert spec.prefill.resources.gpus == gpus


def test_ranks_must_divide_heads_kv_heads_and_widths_and_the_message_names_them():
    assert split_problem(CONFIG, 1) is None and split_problem(CONFIG, 2) is None
    assert "num_attention_heads (6)" in split_problem(CONFIG, 4) and "resources.gpus" in split_problem(
        CONFIG, 4
    )
    assert "power of two" in split_problem(CONFIG, 3)
    odd_kv = dataclasses.replace(CONFIG, num_kv_heads=3, num_heads=6)
    assert "num_key_value_heads (3)" in split_problem(odd_kv, 2)
    moe = dataclasses.replace(CONFIG, num_experts=4, moe_intermediate_size=30, num_heads=4, num_kv_heads=4)
    assert "moe_intermediate_size (30)" in split_problem(moe, 4)


def test_a_worker_refuses_more_ranks_than_gpus_and_compiled_steps():
    assert "shows 1" in tensor_parallel_problem(CONFIG, 2, "cuda", "eager", False, cuda_devices=1)
    assert "decodeStep eager" in tensor_parallel_problem(CONFIG, 2, "cpu", "cudaGraphs", False, None)
    assert tensor_parallel_problem(CONFIG, 2, "cpu", "eager", False, None) is None


def test_each_rank_gets_its_heads_widths_and_padded_vocabulary():
    mine = local_config(CONFIG, 2)
    assert (mine.num_heads, mine.num_kv_heads, mine.head_dim, mine.intermediate_size, mine.vocab_size) == (
        3,
        1,
        16,
        32,
        255,
    )
    embed = torch.arange(509 * 2, dtype=torch.float32).view(509, 2)
    last = shard_tensor("model.embed_tokens.weight", embed, 1, 2)
    assert last.shape == (255, 2) and torch.equal(last[:254], embed[255:]) and not last[254].any()
    q = torch.arange(6 * 16 * 4, dtype=torch.float32).view(96, 4)
    assert torch.equal(shard_tensor("model.layers.0.self_attn.q_proj.weight", q, 1, 2), q[48:])
    o = q.T.contiguous()
    assert torch.equal(shard_tensor("model.layers.0.self_attn.o_proj.weight", o, 0, 2), o[:, :48])
    down = torch.randn(96, 64)
    assert torch.equal(
        shard_tensor("model.layers.1.block_sparse_moe.experts.3.w2.weight", down, 1, 2), down[:, 32:]
    )
    router = torch.randn(4, 96)
    assert shard_tensor("model.layers.1.mlp.gate.weight", router, 1, 2) is router  # replicated


def test_a_pool_s_gpus_above_one_become_its_workers_ranks():
    from tandem.options import WorkerOptions

    spec = InferenceServiceSpec.model_validate(
        {
            "model": {"source": {"path": "/m"}, "servedName": "m"},
            "prefill": {"resources": {"gpus": 1}},
            "decode": {"resources": {"gpus": 4}},
        }
    )
    decode = WorkerOptions.from_spec(spec, "decode", model_dir="/m")
    assert decode.tensor_parallel == 4 and WorkerOptions.from_argv(decode.to_argv()).tensor_parallel == 4
    assert WorkerOptions.from_spec(spec, "prefill", model_dir="/m").tensor_parallel is None
