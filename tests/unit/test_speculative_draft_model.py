"""The self-speculative draft (the model's first layers, its final norm and LM head) in the engine: greedy
output is token-for-token the output without speculation, alone and in a continuous batch; a model whose
upper layers add nothing accepts nearly every draft while a random one backs off; the draft's KV slots
are the verify's, so the block pool ends empty and looks after each verify as plain decoding's would."""

from __future__ import annotations

import pytest
import torch

from tandem.worker.api.params import SamplingParams
from tandem.worker.devtools.early_exit import upper_layers_scaled
from tandem.worker.engine.loading import load_model
from tandem.worker.engine.runner.engine import Engine, EngineConfig
from tandem.worker.engine.speculative.backoff import BackoffPolicy
from tandem.worker.engine.speculative.draft_model import DraftModelProposer, drafts_that_fit, still_drafting
from tandem.worker.engine.speculative.proposer import SpeculativeConfig
from tests.engine_runs import run_to_completion, seeded_prompt

GREEDY = dict(temperature=0.0, ignore_eos=True)
ALWAYS = BackoffPolicy(min_acceptance=0.0, first_pause_steps=1)  # speculate every step, whatever happens
DRAFT_LAYERS = 2  # of the tiny model's 4


@pytest.fixture(scope="module")
def tiny_model(tiny_model_dir):
    return load_model(tiny_model_dir)


@pytest.fixture(scope="module")
def early_exit_model(tiny_model_dir):
    """Layers >= DRAFT_LAYERS add nothing to the residual stream: exiting after DRAFT_LAYERS is the model."""
    return upper_layers_scaled(load_model(tiny_model_dir), DRAFT_LAYERS, 0.0)


def _engine(
    model, layers: int | None = DRAFT_LAYERS, k: int = 4, policy: BackoffPolicy | None = None, **overrides
):
    spec = SpeculativeConfig("draft", k, draft_layers=layers) if layers else None
    engine = Engine(
        model, EngineConfig(**{"block_size": 4, "num_kv_blocks": 256, "speculative": spec, **overrides})
    )
    if policy is not None:
        assert engine.speculator is not None
        engine.speculator.policy = policy
    return engine


def _acceptance(engine: Engine) -> float:
    assert engine.speculator is not None and engine.speculator.proposed_tokens > 0, "nothing was drafted"
    return engine.speculator.accepted_tokens / engine.speculator.proposed_tokens


# --- the proposer's loop, with a scripted step -----------------------------------------------------


class _Seq:
    def __init__(self, tokens: list[int]):
        self.token_ids, self.num_tokens = tokens, len(tokens)


def test_each_sequence_drafts_its_own_count_one_token_per_step_at_its_positions():
    calls = []

    def step(ids, seqs, positions):  # the next token is the input plus the position
        calls.append((ids.tolist(), positions))
        return ids + torch.tensor(positions)

    seqs = [_Seq([7, 10]), _Seq([1, 2, 3, 100]), _Seq([5])]
    room = {id(seqs[0]): 4, id(seqs[1]): 2, id(seqs[2]): 9}  # slots free for each: the second fits one draft
    proposer = DraftModelProposer(step, lambda s, n: min(n, room[id(s)]))
    drafts = proposer.propose(seqs, [3, 3, 2])  # type: ignore[arg-type]
    assert drafts == [[11, 13, 16], [103], [5, 6]]
    assert calls == [
        ([10, 100, 5], [1, 3, 0]),
        ([11, 5], [2, 1]),
        ([13], [3]),
    ]  # each step feeds its drafts back


def test_no_room_no_drafts_and_no_step():
    proposer = DraftModelProposer(
        lambda *a: pytest.fail("stepped"), lambda s, n: 1
    )  # room for the last token only
    assert proposer.propose([_Seq([1, 2])], [4]) == [[]]  # type: ignore[list-item]
    assert drafts_that_fit(4, 0) == drafts_that_fit(4, 1) == 0 and drafts_that_fit(4, 3) == 2
    assert drafts_that_fit(4, 9) == 4 and still_drafting([3, 1, 2], [0, 1, 2], 1) == [0, 2]


# --- in the engine ----------------------------------------------------------------------------------


@pytest.mark.parametrize("layers,seed", [(1, 1), (2, 2), (3, 3)])
def test_greedy_output_is_unchanged_when_every_step_drafts(tiny_model, layers, seed):
    prompt = seeded_prompt(21, seed)
    params = SamplingParams(max_tokens=40, **GREEDY)
    want = run_to_completion(_engine(tiny_model, layers=None), [(prompt, params)])
    engine = _engine(tiny_model, layers=layers, policy=ALWAYS)
    assert run_to_completion(engine, [(prompt, params)]) == want
    assert engine.speculator is not None and engine.speculator.verifies > 10


@pytest.mark.parametrize("which", ["random", "early_exit"])
def test_continuous_batch_mixing_drafting_and_plain_sequences(request, which):
    model = request.getfixturevalue("tiny_model" if which == "random" else "early_exit_model")
    requests = [
        (seeded_prompt(20, 4), SamplingParams(max_tokens=40, **GREEDY)),
        (seeded_prompt(7, 5), SamplingParams(max_tokens=3, **GREEDY)),  # too short to draft much
        (seeded_prompt(12, 6), SamplingParams(max_tokens=30, temperature=0.8, seed=7, ignore_eos=True)),
        (seeded_prompt(9, 7), SamplingParams(max_tokens=25, temperature=0.0, stop_token_ids=[17, 402, 877])),
        (seeded_prompt(15, 8), SamplingParams(max_tokens=1, **GREEDY)),  # never drafts
    ]
    late = {
        3: [(seeded_prompt(70, 9), SamplingParams(max_tokens=20, **GREEDY))]
    }  # a chunked prompt joins mid-way
    plain = run_to_completion(_engine(model, layers=None, prefill_chunk_tokens=16), requests, late)
    engine = _engine(model, policy=ALWAYS, prefill_chunk_tokens=16)
    mixed = 0
    real_step = engine.step

    def step():
        nonlocal mixed
        outs = real_step()
        sched = engine.last_schedule
        mixed += bool(sched and any(sched.drafts) and not all(sched.drafts))
        return outs

    engine.step = step  # type: ignore[method-assign]
    got = run_to_completion(engine, requests, late)
    sampled = "r2"  # rejection sampling keeps its distribution, not its draws: only its length must agree
    assert len(got.pop(sampled)[0]) == len(plain.pop(sampled)[0]) == 30
    assert got == plain
    assert mixed > 0, "no step batched drafting and plain sequences together"
    if which == "early_exit":  # the sampled sequence accepts less (at temperature 0.8, the argmax seldom)
        assert _acceptance(engine) > 0.3


def test_a_model_whose_upper_layers_add_nothing_accepts_nearly_every_draft(early_exit_model):
    prompts = [seeded_prompt(n, n) for n in (9, 17, 26)]
    engine = _engine(early_exit_model, k=5)
    got = run_to_completion(engine, [(p, SamplingParams(max_tokens=48, **GREEDY)) for p in prompts])
    want = run_to_completion(
        _engine(early_exit_model, layers=None),
        [(p, SamplingParams(max_tokens=48, **GREEDY)) for p in prompts],
    )
    assert got == want
    assert _acceptance(engine) >= 0.95
    assert (
        engine.speculator is not None and engine.speculator.accepted_tokens > 3 * 48 // 2
    )  # most were drafts


def test_early_exit_below_the_silenced_layers_is_not_the_model(early_exit_model):
    """The acceptance above comes from exiting where the model is already done: one layer earlier, drafts
    fail."""
    engine = _engine(early_exit_model, layers=1, policy=ALWAYS)
    run_to_completion(engine, [(seeded_prompt(17, 17), SamplingParams(max_tokens=40, **GREEDY))])
    assert _acceptance(engine) < 0.5


def test_a_random_model_accepts_little_and_backs_off(tiny_model):
    prompt = seeded_prompt(14, 21)
    engine = _engine(tiny_model, layers=1)
    steps = 0
    real_step = engine.step

    def step():
        nonlocal steps
        steps += 1
        return real_step()

    engine.step = step  # type: ignore[method-assign]
    run_to_completion(engine, [(prompt, SamplingParams(max_tokens=80, **GREEDY))])
    assert engine.speculator is not None
    assert _acceptance(engine) < 0.3
    assert 0 < engine.speculator.verifies < steps // 4, "back-off did not stop the drafting"


def test_after_each_verify_the_block_pool_is_as_plain_decoding_leaves_it(tiny_model):
    prompt = seeded_prompt(13, 12)
    spec, plain = _engine(tiny_model, policy=ALWAYS), _engine(tiny_model, layers=None)
    params = SamplingParams(max_tokens=40, **GREEDY)
    spec.add_request(prompt, params, "r")
    plain.add_request(prompt, params, "r")
    spec.step(), plain.step()  # the prompt
    checked = 0
    while "r" in spec.seqs:
        for _ in spec.step():
            plain.step()
        if "r" not in spec.seqs:
            break
        s, p = spec.seqs["r"], plain.seqs["r"]
        assert (s.output_ids, s.num_computed) == (p.output_ids, p.num_computed)
        assert len(s.block_table) == len(p.block_table) == spec.blocks.blocks_needed(s.num_computed)
        assert spec.blocks.num_free == plain.blocks.num_free
        assert set(spec.blocks.cached) == set(plain.blocks.cached), "prefix-cache entries differ"
        checked += 1
    assert checked > 5 and spec.blocks.num_used == 0 == plain.blocks.num_used


def test_drafting_with_a_nearly_full_pool_takes_only_free_blocks_and_preempts_no_one(early_exit_model):
    """Ten blocks of four tokens for two sequences: drafts shrink to the room left, output stays exact."""
    requests = [(seeded_prompt(10, s), SamplingParams(max_tokens=14, **GREEDY)) for s in (31, 32)]
    want = run_to_completion(_engine(early_exit_model, layers=None, num_kv_blocks=14), requests)
    engine = _engine(early_exit_model, policy=ALWAYS, num_kv_blocks=14)
    assert run_to_completion(engine, requests) == want
    assert engine.speculator is not None and engine.speculator.accepted_tokens > 0


def test_sampled_sequences_draft_reproducibly_under_a_seed(early_exit_model):
    params = SamplingParams(max_tokens=40, temperature=0.03, top_k=20, seed=11, ignore_eos=True)
    runs = []
    for _ in range(2):
        engine = _engine(early_exit_model, policy=BackoffPolicy(first_pause_steps=1))
        runs.append(run_to_completion(engine, [(seeded_prompt(16, 40), params)])["r0"][0])
        assert _acceptance(engine) > 0.5  # the argmax draft is the likeliest token at a low temperature
    assert runs[0] == runs[1] and len(runs[0]) == 40


def _tv(a: list[int], b: list[int]) -> float:
    tokens = set(a) | set(b)
    return 0.5 * sum(abs(a.count(t) / len(a) - b.count(t) / len(b)) for t in tokens)


def test_sampled_tokens_after_drafts_are_distributed_as_without_them(early_exit_model):
    """Many seeded copies of one prompt, 3 tokens each: the second and third tokens (a verify of one draft
    emits them) have the same distribution with drafts as without. Accepting every draft would give the
    argmax far more often than the target samples it."""
    n, prompt = 600, seeded_prompt(12, 60)
    runs = []
    for layers in (None, DRAFT_LAYERS):
        policy = ALWAYS if layers else None
        engine = _engine(
            early_exit_model, layers=layers, policy=policy, num_kv_blocks=n * 4, max_running_sequences=n
        )
        reqs = [
            (prompt, SamplingParams(max_tokens=3, temperature=0.05, seed=s, ignore_eos=True))
            for s in range(n)
        ]
        runs.append([toks for toks, _ in run_to_completion(engine, reqs).values()])
    assert engine.speculator is not None and engine.speculator.verifies == n  # each verified its one draft
    assert 0.2 < _acceptance(engine) < 0.95
    # bounds: above the total variation between two plain runs of other seeds (0.06, 0.15); accepting
    # every draft would put the second token's at 1 - acceptance, about 0.3
    for at, bound in ((1, 0.15), (2, 0.25)):
        plain, drafted = ([r[at] for r in run] for run in runs)
        assert _tv(plain, drafted) < bound, f"token {at + 1}"


@pytest.mark.parametrize("overrides", [{"attention": "flex"}, {"kv_cache_dtype": "int8"}])
def test_other_attention_backends_and_caches_draft_too(early_exit_model, overrides):
    prompt = seeded_prompt(12, 15)
    params = SamplingParams(max_tokens=16, **GREEDY)
    want = run_to_completion(_engine(early_exit_model, layers=None, **overrides), [(prompt, params)])
    engine = _engine(early_exit_model, policy=ALWAYS, **overrides)
    assert run_to_completion(engine, [(prompt, params)]) == want
    assert _acceptance(engine) > 0.8


def test_a_prefilled_sequence_drafts_over_the_transferred_cache(early_exit_model):
    """The decode side of a transfer: the prompt's KV arrives from another engine (every layer's, so the
    draft's first layers find theirs there) and the decode engine drafts over it from its first step."""
    prompt = seeded_prompt(18, 50)
    prefill = _engine(early_exit_model, layers=None)
    decode = _engine(early_exit_model, policy=ALWAYS)
    first = run_to_completion(prefill, [(prompt, SamplingParams(max_tokens=1, **GREEDY))])["r0"][0][0]
    prefill_cached = _engine(early_exit_model, layers=None, enable_prefix_caching=False)
    prefill_cached.add_request(prompt, SamplingParams(max_tokens=2, **GREEDY), "p")
    prefill_cached.step()  # the prompt's KV is in its cache now
    table, cached = decode.reserve(prompt, SamplingParams(max_tokens=30, **GREEDY))
    assert cached == 0
    source = prefill_cached.seqs["p"].block_table
    for layer in range(early_exit_model.config.num_layers):
        decode.kv.write_blocks(layer, table[: len(source)], *prefill_cached.kv.read_blocks(layer, source))
    out = decode.admit_prefilled("d", prompt, SamplingParams(max_tokens=30, **GREEDY), table, first)
    tokens = [o.token_id for o in out]
    while decode.has_work():
        tokens += [o.token_id for o in decode.step()]
    want = run_to_completion(
        _engine(early_exit_model, layers=None), [(prompt, SamplingParams(max_tokens=30, **GREEDY))]
    )
    assert tokens == want["r0"][0]
    assert _acceptance(decode) > 0.9 and decode.blocks.num_used == 0


def test_the_draft_must_use_fewer_layers_than_the_model(tiny_model):
    with pytest.raises(ValueError, match="has 4 layers"):
        _engine(tiny_model, layers=4)
    with pytest.raises(ValueError, match="at least 1"):
        SpeculativeConfig("draft", 4, draft_layers=0)
    with pytest.raises(ValueError, match="draft_layers"):
        SpeculativeConfig("draft", 4)
    with pytest.raises(ValueError, match="draft_layers"):
        SpeculativeConfig("ngram", 4, draft_layers=2)
