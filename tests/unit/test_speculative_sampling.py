"""Rejection sampling of drafts under temperature keeps the target distribution: every emitted token is
distributed as the model's own (tempered, filtered) distribution at its position, checked on a small
vocabulary with a fixed seed and a total-variation bound; and in the engine, sampled sequences speculate
reproducibly under a seed and return their blocks."""

from __future__ import annotations

import pytest
import torch

from tandem.worker.api.params import SamplingParams
from tandem.worker.engine.loading import load_model
from tandem.worker.engine.runner.engine import Engine, EngineConfig
from tandem.worker.engine.speculative.backoff import BackoffPolicy
from tandem.worker.engine.speculative.proposer import SpeculativeConfig
from tandem.worker.engine.speculative.rejection import verify_sampled

V = 6
TRIALS = 40_000
TV_BOUND = 0.02  # about four standard errors of the empirical total variation at these counts


def _tv(counts: torch.Tensor, p: torch.Tensor) -> float:
    return 0.5 * float((counts / counts.sum() - p).abs().sum())


def test_each_emitted_token_follows_the_target_distribution():
    g = torch.Generator().manual_seed(0)
    probs = torch.distributions.Dirichlet(torch.ones(V)).sample((4,))
    probs[1, 2] = 0.0  # a token the target never samples there (top-k/top-p filtering looks like this)
    probs /= probs.sum(-1, keepdim=True)
    draft = [int(probs[0].argmax()), 4, int(probs[2].argmin())]  # likely, plausible, unlikely
    first, second, third = torch.zeros(V), torch.zeros(V), torch.zeros(V)
    for _ in range(TRIALS):
        out = verify_sampled(probs, draft, g)
        assert 1 <= len(out) <= 4 and out[:-1] == draft[: len(out) - 1]
        first[out[0]] += 1
        if len(out) > 1:  # the first draft was accepted: the second token is from row 1
            second[out[1]] += 1
        if len(out) > 2:
            third[out[2]] += 1
    assert _tv(first, probs[0]) < TV_BOUND
    assert _tv(second, probs[1]) < TV_BOUND and second[2] == 0
    assert _tv(third, probs[2]) < 2 * TV_BOUND  # fewer samples reach the third row
    assert first[draft[0]] / TRIALS == pytest.approx(float(probs[0, draft[0]]), abs=TV_BOUND)


def test_a_draft_the_target_never_samples_is_always_rejected():
    probs = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    g = torch.Generator().manual_seed(1)
    assert all(verify_sampled(probs, [2], g)[0] in (0, 1) for _ in range(200))


@pytest.fixture(scope="module")
def tiny_model(tiny_model_dir):
    return load_model(tiny_model_dir)


def _run(engine: Engine, prompt: list[int], params: SamplingParams) -> list[int]:
    engine.add_request(prompt, params, "r")
    out = []
    while engine.has_work():
        out += [o.token_id for o in engine.step()]
    assert engine.blocks.num_used == 0
    return out


def test_sampled_sequences_speculate_reproducibly_under_a_seed(tiny_model):
    start = list(range(40, 56))  # then the model's own greedy continuation, which repeats itself
    plain = Engine(tiny_model, EngineConfig(block_size=4, num_kv_blocks=64))
    prompt = start + _run(plain, start, SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True))
    params = SamplingParams(max_tokens=40, temperature=0.2, top_k=20, seed=11, ignore_eos=True)
    runs = []
    for _ in range(2):
        engine = Engine(
            tiny_model, EngineConfig(block_size=4, num_kv_blocks=64, speculative=SpeculativeConfig())
        )
        assert engine.speculator is not None
        engine.speculator.policy = BackoffPolicy(first_pause_steps=1)
        runs.append(_run(engine, prompt, params))
        assert engine.speculator.accepted_tokens > 0  # at a low temperature the model goes on repeating
    assert runs[0] == runs[1] and len(runs[0]) == 40
