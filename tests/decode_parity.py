"""Two engines run the same requests step by step: the static decode step's against the general path's."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tandem.worker.api.params import SamplingParams
from tandem.worker.engine.models.llama import Transformer
from tandem.worker.engine.runner.decode_graphs import DecodeStepRunner
from tandem.worker.engine.runner.engine import Engine, EngineConfig

GREEDY = dict(temperature=0.0, ignore_eos=True)


def static_engine(model: Transformer, compile: bool, **overrides) -> Engine:
    """An engine with the static decode step; `compile=False` runs the same padded step without
    torch.compile."""
    engine = Engine(model, EngineConfig(**{"decode_step": "compiled", **overrides}))
    if not compile:  # torch.compile is lazy: nothing was compiled yet
        runner = engine.decode_step
        assert runner is not None
        engine.decode_step = DecodeStepRunner(
            model,
            engine.kv.k,
            engine.kv.v,
            runner.block_size,
            engine.config.max_running_sequences,
            engine.max_model_len,
            runner.scratch_block,
            engine.staging,
            compile=False,
            attention=runner.attention,
        )
    return engine


def requests(
    n: int, seed: int = 0, vocab: int = 1000, longest: int = 30
) -> list[tuple[list[int], SamplingParams]]:
    """`n` greedy requests of different prompt lengths and output lengths (they finish at different steps)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        size = 2 + (i * 7) % longest
        prompt = torch.randint(2, vocab, (size,), generator=g).tolist()
        out.append((prompt, SamplingParams(max_tokens=3 + (i * 5) % 17, **GREEDY)))
    return out


@dataclass
class Lockstep:
    tokens: tuple[dict[str, list[int]], dict[str, list[int]]] = field(default_factory=lambda: ({}, {}))
    max_logit_diff: float = 0.0
    static_steps: int = 0  # steps the static engine ran through its decode step
    general_steps: int = 0  # its steps on the general path
    shapes: set[tuple[int, int]] = field(default_factory=set)  # the buckets its decode steps ran in


def run_lockstep(
    general: Engine, static: Engine, reqs: list[tuple[list[int], SamplingParams]], late: int = 0
) -> Lockstep:
    """Run both engines to completion; the last `late` requests join one by one while the others decode."""
    result = Lockstep()
    logits: list[list[torch.Tensor | None]] = [[], []]
    runner = static.decode_step
    assert runner is not None
    for i, engine in enumerate((general, static)):
        execute = engine._execute

        def record(sched, execute=execute, i=i):
            out = execute(sched)
            logits[i].append(None if out is None else out.clone())
            return out

        engine._execute = record  # type: ignore[method-assign]
    execute_padded = runner.execute

    def padded(inputs):
        result.shapes.add(inputs.shape)
        return execute_padded(inputs)

    runner.execute = padded  # type: ignore[method-assign]
    first, rest = reqs[: len(reqs) - late], reqs[len(reqs) - late :]
    for i, engine in enumerate((general, static)):
        for j, (prompt, params) in enumerate(first):
            result.tokens[i][engine.add_request(prompt, params, request_id=f"r{j}")] = []
    step = 0
    while general.has_work() or static.has_work() or step <= 3 * len(rest):
        if step % 3 == 1 and rest:
            prompt, params = rest.pop(0)
            for i, engine in enumerate((general, static)):
                rid = f"r{len(result.tokens[i])}"
                result.tokens[i][engine.add_request(prompt, params, request_id=rid)] = []
        before = runner.steps
        for i, engine in enumerate((general, static)):
            for o in engine.step():
                result.tokens[i][o.request_id].append(o.token_id)
        if runner.steps > before:
            result.static_steps += 1
        elif static.last_schedule:
            result.general_steps += 1
        step += 1
    for a, b in zip(*logits, strict=True):
        assert (a is None) == (b is None)
        if a is not None and b is not None:
            result.max_logit_diff = max(result.max_logit_diff, float((a - b).abs().max()))
    return result
