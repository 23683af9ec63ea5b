"""Times one batch through our engine: seconds until every first token, then the decode phase.

`clock` is wall time by default; `use_cpu_clock()` switches every bench timer to this process's CPU
time, which a host shared with other jobs disturbs far less (single-threaded runs only).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from tandem.worker.api.params import SamplingParams
from tandem.worker.engine.runner.engine import Engine

clock = time.perf_counter


def use_cpu_clock() -> None:
    global clock
    clock = time.process_time


def now() -> float:
    return clock()


@dataclass(frozen=True)
class RunTiming:
    """One timed batch: seconds until every first token, then seconds and tokens of the decode phase."""

    prefill_s: float
    decode_s: float
    decode_tokens: int

    @property
    def decode_tok_s(self) -> float:
        return self.decode_tokens / self.decode_s


def random_prompts(batch: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    """Distinct random prompts (use a fresh seed per run, so nothing is served from the prefix cache)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, length), generator=gen).tolist()


def time_engine(engine: Engine, prompts: list[list[int]], new_tokens: int) -> RunTiming:
    """Run `prompts` to `new_tokens` greedy tokens each (never stopping early) and time both phases.

    Decode counts only tokens produced after the last sequence got its first token, so a prefill that
    overlaps other sequences' decoding is not credited to decode.
    """
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    start = now()
    for prompt in prompts:
        engine.add_request(prompt, params)
    stamps: list[tuple[str, float]] = []
    while engine.has_work():
        outs = engine.step()  # returns after the token ids reached the host: the device is synchronised
        stamp = now()
        stamps += [(o.request_id, stamp) for o in outs]
    first: dict[str, float] = {}
    for rid, t in stamps:
        first.setdefault(rid, t)
    if len(stamps) != len(prompts) * new_tokens or len(first) != len(prompts):
        raise RuntimeError(f"engine produced {len(stamps)} tokens, expected {len(prompts) * new_tokens}")
    prefilled = max(first.values())
    return RunTiming(prefilled - start, stamps[-1][1] - prefilled, sum(t > prefilled for _, t in stamps))
