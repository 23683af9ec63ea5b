"""Speculative decoding's pure parts: n-gram lookup, greedy acceptance, draft budgets and the back-off."""

from __future__ import annotations

import random

import pytest

from tandem.worker.api.params import SamplingParams
from tandem.worker.engine.core.block_manager import BlockManager
from tandem.worker.engine.core.scheduler import Scheduler, SchedulerConfig
from tandem.worker.engine.core.sequence import Sequence
from tandem.worker.engine.speculative.backoff import AcceptanceState, BackoffPolicy, after_verify, may_propose
from tandem.worker.engine.speculative.ngram import NgramIndex, ngram_draft
from tandem.worker.engine.speculative.proposer import SpeculativeConfig
from tandem.worker.engine.speculative.speculator import (
    Speculator,
    accepted_prefix,
    can_speculate,
    draft_budget,
)


@pytest.mark.parametrize(
    "tokens, k, expected",
    [
        (
            [1, 2, 3, 9, 1, 2],
            3,
            [3, 9, 1],
        ),  # the trigram is not there; the bigram [1, 2] was followed by 3 9 1
        ([5, 1, 2, 7, 1, 2, 8, 1, 2], 2, [8, 1]),  # the latest occurrence wins
        ([4, 1, 2, 3, 6, 1, 2, 3], 2, [6, 1]),  # the longest n-gram wins over a later shorter one
        ([7, 7, 7], 4, [7, 7, 7, 7]),  # the copy runs on into the suffix and its own drafts
        ([1, 2, 1, 2], 5, [1, 2, 1, 2, 1]),
        ([1, 2, 3, 4], 3, []),  # nothing repeats
        ([1], 3, []),
        ([1, 2, 1], 0, []),
    ],
)
def test_ngram_draft(tokens, k, expected):
    assert ngram_draft(tokens, k, min_n=1, max_n=3) == expected


def test_ngram_min_size_refuses_single_token_matches():
    assert ngram_draft([3, 1, 4, 3], 2, min_n=2, max_n=3) == []
    assert ngram_draft([3, 1, 4, 3], 2, min_n=1, max_n=3) == [1, 4]


@pytest.mark.parametrize(
    "draft, target, n",
    [
        ([1, 2, 3], [1, 2, 3, 4], 3),
        ([1, 2, 3], [1, 5, 3, 4], 1),
        ([1, 2], [9, 2, 3], 0),
        ([], [4], 0),
    ],
)
def test_accepted_prefix(draft, target, n):
    assert accepted_prefix(draft, target) == n


def _seq(prompt_len: int, outputs: int, computed: int | None = None, **params) -> Sequence:
    p = SamplingParams(**{"max_tokens": 10, "temperature": 0.0, **params})
    seq = Sequence("r", list(range(prompt_len)), p)
    for t in range(outputs):
        seq.append_output(t, 0.0)
    seq.num_computed = prompt_len + outputs - 1 if computed is None else computed
    return seq


def test_only_decoding_sequences_speculate():
    assert can_speculate(_seq(5, 1)) and can_speculate(_seq(5, 1, temperature=0.7))
    assert not can_speculate(_seq(5, 0, computed=2))  # still prefilling
    assert not can_speculate(_seq(5, 2, computed=5))  # two tokens to compute (after a preemption)


def test_drafts_never_run_past_max_tokens_or_the_context():
    assert draft_budget(_seq(5, 1), 4, max_model_len=100) == 4
    assert draft_budget(_seq(5, 8), 4, max_model_len=100) == 1  # 2 tokens left: 1 draft + the model's own
    assert draft_budget(_seq(5, 9), 4, max_model_len=100) == 0
    assert draft_budget(_seq(5, 1), 4, max_model_len=9) == 2  # 6 tokens, 3 more fit


def test_backoff_trusts_good_probes_and_doubles_the_pause_after_bad_ones():
    policy = BackoffPolicy(min_acceptance=0.3, smoothing=0.5, first_pause_steps=2, max_pause_steps=8)
    new = AcceptanceState()
    assert [may_propose(policy, new, s) for s in range(1, 5)] == [False, True, False, True]  # probes only
    s = after_verify(policy, new, 4, 4)
    assert s.trusted and all(may_propose(policy, s, step) for step in range(1, 6))
    s = after_verify(policy, s, 4, 0)  # 0.5: still trusted
    assert s.trusted
    s = after_verify(policy, s, 4, 0)  # 0.25: back to probing every 2 steps
    assert (s.trusted, s.pause) == (False, 2)
    s = after_verify(policy, s, 4, 1)  # a failed probe (0.25 alone) doubles the pause
    assert (s.trusted, s.pause) == (False, 4)
    assert [may_propose(policy, s, step) for step in range(5, 10)] == [False, False, False, True, False]
    s = after_verify(policy, after_verify(policy, s, 4, 0), 4, 0)
    assert s.pause == 8  # capped
    assert after_verify(policy, s, 4, 2).trusted  # a good probe restores trust


def test_probes_of_different_sequences_fall_on_the_same_steps():
    policy = BackoffPolicy(first_pause_steps=4)
    states = [after_verify(policy, AcceptanceState(), 4, 0), AcceptanceState(), AcceptanceState(pause=16)]
    steps = [{s for s in range(1, 33) if may_propose(policy, st, s)} for st in states]
    assert steps[2] <= steps[0] <= steps[1] and steps[0] == {8, 16, 24, 32}


def test_speculator_skips_paused_sequences_and_counts():
    class Always:
        def propose(self, seqs, num_tokens):
            return [[1] * k for k in num_tokens]

    spec = Speculator(SpeculativeConfig(num_tokens=4), Always(), BackoffPolicy(first_pause_steps=2))
    seq = _seq(5, 1)
    assert spec.drafts([seq], 100) == {}  # step 1: a new sequence waits for a probe step
    assert spec.drafts([seq], 100) == {seq: [1, 1]}  # step 2: a probe drafts half as many
    spec.record(seq, 2, 0)
    assert (spec.proposed_tokens, spec.accepted_tokens, spec.verifies) == (2, 0, 1)
    assert [bool(spec.drafts([seq], 100)) for _ in range(4)] == [
        False,
        True,
        False,
        False,
    ]  # steps 3-6: every 4th
    spec.record(seq, 2, 2)
    assert [spec.drafts([seq], 100) for _ in range(2)] == [
        {seq: [1, 1, 1, 1]}
    ] * 2  # trusted: every step, all 4
    assert spec.drafts([], 100) == {} and spec.states == {}  # finished sequences are forgotten


def test_a_draft_model_probes_with_one_draft():
    """Its every draft costs a pass through its layers, where an n-gram draft costs a lookup."""

    class Always:
        def propose(self, seqs, num_tokens):
            return [[1] * k for k in num_tokens]

    spec = Speculator(
        SpeculativeConfig("draft", 4, draft_layers=1), Always(), BackoffPolicy(first_pause_steps=1)
    )
    seq = _seq(5, 1)
    assert spec.drafts([seq], 100) == {seq: [1]}
    spec.record(seq, 1, 1)
    assert spec.drafts([seq], 100) == {seq: [1, 1, 1, 1]}  # trusted: all 4


def test_config_is_checked():
    with pytest.raises(ValueError, match="method"):
        SpeculativeConfig(method="magic")
    with pytest.raises(ValueError, match="num_tokens"):
        SpeculativeConfig(num_tokens=0)


@pytest.mark.parametrize("vocab", [3, 8, 50])
def test_incremental_index_drafts_what_the_scan_drafts(vocab):
    rng = random.Random(vocab)
    for _ in range(20):
        tokens = [rng.randrange(vocab) for _ in range(rng.randrange(1, 6))]
        index = NgramIndex(1, 3)
        for _ in range(40):  # the sequence grows by one or a few tokens between lookups, as verifies emit
            k = rng.randrange(0, 6)
            assert index.draft(tokens, k) == ngram_draft(tokens, k, 1, 3), tokens
            tokens += [rng.randrange(vocab) for _ in range(rng.randrange(1, 4))]


def test_drafts_shrink_to_the_free_blocks_instead_of_preempting():
    blocks = BlockManager(num_blocks=5, block_size=4)
    sched = Scheduler(SchedulerConfig(), blocks)
    a, b = _seq(6, 2), _seq(6, 2)  # 8 tokens each, 7 in the cache: 2 blocks each
    for seq in (a, b):
        seq.block_table = blocks.allocate(2)
        sched.add_running(seq)
    out = sched.schedule({a: [1, 2, 3, 4], b: [5, 6, 7, 8]})
    assert not out.preempted and out.drafts == [[1, 2, 3, 4], []]  # a takes the one free block, b has none
    assert out.num_new_tokens == [5, 1] and blocks.num_free == 0
