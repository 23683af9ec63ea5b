"""The batched sampler against the implementations it replaced, and its reads of the device per step.

The references below are the previous implementations (penalties row by row, the filters' parameters one
tensor each); the batched ones give the same logits, the same masked distributions and, for the same seeds,
the same tokens.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from tandem.worker.api.params import SamplingParams
from tandem.worker.engine.core import sampling
from tandem.worker.engine.core.grammar import TokenConstraint, allowed_tokens, top_logprobs
from tandem.worker.engine.core.sampling import apply_penalties, sample, sampling_probs

VOCAB = 97


def penalties_row_by_row(logits, params, prompts, outputs):
    logits, device, vocab = logits.clone(), logits.device, logits.shape[-1]
    for i, p in enumerate(params):
        if not p.penalized:
            continue
        row = logits[i]
        if p.repetition_penalty != 1.0:
            seen = torch.tensor(sorted(set(prompts[i]) | set(outputs[i])), dtype=torch.long, device=device)
            picked = row[seen]
            row[seen] = torch.where(picked > 0, picked / p.repetition_penalty, picked * p.repetition_penalty)
        if outputs[i] and (p.presence_penalty or p.frequency_penalty):
            counts = torch.bincount(torch.tensor(outputs[i], device=device), minlength=vocab)[:vocab].to(
                row.dtype
            )
            row -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(row.dtype)
    return logits


def probs_knob_by_knob(logits, params):
    """The previous sampling_probs: one tensor (and one copy to the device) per parameter."""
    device = logits.device
    scaled = logits / torch.tensor([p.temperature for p in params], device=device)[:, None]
    if any(p.min_p > 0.0 for p in params):
        scaled = sampling.filter_min_p(scaled, torch.tensor([p.min_p for p in params], device=device))
    if any(p.top_k > 0 or p.top_p < 1.0 for p in params):
        top_k = torch.tensor([p.top_k for p in params], device=device)
        top_p = torch.tensor([p.top_p for p in params], device=device)
        scaled = sampling.filter_top_k_top_p(scaled, top_k, top_p)
    return scaled.softmax(-1)


def random_params(rng: random.Random, n: int) -> list[SamplingParams]:
    choices = []
    for _ in range(n):
        choices.append(
            SamplingParams(
                temperature=rng.choice([0.0, 0.7, 1.0, 1.3]),
                top_k=rng.choice([0, 1, 5, 40]),
                top_p=rng.choice([1.0, 0.9, 0.5]),
                min_p=rng.choice([0.0, 0.05]),
                repetition_penalty=rng.choice([1.0, 1.0, 1.2, 0.8]),
                presence_penalty=rng.choice([0.0, 0.5, -0.3]),
                frequency_penalty=rng.choice([0.0, 0.4]),
                seed=rng.choice([None, rng.randrange(1000)]),
                max_tokens=8,
            )
        )
    return choices


@pytest.mark.parametrize("seed", range(6))
def test_penalties_match_the_row_by_row_reference(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 9)
    params = random_params(rng, n)
    prompts = [[rng.randrange(VOCAB) for _ in range(rng.randint(1, 30))] for _ in range(n)]
    outputs = [[rng.randrange(VOCAB) for _ in range(rng.randint(0, 12))] for _ in range(n)]
    logits = torch.randn(n, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3
    got = apply_penalties(logits, params, prompts, outputs)
    want = penalties_row_by_row(logits, params, prompts, outputs)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert torch.equal(got.argmax(-1), want.argmax(-1)), "a penalty moved a greedy pick"


@pytest.mark.parametrize("seed", range(6))
def test_masked_distributions_match_the_row_by_row_reference(seed):
    rng = random.Random(100 + seed)
    params = [p for p in random_params(rng, 12) if not p.greedy] or [SamplingParams(temperature=1.0, top_k=3)]
    logits = torch.randn(len(params), VOCAB, generator=torch.Generator().manual_seed(seed)) * 2
    got = sampling_probs(logits, params)
    want = probs_knob_by_knob(logits, params)
    assert torch.equal(got, want)
    assert (got > 0).any(-1).all(), "every row keeps a token"


def test_seeded_rows_draw_what_their_generators_alone_would():
    """Seeded rows in a batch draw the tokens a batch of one with the same seed draws (the noise is per
    row)."""
    rng = random.Random(7)
    params = [SamplingParams(temperature=1.0, top_p=0.9, seed=s, max_tokens=4) for s in (3, 11, 3, 42)]
    params.insert(1, SamplingParams(temperature=0.0, max_tokens=4))  # a greedy row between them
    logits = torch.randn(len(params), VOCAB, generator=torch.Generator().manual_seed(rng.randrange(99)))
    logits[3] = logits[0]  # the same seed over the same logits

    def gens():
        return [None if p.seed is None else torch.Generator().manual_seed(p.seed) for p in params]

    batched, _ = sample(logits, params, gens())
    alone = [
        sample(logits[i : i + 1], [p], [g])[0][0] for i, (p, g) in enumerate(zip(params, gens(), strict=True))
    ]
    assert batched == alone
    assert batched[1] == int(logits[1].argmax())
    assert batched[0] == batched[3], "rows with the same seed and logits draw the same token"


def test_min_tokens_bans_every_rows_stop_ids_in_one_mask():
    constraints = [
        TokenConstraint(None, 3, (2, 5)),
        TokenConstraint(None, 1, (7,), emitted=1),
        TokenConstraint(None, 2, (0, 96)),
    ]
    allowed = allowed_tokens(constraints, VOCAB, (2,))
    want = torch.ones(3, VOCAB, dtype=torch.bool)
    want[0, [2, 5]] = False
    want[2, [0, 96]] = False  # the second row has emitted its min_tokens: nothing banned
    assert torch.equal(allowed, want)


def test_top_logprobs_read_ids_and_values_together():
    logits = torch.tensor([[0.0, 3.0, 1.0, float("-inf")], [2.0, 0.0, 0.0, 1.0]])
    tops = top_logprobs(logits, [3, 0])
    logp = torch.log_softmax(logits[0], -1)
    assert [t for t, _ in tops[0]] == [1, 2, 0] and tops[1] == []
    assert [v for _, v in tops[0]] == pytest.approx([logp[1].item(), logp[2].item(), logp[0].item()])


HOST_READS = ("tolist", "item", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")


class HostReads:
    """Counts the Python-level reads of tensor values on the host (on a GPU each is a wait for the device)."""

    def __init__(self, monkeypatch):
        self.count, self.on = 0, False
        for name in HOST_READS:
            original = getattr(torch.Tensor, name)

            def counted(tensor, *args, _original=original, **kwargs):
                if self.on:
                    self.count += 1
                return _original(tensor, *args, **kwargs)

            monkeypatch.setattr(torch.Tensor, name, counted)


def test_one_host_read_per_step_for_the_sampled_ids(monkeypatch, tiny_model_dir):
    """A decode step over a batch mixing greedy, filtered, seeded, penalised and min_tokens rows reads the
    device once in the sampler (the ids), and once more for each of logprobs and top_logprobs when asked."""
    from tandem.worker.engine.loading import build_engine
    from tandem.worker.engine.runner.engine import Engine, EngineConfig

    engine, _ = build_engine(tiny_model_dir, EngineConfig(num_kv_blocks=64, block_size=4))
    rng = random.Random(3)
    for i, params in enumerate(random_params(rng, 6)):
        engine.add_request([5 + i, 9, 13], dataclasses.replace(params, min_tokens=2, max_tokens=6))
    reads = HostReads(monkeypatch)
    draw = engine._draw
    per_step = []

    def counting_draw(*args):
        reads.on, reads.count = True, 0
        try:
            return draw(*args)
        finally:
            reads.on = False
            per_step.append(reads.count)

    monkeypatch.setattr(engine, "_draw", counting_draw)
    assert isinstance(engine, Engine)
    for _ in range(3):
        engine.step()
    assert per_step == [1, 1, 1]
    engine.add_request([4, 4], SamplingParams(max_tokens=2, logprobs=True, top_logprobs=2, temperature=0.0))
    engine.step()
    assert per_step[-1] == 3  # the ids, the logprobs, the alternatives


def test_the_noise_for_seeded_rows_crosses_in_one_copy(monkeypatch):
    copies = []
    original = torch.Tensor.to

    def to(tensor, *args, **kwargs):
        copies.append(tensor.shape)
        return original(tensor, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", to)
    gens = [torch.Generator().manual_seed(s) for s in (1, 2, 3)] + [None]
    sampling._exponential_noise((4, VOCAB), gens, torch.device("cpu"))
    assert torch.Size([3, VOCAB]) in copies and torch.Size([VOCAB]) not in copies
