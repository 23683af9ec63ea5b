"""The sampler: greedy is argmax, seeds reproduce, top-k, top-p and min-p pick inside their set, penalties."""

from __future__ import annotations

import torch

from tandem.worker.api.params import SamplingParams
from tandem.worker.engine.core.sampling import apply_penalties, filter_min_p, filter_top_k_top_p, sample


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_greedy_is_argmax_with_true_logprob():
    logits = torch.tensor([[0.1, 3.0, -1.0], [2.0, 0.0, 1.0]])
    tokens, logprobs = sample(logits, [SamplingParams(temperature=0.0, logprobs=True)] * 2, [None, None])
    assert tokens == [1, 0]
    assert abs(logprobs[0] - float(torch.log_softmax(logits[0], -1)[1])) < 1e-6


def test_logprobs_only_for_rows_that_ask():
    logits = torch.tensor([[0.1, 3.0, -1.0], [2.0, 0.0, 1.0]])
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.0, logprobs=True)]
    _, logprobs = sample(logits, params, [None, None])
    assert logprobs[0] == 0.0
    assert abs(logprobs[1] - float(torch.log_softmax(logits[1], -1)[0])) < 1e-6


def test_sampled_rows_follow_the_distribution():
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1]])).expand(4000, 3).contiguous()
    tokens, _ = sample(logits, [SamplingParams(temperature=1.0)] * 4000, [None] * 4000)
    share = torch.bincount(torch.tensor(tokens), minlength=3).float() / 4000
    assert torch.allclose(share, torch.tensor([0.7, 0.2, 0.1]), atol=0.03)


def test_mixed_batch_filters_each_row_by_its_own_parameters():
    logits = torch.tensor([[5.0, 4.0, 3.0, 0.0], [0.0, 1.0, 2.0, 9.0], [3.0, 2.0, 1.0, 0.0]])
    params = [
        SamplingParams(temperature=1.0, top_k=1),
        SamplingParams(temperature=0.0),
        SamplingParams(top_p=0.7),
    ]
    third = set()
    for seed in range(50):
        tokens, _ = sample(logits, params, [_gen(seed), None, _gen(seed + 100)])
        assert tokens[0] == 0 and tokens[1] == 3
        third.add(tokens[2])
    assert third == {0, 1}  # probabilities 0.64, 0.24, 0.09, 0.03: top_p=0.7 keeps the first two


def test_same_seed_same_tokens_different_seed_differs():
    logits = torch.zeros(1, 1000)
    p = SamplingParams(temperature=1.0)
    a = [sample(logits, [p], [_gen(7)])[0][0] for _ in range(3)]
    assert len(set(a)) == 1
    draws = {sample(logits, [p], [_gen(s)])[0][0] for s in range(20)}
    assert len(draws) > 10


def test_top_k_and_top_p_stay_inside_their_sets():
    logits = torch.tensor([[5.0, 4.0, 3.0, 0.0, -1.0, -2.0]])
    g = _gen(0)
    for _ in range(200):
        (t,), _ = sample(logits, [SamplingParams(temperature=2.0, top_k=2)], [g])
        assert t in (0, 1)
    probs = logits.softmax(-1)[0]
    assert probs[0] < 0.9 < probs[0] + probs[1]  # top_p=0.9 keeps exactly tokens 0 and 1
    for _ in range(200):
        (t,), _ = sample(logits, [SamplingParams(temperature=1.0, top_p=0.9)], [g])
        assert t in (0, 1)


# ---- vLLM's knobs: penalties and min-p, checked against transformers' processors ----


def test_repetition_penalty_matches_transformers_over_prompt_and_output():
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    logits = torch.randn(2, 50, generator=_gen(1))
    prompt, output = [3, 7, 7, 11], [20, 3]
    params = [SamplingParams(repetition_penalty=1.3), SamplingParams(repetition_penalty=0.7)]
    got = apply_penalties(logits, params, [prompt, prompt], [output, output])
    history = torch.tensor([prompt + output])
    for i, p in enumerate(params):
        want = RepetitionPenaltyLogitsProcessor(p.repetition_penalty)(history, logits[i : i + 1].clone())
        assert torch.allclose(got[i], want[0])
    assert not torch.equal(got, logits)


def test_presence_and_frequency_penalties_count_the_output_only():
    logits = torch.zeros(1, 8)
    p = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25)
    got = apply_penalties(logits, [p], [[1, 2]], [[5, 5, 5, 6]])[0]
    assert got.tolist() == [
        0,
        0,
        0,
        0,
        0,
        -(0.5 + 3 * 0.25),
        -(0.5 + 0.25),
        0,
    ]  # prompt tokens 1, 2 untouched


def test_a_penalty_changes_the_greedy_pick_and_rows_without_one_are_left_alone():
    logits = torch.tensor([[2.0, 1.9, 0.0], [2.0, 1.9, 0.0]])
    params = [SamplingParams(temperature=0.0, repetition_penalty=1.2), SamplingParams(temperature=0.0)]
    penalized = apply_penalties(logits, params, [[0], [0]], [[], []])
    assert sample(penalized, params, [None, None])[0] == [1, 0]
    assert torch.equal(penalized[1], logits[1])


def test_min_p_matches_transformers_and_never_samples_below_the_floor():
    from transformers.generation.logits_process import MinPLogitsWarper

    logits = torch.log(torch.tensor([[0.5, 0.3, 0.12, 0.08]]))
    want = MinPLogitsWarper(0.2)(torch.tensor([[0]]), logits.clone())
    assert torch.equal(torch.isinf(filter_min_p(logits, torch.tensor([0.2]))), torch.isinf(want))
    drawn = {sample(logits, [SamplingParams(min_p=0.2)], [_gen(s)])[0][0] for s in range(200)}
    assert drawn == {0, 1, 2}  # 0.08 < 0.2 x 0.5: never drawn; the other three all are


def test_top_p_applies_to_what_top_k_kept_as_transformers_and_vllm_do():
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    # probabilities 0.40, 0.35, 0.25: top_k=2 renormalises to 0.53, 0.47, so top_p=0.5 keeps token 0 alone
    # (over the whole distribution it would keep 0 and 1)
    logits = torch.log(torch.tensor([[0.40, 0.35, 0.25], [0.40, 0.35, 0.25]]))
    kept = ~torch.isinf(filter_top_k_top_p(logits, torch.tensor([2, 0]), torch.tensor([0.5, 0.5])))
    assert kept.tolist() == [[True, False, False], [True, True, False]]
    rows = torch.randn(6, 40, generator=_gen(3))
    for k, p in [(5, 0.6), (12, 0.9), (1, 0.3), (30, 0.2)]:
        want = TopPLogitsWarper(p)(
            torch.tensor([[0]]), TopKLogitsWarper(k)(torch.tensor([[0]]), rows.clone())
        )
        got = filter_top_k_top_p(rows, torch.full((6,), k), torch.full((6,), p))
        assert torch.equal(torch.isinf(got), torch.isinf(want)), (k, p)
