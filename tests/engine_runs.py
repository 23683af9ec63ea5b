"""Engine runs the speculative-decoding tests share: seeded prompts, a run to completion with late joiners."""

from __future__ import annotations

import torch

from tandem.worker.api.params import SamplingParams
from tandem.worker.engine.runner.engine import Engine


def seeded_prompt(n: int, seed: int, vocab: int = 1000) -> list[int]:
    return torch.randint(1, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def run_to_completion(
    engine: Engine, requests: list[tuple[list[int], SamplingParams]], late: dict[int, list] | None = None
) -> dict[str, tuple[list[int], str]]:
    """Run to completion (requests in `late[step]` join at that step); returns request id -> (tokens,
    reason)."""
    out: dict[str, list[int]] = {}
    reasons: dict[str, str] = {}
    for prompt, params in requests:
        out[engine.add_request(prompt, params, request_id=f"r{len(out)}")] = []
    step = 0
    while engine.has_work() or (late and any(s >= step for s in late)):
        for prompt, params in (late or {}).get(step, []):
            out[engine.add_request(prompt, params, request_id=f"r{len(out)}")] = []
        for o in engine.step():
            assert o.request_id not in reasons, "a token after the finishing one"
            out[o.request_id].append(o.token_id)
            if o.finish_reason:
                reasons[o.request_id] = o.finish_reason
        step += 1
    assert engine.blocks.num_used == 0, "KV blocks leaked"
    return {rid: (toks, reasons[rid]) for rid, toks in out.items()}
