"""The bench's host-CPU-per-step row runs on the CPU: both batches decode to the end and free their KV."""

from bench.step_cpu import HOST_STEP_BATCHES, host_step_config, host_step_table
from tandem.worker.engine.loading import load_model
from tandem.worker.engine.runner.engine import EngineConfig


def test_host_step_table_times_batch_1_and_256(tiny_model_dir):
    table = host_step_table(load_model(tiny_model_dir), EngineConfig(block_size=4), context=3, steps=2)
    assert set(table) == set(HOST_STEP_BATCHES) == {1, 256}
    assert all(step.schedule_update_s > 0 and step.launch_s > 0 for step in table.values())


def test_the_config_holds_the_largest_batch():
    config = host_step_config(EngineConfig(block_size=16, max_batch_tokens=64), context=512, steps=8)
    assert config.max_running_sequences == 256 and config.max_batch_tokens >= 512
    assert config.num_kv_blocks >= 256 * 33 and config.decode_step == "eager"
