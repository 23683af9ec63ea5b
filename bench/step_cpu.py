"""The host's share of a decode step: CPU time the engine's thread spends scheduling, launching and updating.

A decode step is schedule (host), execute (host launches the device's work) and update (one read of the
sampled ids, then host bookkeeping). Here the device is drained before the step and again between execute and
update, so neither wait counts, and each phase is timed with this thread's CPU clock (`time.thread_time`:
other processes on the host and the device's own time do not count). On a GPU, `launch` is what it costs the
host to enqueue the forward (kernel launches, or one graph replay); on the CPU it includes the forward's
compute.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass

import torch

from tandem.worker.api.params import SamplingParams
from tandem.worker.engine.models.protocol import CausalLM
from tandem.worker.engine.runner.engine import Engine, EngineConfig

HOST_STEP_BATCHES = (1, 256)


@dataclass(frozen=True)
class HostStep:
    """Median CPU seconds of one decode step's host phases."""

    schedule_update_s: float  # schedule + update (sampling's host side, the one read, bookkeeping)
    launch_s: float  # execute: building inputs and enqueuing the forward


def _drain(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def host_step(engine: Engine, batch: int, context: int, steps: int, seed: int = 0) -> HostStep:
    """Admit `batch` greedy prompts of `context` tokens, prefill them all, then time `steps` decode steps."""
    gen = torch.Generator().manual_seed(seed)
    vocab = engine.model.config.vocab_size
    params = SamplingParams(max_tokens=steps + 2, temperature=0.0, ignore_eos=True)
    for prompt in torch.randint(0, vocab, (batch, context), generator=gen).tolist():
        engine.add_request(prompt, params)
    while engine.num_waiting or any(s.in_prefill for s in engine.scheduler.running):
        engine.step()
    schedule_update, launch = [], []
    for _ in range(steps):
        _drain(engine.device)
        start = time.thread_time()
        sched = engine.scheduler.schedule(None)
        scheduled = time.thread_time()
        logits = engine._execute(sched)
        launched = time.thread_time()
        _drain(engine.device)  # the forward's device time is not the host's
        ready = time.thread_time()
        engine._update(sched, logits)
        schedule_update.append(scheduled - start + time.thread_time() - ready)
        launch.append(launched - scheduled)
    while engine.has_work():
        engine.step()
    return HostStep(statistics.median(schedule_update), statistics.median(launch))


def host_step_config(config: EngineConfig, context: int, steps: int) -> EngineConfig:
    """`config` with room for the largest batch at `context` tokens plus `steps` new ones, decoding
    eagerly."""
    batch, block = max(HOST_STEP_BATCHES), config.block_size
    return dataclasses.replace(
        config,
        decode_step="eager",
        max_running_sequences=batch,
        num_kv_blocks=batch * -(-(context + steps + 2) // block) + 8,
        max_batch_tokens=max(config.max_batch_tokens, context, batch),
        max_model_len=context + steps + 4,
    )


def host_step_table(model: CausalLM, config: EngineConfig, context: int, steps: int) -> dict[int, HostStep]:
    """The host's share of a decode step at batch 1 and 256, one eager engine for both."""
    engine = Engine(model, host_step_config(config, context, steps), eos_token_ids=())
    return {batch: host_step(engine, batch, context, steps, seed=batch) for batch in HOST_STEP_BATCHES}
