"""Cancellations reach the engine without waiting out a step: gRPC runs every RPC-end callback on the server's
one polling thread, so an abort that waited a step per request freed a burst of N cancelled requests N steps
late. A real engine on the tiny model, its steps slowed so a waiting abort would show."""

from __future__ import annotations

import logging
import time

import pytest

from tandem.worker.api.params import SamplingParams
from tandem.worker.engine.loading import load_model
from tandem.worker.engine.runner.engine import Engine, EngineConfig
from tandem.worker.engine.runner.engine_loop import EngineLoop

STEP_S = 0.1  # each engine step takes at least this long


@pytest.fixture
def slow_loop(tiny_model_dir):
    engine = Engine(load_model(tiny_model_dir), EngineConfig(block_size=16, num_kv_blocks=64))
    step = engine.step

    def slow_step():
        time.sleep(STEP_S)
        return step()

    engine.step = slow_step  # type: ignore[method-assign]
    loop = EngineLoop(engine).start()
    yield loop
    loop.stop()


def test_a_burst_of_aborts_is_freed_within_a_step_or_two_not_one_step_each(slow_loop):
    loop = slow_loop
    params = SamplingParams(max_tokens=500, ignore_eos=True)
    streams = {f"r{i}": loop.submit([1 + i, 2, 3, 4, 5], params, f"r{i}") for i in range(8)}
    EngineLoop.iterate(streams["r0"]).__next__()  # every request is running
    assert loop.engine.blocks.num_used > 0

    asked = time.monotonic()
    for request_id in streams:
        loop.abort_soon(request_id)
    queued_s = time.monotonic() - asked
    assert queued_s < STEP_S / 2, f"queueing 8 aborts took {queued_s:.3f} s: they waited for steps"

    for stream in streams.values():  # every stream ends with the abort, whatever it had produced before it
        assert list(EngineLoop.iterate(stream, timeout_s=5))[-1].finish_reason == "abort"
    freed_s = time.monotonic() - asked
    assert loop.call(lambda e: e.blocks.num_used) == 0
    assert freed_s < 3 * STEP_S, f"8 aborts took {freed_s:.2f} s to free, about one step each"


def test_a_posted_command_that_fails_is_logged_and_the_loop_serves_on(slow_loop, caplog):
    loop = slow_loop

    def broken(engine):
        raise RuntimeError("no such block")

    with caplog.at_level(logging.ERROR):
        loop.post(broken)
        assert loop.call(lambda e: e.has_work()) is False  # runs after the posted command, on the same thread
    assert "no such block" in caplog.text
    assert loop.running
