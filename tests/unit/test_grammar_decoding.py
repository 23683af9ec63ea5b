"""Constrained decoding in the engine, on the tiny random model (whose free text is never JSON): a JSON schema
holds for sampled output, across the prefill -> decode handoff (token for token the colocated answer) and
beside speculative decoding; min_tokens keeps EOS and stop ids out; top_logprobs are the model's likeliest."""

from __future__ import annotations

import json

import pytest
import torch

from tandem.worker.api.params import InvalidRequest, SamplingParams
from tandem.worker.engine.core.grammar import GRAMMAR_TOKENIZER_FILE, GrammarVocab
from tandem.worker.engine.loading import build_engine
from tandem.worker.engine.runner.engine import Engine, EngineConfig
from tandem.worker.engine.speculative.backoff import BackoffPolicy
from tandem.worker.engine.speculative.proposer import SpeculativeConfig
from tandem.worker.router.structured import json_schema_grammar
from tests.engine_runs import run_to_completion

SCHEMA = {
    "type": "object",
    "properties": {
        "colour": {"enum": ["red", "green", "blue"]},
        "count": {"type": "integer", "minimum": 0, "maximum": 99},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
        "note": {"type": "string", "maxLength": 12},
    },
    "required": ["colour", "count", "ok", "tags", "note"],
    "additionalProperties": False,
}
GRAMMAR = json_schema_grammar(SCHEMA, "schema")


def conforms(doc: dict) -> bool:
    return (
        set(doc) == set(SCHEMA["properties"])
        and doc["colour"] in ("red", "green", "blue")
        and isinstance(doc["count"], int)
        and 0 <= doc["count"] <= 99
        and isinstance(doc["ok"], bool)
        and len(doc["tags"]) <= 3
        and set(doc["tags"]) <= {"a", "b"}
        and isinstance(doc["note"], str)
        and len(doc["note"]) <= 12
    )


@pytest.fixture(scope="module")
def built(tiny_model_dir):
    engine, tokenizer = build_engine(tiny_model_dir, EngineConfig(block_size=4, num_kv_blocks=512))
    return engine, tokenizer


def _engine_like(built, tiny_model_dir, **overrides) -> Engine:
    engine, _ = built
    vocab = GrammarVocab(
        tiny_model_dir / GRAMMAR_TOKENIZER_FILE, engine.model.config.vocab_size, engine.eos_token_ids
    )
    config = EngineConfig(**{"block_size": 4, "num_kv_blocks": 512, **overrides})
    return Engine(engine.model, config, eos_token_ids=engine.eos_token_ids, grammar_vocab=vocab)


def _text(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids)


def test_free_text_of_the_random_model_is_not_json(built):
    engine, tokenizer = built
    prompt = tokenizer.encode("Answer in JSON:")
    ((ids, _),) = run_to_completion(
        engine, [(prompt, SamplingParams(max_tokens=40, temperature=1.0, seed=3))]
    ).values()
    with pytest.raises(json.JSONDecodeError):
        json.loads(_text(tokenizer, ids))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_sampled_output_matches_the_schema(built, temperature):
    engine, tokenizer = built
    prompt = tokenizer.encode("Answer in JSON:")
    reqs = [
        (prompt, SamplingParams(max_tokens=120, temperature=temperature, seed=s, grammar=GRAMMAR))
        for s in range(4)
    ]
    for ids, reason in run_to_completion(engine, reqs).values():
        assert reason == "stop" and ids[-1] in engine.eos_token_ids  # the grammar ends the answer with EOS
        assert conforms(json.loads(_text(tokenizer, ids))), _text(tokenizer, ids)


def test_the_grammar_holds_across_the_kv_handoff(built, tiny_model_dir):
    """The prefill worker's engine samples the first token under the grammar; the decode worker's engine
    replays it into its own matcher and samples the rest: the colocated answer, token for token."""
    _, tokenizer = built
    colocated, prefill, decode = (_engine_like(built, tiny_model_dir) for _ in range(3))
    prompt = tokenizer.encode("The weather today, as JSON:")
    params = SamplingParams(max_tokens=120, temperature=0.0, grammar=GRAMMAR)
    ((whole, reason),) = run_to_completion(colocated, [(prompt, params)]).values()
    assert reason == "stop" and conforms(json.loads(_text(tokenizer, whole)))

    prefill.add_request(prompt, SamplingParams(max_tokens=2, temperature=0.0, grammar=GRAMMAR), "p")
    (first,) = prefill.step()  # the prompt's KV is in its cache, the first token drawn under the grammar
    table, _ = decode.reserve(prompt, params)
    source = prefill.seqs["p"].block_table
    for layer in range(prefill.model.config.num_layers):
        decode.kv.write_blocks(layer, table[: len(source)], *prefill.kv.read_blocks(layer, source))
    prefill.abort("p")
    out = [o.token_id for o in decode.admit_prefilled("d", prompt, params, table, first.token_id)]
    while decode.has_work():
        out += [o.token_id for o in decode.step()]
    assert out == whole


def test_a_first_token_outside_the_grammar_can_only_end_the_answer(built, tiny_model_dir):
    _, tokenizer = built
    decode = _engine_like(built, tiny_model_dir)
    prompt = tokenizer.encode("x")
    params = SamplingParams(max_tokens=20, temperature=0.0, grammar=GRAMMAR)
    table, _ = decode.reserve(prompt, params)
    out = decode.admit_prefilled(
        "d", prompt, params, table, tokenizer.encode("hello", add_special_tokens=False)[0]
    )
    while decode.has_work():
        out += decode.step()
    assert len(out) == 2 and out[-1].token_id in decode.eos_token_ids and out[-1].finish_reason == "stop"


def test_speculation_leaves_constrained_sequences_exact(built, tiny_model_dir):
    _, tokenizer = built
    always = BackoffPolicy(min_acceptance=0.0, first_pause_steps=1)
    plain = _engine_like(built, tiny_model_dir)
    spec = _engine_like(built, tiny_model_dir, speculative=SpeculativeConfig("ngram", 4))
    assert spec.speculator is not None
    spec.speculator.policy = always
    prompt = tokenizer.encode("one two three one two three one two three one two")
    reqs = [
        (prompt, SamplingParams(max_tokens=60, temperature=0.0, grammar=GRAMMAR)),
        (prompt, SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)),  # free: it may speculate
    ]
    assert run_to_completion(spec, reqs) == run_to_completion(plain, reqs)
    assert spec.speculator.proposed_tokens > 0  # the free sequence drafted, the constrained one did not
    assert set(spec.speculator.states) <= {"r1"}


def test_min_tokens_keeps_stop_ids_and_eos_out(built):
    engine, tokenizer = built
    prompt = tokenizer.encode("Once upon a time")
    ((free, _),) = run_to_completion(
        engine, [(prompt, SamplingParams(max_tokens=8, temperature=0.0))]
    ).values()
    stop = free[0]  # the greedy first token, made a stop id
    ((ids, reason),) = run_to_completion(
        engine, [(prompt, SamplingParams(max_tokens=8, temperature=0.0, stop_token_ids=[stop]))]
    ).values()
    assert ids == [stop] and reason == "stop"
    params = SamplingParams(max_tokens=8, temperature=0.0, stop_token_ids=[stop], min_tokens=4)
    ((ids, _),) = run_to_completion(engine, [(prompt, params)]).values()
    assert len(ids) >= 4 and stop not in ids[:4] and not set(ids[:4]) & set(engine.eos_token_ids)


def test_top_logprobs_are_the_likeliest_tokens(built):
    engine, tokenizer = built
    prompt = tokenizer.encode("The quick brown fox")
    engine.add_request(
        prompt, SamplingParams(max_tokens=3, temperature=1.0, seed=1, logprobs=True, top_logprobs=5), "t"
    )
    captured: list[torch.Tensor] = []
    model_logits = engine.model.logits

    def keep(hidden):
        out = model_logits(hidden)
        captured.append(out.detach().clone())
        return out

    engine.model.logits = keep  # type: ignore[method-assign]
    try:
        outs = []
        while engine.has_work():
            outs += engine.step()
    finally:
        del engine.model.logits
    for out, logits in zip(outs, captured, strict=True):
        reference = torch.log_softmax(logits[-1], -1)
        values, ids = reference.topk(5)
        assert [t for t, _ in out.top_logprobs] == ids.tolist()
        assert [lp for _, lp in out.top_logprobs] == pytest.approx(values.tolist(), abs=1e-5)
        assert out.logprob == pytest.approx(reference[out.token_id].item(), abs=1e-5)


def test_a_grammar_llguidance_refuses_is_an_invalid_request(built):
    engine, tokenizer = built
    with pytest.raises(InvalidRequest, match="grammar"):
        engine.add_request(
            tokenizer.encode("x"), SamplingParams(grammar='{"grammars": [{"json_schema": {"type": "nope"}}]}')
        )
    assert not engine.has_work()
