"""KV cache sizing: the arithmetic after the weights and a warm-up batch, and the warm-up itself (CPU)."""

from __future__ import annotations

import pytest

from tandem.worker.engine.layers.kv_cache import kv_block_nbytes
from tandem.worker.engine.loading import load_model
from tandem.worker.engine.memory import (
    CPU_KV_BUDGET_BYTES,
    GIB,
    KvCachePlan,
    KvCacheTooSmall,
    MemoryReading,
    blocks_for_budget,
    decode_gather_bytes,
    kv_budget_bytes,
    min_blocks,
    plan_kv_cache,
    warm_up,
)
from tandem.worker.engine.runner.engine import EngineConfig


@pytest.fixture(scope="module")
def tiny_model(tiny_model_dir):
    return load_model(tiny_model_dir)


def test_budget_is_a_share_of_what_the_weights_leave_less_the_activations():
    reading = MemoryReading(free_bytes=60 * GIB, peak_bytes=18 * GIB, allocated_bytes=16 * GIB)
    assert reading.activation_bytes == 2 * GIB
    assert kv_budget_bytes(reading, 90) == 54 * GIB - 2 * GIB


@pytest.mark.parametrize(
    "device_free_before_load, weights, activations, percent",
    [
        (79 * GIB, 16 * GIB, 2 * GIB, 90),  # an 8B model in bf16 on an 80 GB GPU
        (139 * GIB, 140 * GIB // 2, 6 * GIB, 95),  # a 35B model on a 141 GB GPU
        (23 * GIB, 15 * GIB, 1 * GIB, 100),  # a 7B model on a 24 GB GPU, every byte asked for
    ],
)
def test_weights_kv_and_activations_fit_where_sizing_before_the_load_did_not(
    device_free_before_load, weights, activations, percent
):
    after_load = MemoryReading(
        free_bytes=device_free_before_load - weights,
        peak_bytes=weights + activations,
        allocated_bytes=weights,
    )
    kv = kv_budget_bytes(after_load, percent)
    assert 0 < kv and weights + kv + activations <= device_free_before_load
    sized_before_the_load = device_free_before_load * percent // 100  # what the worker used to take
    assert weights + sized_before_the_load > device_free_before_load  # ... out of memory


def test_decode_attention_room_is_one_layer_of_the_gathered_contexts():
    block, size, layers = 32 * 16 * 4096, 16, 32  # 4 KiB per token per layer, 32 layers
    # 64 sequences at an 8192 context fit a 100 GiB cache: one layer's share of all their tokens
    assert decode_gather_bytes(100 * GIB, block, size, layers, 64 * 8192) == 64 * 8192 * 4096
    # a cache of 1 GiB holds fewer tokens than that: no more can be gathered than the cache holds
    assert decode_gather_bytes(GIB, block, size, layers, 64 * 8192) == GIB // layers
    assert decode_gather_bytes(-GIB, block, size, layers, 64 * 8192) == 0
    for in_place in ("flex", "triton"):  # they read the pages where they are: no room for a gathered copy
        assert decode_gather_bytes(100 * GIB, block, size, layers, 64 * 8192, attention=in_place) == 0


def test_blocks_for_budget_needs_one_full_context():
    assert blocks_for_budget(10 * 4096 + 17, 4096, min_blocks=8) == 10
    assert min_blocks(4097, 16) == 257
    with pytest.raises(KvCacheTooSmall, match=r"3 blocks, fewer than the 8"):
        blocks_for_budget(3 * 4096, 4096, min_blocks=8)
    with pytest.raises(KvCacheTooSmall, match="0 blocks"):
        blocks_for_budget(
            -5 * GIB, 4096, min_blocks=1
        )  # the weights and activations took more than the share


def test_plan_reports_blocks_and_concurrent_sequences_at_the_context():
    plan = KvCachePlan(
        num_blocks=1024, block_size=16, block_bytes=1 << 20, max_model_len=4096, source="numKvBlocks"
    )
    assert plan.total_bytes == GIB and plan.max_concurrent_sequences == 4.0
    assert (
        "1024 blocks of 16 tokens (1.00 GiB" in plan.describe()
        and "4.0 concurrent sequences" in plan.describe()
    )


@pytest.mark.parametrize(
    "max_batch_tokens, chunk, max_running, computed",
    [(100, 32, 64, 100), (100, 32, 2, 64), (48, 512, 64, 48)],
)
def test_warm_up_runs_the_largest_batch_the_scheduler_forms(
    tiny_model, max_batch_tokens, chunk, max_running, computed
):
    config = EngineConfig(
        max_batch_tokens=max_batch_tokens, prefill_chunk_tokens=chunk, max_running_sequences=max_running
    )
    assert warm_up(tiny_model, config) == computed


def test_cpu_plan_explicit_blocks_or_a_share_of_the_cpu_budget(tiny_model):
    config = EngineConfig(block_size=16, max_model_len=1024)
    block = kv_block_nbytes(tiny_model.config, 16, next(tiny_model.parameters()).dtype)
    assert plan_kv_cache(tiny_model, config, num_kv_blocks=300).num_blocks == 300
    plan = plan_kv_cache(tiny_model, config, memory_percent=50)
    assert plan.num_blocks == CPU_KV_BUDGET_BYTES // 2 // block and plan.max_model_len == 1024
    with pytest.raises(KvCacheTooSmall):
        plan_kv_cache(
            tiny_model, EngineConfig(block_size=16), memory_percent=1
        )  # 10 MiB: not one 4096 context


def test_worker_refuses_to_start_when_one_full_context_does_not_fit(tiny_model_dir, capsys):
    from tandem.worker.serve.main import main

    argv = [
        "--role",
        "decode",
        "--model-dir",
        str(tiny_model_dir),
        "--device",
        "cpu",
        "--kv-memory-percent",
        "1",
    ]
    assert (
        main(argv) == 2
    )  # 1% of the CPU budget holds 163 blocks of 16 tokens; a 4096-token context needs 256
    assert "fewer than the 256 one sequence at the model's context needs" in capsys.readouterr().err
