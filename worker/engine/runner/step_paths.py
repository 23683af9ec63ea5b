"""The paths a step can take through the engine (forward kinds, sampling kinds): what a warm-up must run once
before the worker reports ready, so that no request is the first to take one."""

from __future__ import annotations

from collections.abc import Sequence

from tandem.worker.api.params import SamplingParams

PREFILL = "prefill"  # a prompt chunk of more than one token
DECODE = "decode"  # one-token rows on the general path
STATIC_DECODE = "static decode"  # a pure-decode step through the padded, compiled (or captured) step
VERIFY = "verify"  # rows with speculative drafts
GREEDY, SAMPLED, SEEDED = "greedy", "sampled", "seeded"
FILTERED = "top-k/top-p/min-p"
PENALISED, CONSTRAINED = "penalties", "constraint"
LOGPROBS, TOP_LOGPROBS = "logprobs", "top logprobs"


def forward_paths(num_new_tokens: Sequence[int], drafts: Sequence[Sequence[int]]) -> list[str]:
    """The general path's kinds of rows in a step (a prefill worker's layer hook runs the same forward)."""
    paths = []
    if any(n > 1 and not d for n, d in zip(num_new_tokens, drafts, strict=True)):
        paths.append(PREFILL)
    if any(n == 1 and not d for n, d in zip(num_new_tokens, drafts, strict=True)):
        paths.append(DECODE)
    if any(drafts):
        paths.append(VERIFY)
    return paths


def sampling_paths(params: Sequence[SamplingParams], constrained: Sequence[bool]) -> list[str]:
    """The sampler's kinds of work for these rows."""
    checks = (
        (GREEDY, any(p.greedy for p in params)),
        (SAMPLED, any(not p.greedy for p in params)),
        (SEEDED, any(not p.greedy and p.seed is not None for p in params)),
        (FILTERED, any(not p.greedy and (p.top_k > 0 or p.top_p < 1.0 or p.min_p > 0.0) for p in params)),
        (PENALISED, any(p.penalized for p in params)),
        (CONSTRAINED, any(constrained)),
        (LOGPROBS, any(p.logprobs for p in params)),
        (TOP_LOGPROBS, any(p.logprobs and p.top_logprobs for p in params)),
    )
    return [path for path, taken in checks if taken]
