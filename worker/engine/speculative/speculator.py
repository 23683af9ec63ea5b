"""The engine's side of speculation: which decoding sequences get drafts this step, and what was accepted.

A sequence speculates when it is decoding (its prompt is in the cache, one token left to compute) and its
back-off state lets it propose this step; greedy sequences verify by comparison, sampled ones by rejection
sampling (rejection.py). Drafts never run past `max_tokens` or the model's context, so a step
never computes a token the sequence could not emit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tandem.worker.engine.core.sequence import Sequence
from tandem.worker.engine.speculative.backoff import AcceptanceState, BackoffPolicy, after_verify, may_propose
from tandem.worker.engine.speculative.proposer import Proposer, SpeculativeConfig


def can_speculate(seq: Sequence) -> bool:
    """Decoding, and nothing (a grammar, min_tokens, top_logprobs) needs each of its tokens sampled on its
    own."""
    constrained = seq.constraint is not None and seq.constraint.active
    return not seq.in_prefill and seq.num_uncomputed == 1 and not constrained and not seq.params.top_logprobs


def draft_budget(seq: Sequence, num_tokens: int, max_model_len: int) -> int:
    """Drafts worth verifying: each accepted one is emitted, and a verify emits one token more than it
    accepts."""
    left_in_request = seq.params.max_tokens - len(seq.output_ids) - 1
    left_in_context = max_model_len - seq.num_tokens - 1
    return max(0, min(num_tokens, left_in_request, left_in_context))


def probe_tokens(num_tokens: int, method: str = "ngram") -> int:
    """Drafts in a probe (an untrusted sequence's try): half of them, so a failed probe costs less; one for
    the draft model, each of whose drafts costs a pass through its layers."""
    return 1 if method == "draft" else -(-num_tokens // 2)


def accepted_prefix(draft: list[int], target: list[int]) -> int:
    """How many leading drafts equal the target's own tokens at the same positions (greedy verification)."""
    n = 0
    for d, t in zip(draft, target, strict=False):
        if d != t:
            break
        n += 1
    return n


@dataclass
class Speculator:
    config: SpeculativeConfig
    proposer: Proposer
    policy: BackoffPolicy = field(default_factory=BackoffPolicy)
    states: dict[str, AcceptanceState] = field(default_factory=dict)
    # totals since start, read by the worker's metrics
    proposed_tokens: int = 0
    accepted_tokens: int = 0
    verifies: int = 0
    step: int = 0  # the back-off's clock: one tick per engine step

    def drafts(self, running: list[Sequence], max_model_len: int) -> dict[Sequence, list[int]]:
        """Draft tokens for the running sequences that speculate this step (none for the others)."""
        self.step += 1
        if len(self.states) > len(running):
            live = {s.request_id for s in running}
            self.states = {rid: st for rid, st in self.states.items() if rid in live}
        chosen, budgets = [], []
        for seq in running:
            if not can_speculate(seq):
                continue
            state = self.states.get(seq.request_id, AcceptanceState())
            if not may_propose(self.policy, state, self.step):
                continue
            wanted = (
                self.config.num_tokens
                if state.trusted
                else probe_tokens(self.config.num_tokens, self.config.method)
            )
            k = draft_budget(seq, wanted, max_model_len)
            if k > 0:
                chosen.append(seq)
                budgets.append(k)
        if not chosen:
            return {}
        proposals = self.proposer.propose(chosen, budgets)
        return {s: d[:k] for s, d, k in zip(chosen, proposals, budgets, strict=True) if d}

    def record(self, seq: Sequence, proposed: int, accepted: int) -> None:
        self.proposed_tokens += proposed
        self.accepted_tokens += accepted
        self.verifies += 1
        state = self.states.get(seq.request_id, AcceptanceState())
        self.states[seq.request_id] = after_verify(self.policy, state, proposed, accepted)
