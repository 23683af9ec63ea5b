"""The pure parts of speculative decoding: n-gram lookup, greedy acceptance, draft budgets and the back-off."""

from __future__ import annotations

import pytest

from tandem.worker.api.params import SamplingParams
from tandem.worker.engine.sequence import Sequence
from tandem.worker.engine.speculative.backoff import (
    AcceptanceState,
    BackoffPolicy,
    after_paused_step,
    after_verify,
)
from tandem.worker.engine.speculative.ngram import ngram_draft
from tandem.worker.engine.speculative.proposer import SpeculativeConfig
from tandem.worker.engine.speculative.speculator import (
    Speculator,
    accepted_prefix,
    can_speculate,
    draft_budget,
)


@pytest.mark.parametrize("tokens, k, expected", [
    ([1, 2, 3, 9, 1, 2], 3, [3, 9, 1]),  # the trigram is not there; the bigram [1, 2] was followed by 3 9 1
    ([5, 1, 2, 7, 1, 2, 8, 1, 2], 2, [8, 1]),  # the latest occurrence wins
    ([4, 1, 2, 3, 6, 1, 2, 3], 2, [6, 1]),  # the longest n-gram wins over a later shorter one
    ([7, 7, 7], 4, [7, 7, 7, 7]),  # the copy runs on into the suffix and its own drafts
    ([1, 2, 1, 2], 5, [1, 2, 1, 2, 1]),
    ([1, 2, 3, 4], 3, []),  # nothing repeats
    ([1], 3, []),
    ([1, 2, 1], 0, []),
])  # fmt: skip
def test_ngram_draft(tokens, k, expected):
    assert ngram_draft(tokens, k, min_n=1, max_n=3) == expected


def test_ngram_min_size_refuses_single_token_matches():
    assert ngram_draft([3, 1, 4, 3], 2, min_n=2, max_n=3) == []
    assert ngram_draft([3, 1, 4, 3], 2, min_n=1, max_n=3) == [1, 4]


@pytest.mark.parametrize("draft, target, n", [
    ([1, 2, 3], [1, 2, 3, 4], 3), ([1, 2, 3], [1, 5, 3, 4], 1), ([1, 2], [9, 2, 3], 0), ([], [4], 0),
])  # fmt: skip
def test_accepted_prefix(draft, target, n):
    assert accepted_prefix(draft, target) == n


def _seq(prompt_len: int, outputs: int, computed: int | None = None, **params) -> Sequence:
    p = SamplingParams(**{"max_tokens": 10, "temperature": 0.0, **params})
    seq = Sequence("r", list(range(prompt_len)), p)
    for t in range(outputs):
        seq.append_output(t, 0.0)
    seq.num_computed = prompt_len + outputs - 1 if computed is None else computed
    return seq


def test_only_greedy_decoding_sequences_speculate():
    assert can_speculate(_seq(5, 1))
    assert not can_speculate(_seq(5, 1, temperature=0.7))  # no rejection sampler: drafts would bias sampling
    assert not can_speculate(_seq(5, 0, computed=2))  # still prefilling


def test_drafts_never_run_past_max_tokens_or_the_context():
    assert draft_budget(_seq(5, 1), 4, max_model_len=100) == 4
    assert draft_budget(_seq(5, 8), 4, max_model_len=100) == 1  # 2 tokens left: 1 draft + the model's own
    assert draft_budget(_seq(5, 9), 4, max_model_len=100) == 0
    assert draft_budget(_seq(5, 1), 4, max_model_len=9) == 2  # 6 tokens, 3 more fit


def test_backoff_pauses_after_rejections_and_doubles_the_pause():
    policy = BackoffPolicy(min_acceptance=0.3, smoothing=0.5, first_pause_steps=2, max_pause_steps=8)
    s = after_verify(policy, AcceptanceState(), 4, 4)
    assert not s.paused and s.rate == 1.0
    s = after_verify(policy, s, 4, 0)  # 0.5: still above
    assert not s.paused
    s = after_verify(policy, s, 4, 0)  # 0.25: pause
    assert (s.pause_left, s.next_pause) == (2, 4)
    s = after_paused_step(after_paused_step(s))
    assert not s.paused
    s = after_verify(policy, s, 4, 0)  # the probe fails: a longer pause
    assert (s.pause_left, s.next_pause) == (4, 8)
    s = after_verify(policy, AcceptanceState(policy.min_acceptance, 0, 8), 4, 4)  # a good probe resets
    assert (s.paused, s.next_pause) == (False, 0)
    assert after_verify(policy, AcceptanceState(0.31, 0, 8), 4, 0).next_pause == 8  # capped


def test_speculator_skips_paused_sequences_and_counts():
    class Always:
        def propose(self, seqs, num_tokens):
            return [[1] * k for k in num_tokens]

    spec = Speculator(SpeculativeConfig(num_tokens=3), Always(), BackoffPolicy(first_pause_steps=2))
    seq = _seq(5, 1)
    assert spec.drafts([seq], 100) == {seq: [1, 1, 1]}
    spec.record(seq, 3, 0)
    spec.record(seq, 3, 0)
    assert (spec.proposed_tokens, spec.accepted_tokens, spec.verifies) == (6, 0, 2)
    assert spec.drafts([seq], 100) == {} and spec.drafts([seq], 100) == {}  # paused two steps
    assert spec.drafts([seq], 100) == {seq: [1, 1, 1]}
    assert spec.drafts([], 100) == {} and spec.states == {}  # finished sequences are forgotten


def test_config_is_checked():
    with pytest.raises(ValueError, match="method"):
        SpeculativeConfig(method="magic")
    with pytest.raises(ValueError, match="num_tokens"):
        SpeculativeConfig(num_tokens=0)
