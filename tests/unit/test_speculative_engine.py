"""Speculative decoding in the engine: greedy output is token-for-token the output without it, in a continuous
batch with sequences that do not speculate, with stops and max_tokens honoured exactly, and rejected drafts'
KV blocks returned so the pool looks exactly as it would have without them."""

from __future__ import annotations

import pytest

from tandem.worker.api.params import SamplingParams
from tandem.worker.engine.loading import load_model
from tandem.worker.engine.runner.engine import Engine, EngineConfig
from tandem.worker.engine.speculative.backoff import BackoffPolicy
from tandem.worker.engine.speculative.proposer import SpeculativeConfig
from tests.engine_runs import run_to_completion, seeded_prompt

GREEDY = dict(temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny_model(tiny_model_dir):
    return load_model(tiny_model_dir)


def _engine(model, k: int | None = 4, **overrides) -> Engine:
    spec = SpeculativeConfig(num_tokens=k) if k else None
    return Engine(
        model, EngineConfig(**{"block_size": 4, "num_kv_blocks": 256, "speculative": spec, **overrides})
    )


def _reference(model, prompt: list[int], n: int) -> list[int]:
    return run_to_completion(_engine(model, k=None), [(prompt, SamplingParams(max_tokens=n, **GREEDY))])[
        "r0"
    ][0]


class Scripted:
    """Drafts from a known greedy continuation, right for the first `right` tokens and wrong after them."""

    def __init__(self, full: list[int], right: int, vocab: int):
        self.full, self.right, self.vocab = full, right, vocab

    def propose(self, seqs, num_tokens):
        drafts = []
        for seq, k in zip(seqs, num_tokens, strict=True):
            truth = self.full[seq.num_tokens : seq.num_tokens + k]
            drafts.append([t if i < self.right else (t + 1) % self.vocab for i, t in enumerate(truth)])
        return drafts


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_single_sequence_greedy_output_is_unchanged(tiny_model, seed):
    prompt = seeded_prompt(24, seed)
    engine = _engine(tiny_model)
    got = run_to_completion(engine, [(prompt, SamplingParams(max_tokens=48, **GREEDY))])["r0"]
    assert got == (_reference(tiny_model, prompt, 48), "length")
    assert engine.speculator is not None and engine.speculator.accepted_tokens > 0, "nothing was speculated"


def test_continuous_batch_mixing_speculating_and_plain_sequences(tiny_model):
    pattern = seeded_prompt(6, 9)
    requests = [
        (seeded_prompt(20, 4), SamplingParams(max_tokens=40, **GREEDY)),
        (pattern * 5, SamplingParams(max_tokens=33, **GREEDY)),  # drafts from the prompt itself
        (
            seeded_prompt(12, 5),
            SamplingParams(max_tokens=30, temperature=0.8, seed=7, ignore_eos=True),
        ),  # other draws
        (seeded_prompt(9, 6), SamplingParams(max_tokens=25, temperature=0.0, stop_token_ids=[17, 402, 877])),
    ]
    late = {
        3: [(seeded_prompt(70, 8), SamplingParams(max_tokens=20, **GREEDY))]
    }  # a chunked prompt joins mid-way
    plain = run_to_completion(_engine(tiny_model, k=None, prefill_chunk_tokens=16), requests, late)
    engine = _engine(tiny_model, prefill_chunk_tokens=16)
    mixed_steps = 0
    real_step = engine.step

    def step():
        outs = real_step()
        sched = engine.last_schedule
        if sched and any(sched.drafts) and not all(sched.drafts):
            nonlocal mixed_steps
            mixed_steps += 1
        return outs

    engine.step = step  # type: ignore[method-assign]
    got = run_to_completion(engine, requests, late)
    sampled = "r2"  # rejection sampling keeps its distribution, not its draws: only its length must agree
    assert len(got.pop(sampled)[0]) == len(plain.pop(sampled)[0]) == 30
    assert got == plain
    assert mixed_steps > 0, "no step batched speculating and plain sequences together"
    assert engine.speculator is not None and engine.speculator.accepted_tokens > 0


def test_stop_token_and_max_tokens_end_exactly_inside_accepted_drafts(tiny_model):
    prompt = seeded_prompt(16, 11)
    full = prompt + _reference(tiny_model, prompt, 30)
    for params, want_len, reason in [
        (SamplingParams(max_tokens=7, **GREEDY), 7, "length"),
        (SamplingParams(max_tokens=30, temperature=0.0, stop_token_ids=[full[16 + 8]]), None, "stop"),
    ]:
        engine = _engine(tiny_model, k=4)
        assert engine.speculator is not None
        engine.speculator.proposer = Scripted(
            full, right=4, vocab=tiny_model.config.vocab_size
        )  # all accepted
        engine.speculator.policy = BackoffPolicy(first_pause_steps=1)  # speculate from the first decode step
        tokens, why = run_to_completion(engine, [(prompt, params)])["r0"]
        n = want_len or full[16:].index(full[16 + 8]) + 1
        assert (tokens, why) == (full[16 : 16 + n], reason)
        assert engine.speculator.accepted_tokens > 0


@pytest.mark.parametrize("right", [0, 1, 2])
def test_rejected_drafts_leave_the_block_pool_as_plain_decoding_would(tiny_model, right):
    """Each verify emits `right + 1` tokens; after it the pool must equal a plain engine's `right + 1` steps
    later."""
    prompt = seeded_prompt(13, 12)
    full = prompt + _reference(tiny_model, prompt, 40)
    spec, plain = _engine(tiny_model, k=4), _engine(tiny_model, k=None)
    assert spec.speculator is not None
    spec.speculator.proposer = Scripted(full, right=right, vocab=tiny_model.config.vocab_size)
    spec.speculator.policy = BackoffPolicy(min_acceptance=0.0, first_pause_steps=1)  # never back off here
    params = SamplingParams(max_tokens=40, **GREEDY)
    spec.add_request(prompt, params, "r")
    plain.add_request(prompt, params, "r")
    spec.step(), plain.step()  # the prompt
    checked = 0
    while spec.has_work():
        emitted = spec.step()
        for _ in emitted:
            plain.step()
        if "r" not in spec.seqs:
            break
        s, p = spec.seqs["r"], plain.seqs["r"]
        assert (s.output_ids, s.num_computed) == (p.output_ids, p.num_computed)
        assert len(s.block_table) == len(p.block_table) == spec.blocks.blocks_needed(s.num_computed)
        assert spec.blocks.num_free == plain.blocks.num_free
        assert set(spec.blocks.cached) == set(plain.blocks.cached), "prefix-cache entries differ"
        checked += 1
    assert checked > 5 and spec.blocks.num_used == 0
    assert spec.speculator.proposed_tokens > spec.speculator.accepted_tokens


def test_backoff_stops_proposing_when_drafts_keep_failing(tiny_model):
    prompt = seeded_prompt(10, 13)
    full = prompt + _reference(tiny_model, prompt, 60)
    engine = _engine(tiny_model, k=4)
    assert engine.speculator is not None
    engine.speculator.proposer = Scripted(full, right=0, vocab=tiny_model.config.vocab_size)
    tokens, _ = run_to_completion(engine, [(prompt, SamplingParams(max_tokens=60, **GREEDY))])["r0"]
    assert tokens == full[10:]
    verifies = engine.speculator.verifies
    assert engine.speculator.accepted_tokens == 0 and 0 < verifies < 59 // 3


def test_flex_attention_verifies_drafts_too(tiny_model):
    prompt = seeded_prompt(12, 15)
    engine = _engine(tiny_model, attention="flex")
    got = run_to_completion(engine, [(prompt, SamplingParams(max_tokens=16, **GREEDY))])["r0"][0]
    assert got == _reference(tiny_model, prompt, 16)
    assert engine.speculator is not None and engine.speculator.accepted_tokens > 0


def test_speculation_matches_transformers_greedy():
    from tests.hf_reference import LLAMA_GQA, engine_for, hf_greedy, hf_model, ours_from

    hf = hf_model({**LLAMA_GQA, "initializer_range": 0.02})  # small weights: a text that repeats itself
    engine = engine_for(ours_from(hf), speculative=SpeculativeConfig(num_tokens=5))
    prompts = [seeded_prompt(n, n, vocab=500) for n in (7, 19, 30)]
    got = run_to_completion(engine, [(p, SamplingParams(max_tokens=40, **GREEDY)) for p in prompts])
    for i, prompt in enumerate(prompts):
        assert got[f"r{i}"][0] == hf_greedy(hf, prompt, 40)
    assert engine.speculator is not None and engine.speculator.accepted_tokens > 0


def test_penalties_see_the_drafts_before_each_verified_row(tiny_model):
    """A penalized greedy sequence speculates to the very output it has without speculation: each draft row
    is penalized by the output as it stands at that row, drafts included."""
    prompt = seeded_prompt(12, 5)
    params = SamplingParams(max_tokens=24, repetition_penalty=1.3, presence_penalty=0.5, **GREEDY)
    plain = run_to_completion(_engine(tiny_model, k=None), [(prompt, params)])["r0"]
    assert plain[0] != _reference(tiny_model, prompt, 24)  # the penalties changed the answer
    engine = _engine(tiny_model)
    assert engine.speculator is not None
    engine.speculator.proposer = Scripted(prompt + plain[0], right=3, vocab=tiny_model.config.vocab_size)
    engine.speculator.policy = BackoffPolicy(min_acceptance=0.0, first_pause_steps=1)  # never back off here
    assert run_to_completion(engine, [(prompt, params)])["r0"] == plain
    assert engine.speculator.accepted_tokens > 5
