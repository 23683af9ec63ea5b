"""The worker's KV gauges follow the block pool as it changes, not only after the next engine step."""

from __future__ import annotations

from tandem import names
from tandem.worker.api.params import SamplingParams
from tandem.worker.engine.loading import load_model
from tandem.worker.engine.runner.engine import Engine, EngineConfig
from tandem.worker.serve.metrics import WorkerMetrics


def test_kv_blocks_used_drops_when_a_reservation_is_released_without_a_step(tiny_model_dir):
    engine = Engine(load_model(tiny_model_dir), EngineConfig(block_size=4, num_kv_blocks=32))
    metrics = WorkerMetrics("svc", "decode").watch(engine)
    labels = {"service": "svc", "pool": "decode"}

    def gauge(name: str) -> float | None:
        return metrics.registry.get_sample_value(name, labels)

    assert (gauge(names.KV_BLOCKS_USED), gauge(names.KV_BLOCKS_TOTAL)) == (0, 32)
    table, _ = engine.reserve(list(range(1, 15)), SamplingParams(max_tokens=4))
    assert gauge(names.KV_BLOCKS_USED) == len(table) == 4
    engine.release(table)  # as an abort or an expired lease does, between steps
    assert gauge(names.KV_BLOCKS_USED) == 0
    engine.add_request(list(range(1, 6)), SamplingParams(max_tokens=2), "r")
    engine.step()
    assert gauge(names.DECODE_RUNNING_SEQUENCES) == 1 and gauge(names.KV_BLOCKS_USED) == 2
    engine.abort("r")
    assert gauge(names.DECODE_RUNNING_SEQUENCES) == 0 and gauge(names.KV_BLOCKS_USED) == 0


def test_vllm_named_engine_series_follow_the_engine(tiny_model_dir):
    """vLLM's names carry the engine's state with vLLM's meanings: requests waiting and running, the used
    fraction of the KV cache, prefix-cache tokens queried and hit; labelled with the served model only."""
    engine = Engine(load_model(tiny_model_dir), EngineConfig(block_size=4, num_kv_blocks=32))
    metrics = WorkerMetrics("svc", "decode", model_name="tiny").watch(engine)

    def vllm(name: str) -> float | None:
        return metrics.registry.get_sample_value(name, {"model_name": "tiny"})

    assert (vllm(names.VLLM_RUNNING), vllm(names.VLLM_WAITING), vllm(names.VLLM_KV_CACHE_USAGE)) == (0, 0, 0)
    prompt = list(range(1, 10))
    engine.add_request(prompt, SamplingParams(max_tokens=2), "a")
    assert (
        (vllm(names.VLLM_WAITING), vllm(names.VLLM_RUNNING))
        == (1, 0)
        == (engine.num_waiting, engine.num_running)
    )
    engine.step()
    metrics.on_step(engine)
    assert (vllm(names.VLLM_WAITING), vllm(names.VLLM_RUNNING)) == (0, 1)
    assert vllm(names.VLLM_KV_CACHE_USAGE) == engine.blocks.num_used / 32 > 0
    engine.add_request(prompt, SamplingParams(max_tokens=2), "b")  # the same prompt: its full blocks hit
    engine.step()
    metrics.on_step(engine)
    labels = {"service": "svc", "pool": "decode"}
    assert (
        vllm(names.VLLM_PREFIX_CACHE_QUERIES + "_total")
        == metrics.registry.get_sample_value(names.PREFIX_CACHE_QUERIED_TOKENS_TOTAL, labels)
        > 0
    )
    assert (
        vllm(names.VLLM_PREFIX_CACHE_HITS + "_total")
        == metrics.registry.get_sample_value(names.PREFIX_CACHE_HIT_TOKENS_TOTAL, labels)
        > 0
    )


def test_kv_pushes_are_counted_by_transport_and_move_with_the_pool():
    metrics = WorkerMetrics("svc", "prefill")
    metrics.kv_pushed("shm", 4096, span_s=0.02, tail_s=0.001)
    metrics.kv_pushed("shm", 1024, span_s=0.01, tail_s=0.002)
    metrics.kv_pushed("grpc", 512, span_s=0.03, tail_s=0.004)

    def sample(name: str, transport: str, pool: str = "prefill") -> float | None:
        return metrics.registry.get_sample_value(
            name, {"service": "svc", "pool": pool, "transport": transport}
        )

    assert (sample(names.KV_TRANSFER_BYTES_TOTAL, "shm"), sample(names.KV_TRANSFER_BYTES_TOTAL, "grpc")) == (
        5120,
        512,
    )
    assert sample(names.KV_TRANSFER_SECONDS + "_count", "shm") == 2
    assert sample(names.KV_TRANSFER_SECONDS + "_sum", "shm") == 0.03
    assert sample(names.KV_TRANSFER_TAIL_SECONDS + "_sum", "grpc") == 0.004
    metrics.set_pool("decode")  # a flip: the worker counts in one pool only
    assert sample(names.KV_TRANSFER_BYTES_TOTAL, "shm") is None
    metrics.kv_pushed("shm", 64, span_s=0.01, tail_s=0.001)
    assert sample(names.KV_TRANSFER_BYTES_TOTAL, "shm", pool="decode") == 64
