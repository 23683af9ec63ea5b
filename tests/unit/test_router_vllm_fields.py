"""vLLM's request extensions through the router's app: what benchmarks and frameworks send to "a vLLM
endpoint" gets the outcome docs/openai-compatibility.md gives it."""

from __future__ import annotations

import pytest

from tandem.worker.router.app import create_app
from tests.unit.router_harness import ANSWER, CHAT, SERVED, ScriptedBackend, post, sse_events

ENDPOINTS = {
    "/v1/completions": {"model": SERVED, "prompt": "Hi"},
    "/v1/chat/completions": {"model": SERVED, "messages": CHAT},
}


@pytest.mark.asyncio
@pytest.mark.parametrize("path", list(ENDPOINTS))
async def test_continuous_usage_stats_puts_the_running_usage_on_every_chunk(tok, path):
    """guidellm's stream options: every chunk carries the counts so far, and the usage chunk ends it."""
    backend = ScriptedBackend(tok)
    app = create_app(backend, tok, SERVED)
    options = {"include_usage": True, "continuous_usage_stats": True}
    r = await post(app, path, {**ENDPOINTS[path], "stream": True, "stream_options": options})
    assert r.status_code == 200, r.text
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    chunks, last = events[:-2], events[-2]
    prompt_tokens = last["usage"]["prompt_tokens"]
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == len(backend.ids)
    counts = [c["usage"]["completion_tokens"] for c in chunks]
    assert counts == sorted(counts) and counts[-1] == len(backend.ids) and len(set(counts)) > 3
    assert all(c["usage"]["prompt_tokens"] == prompt_tokens for c in chunks)
    assert all(c["usage"]["total_tokens"] == prompt_tokens + c["usage"]["completion_tokens"] for c in chunks)
    text_key = "text" if path == "/v1/completions" else "content"
    texts = [
        c["choices"][0].get(text_key) or c["choices"][0].get("delta", {}).get(text_key) or "" for c in chunks
    ]
    assert "".join(texts) == ANSWER


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("options", "usage_chunks"),
    [
        ({"continuous_usage_stats": True}, "all"),  # vLLM: include_usage unset counts as on here
        ({"include_usage": False, "continuous_usage_stats": True}, "none"),
        ({"include_usage": True, "continuous_usage_stats": False}, "last"),
    ],
)
async def test_continuous_usage_stats_follows_include_usage_as_vllm_does(tok, options, usage_chunks):
    app = create_app(ScriptedBackend(tok), tok, SERVED)
    body = {**ENDPOINTS["/v1/completions"], "stream": True, "stream_options": options}
    events = sse_events((await post(app, "/v1/completions", body)).text)[:-1]
    with_usage = [e.get("usage") is not None for e in events]
    assert (
        with_usage
        == {
            "all": [True] * len(events),
            "none": [False] * len(events),
            "last": [False] * (len(events) - 1) + [True],
        }[usage_chunks]
    )


# ---- every extension field: the outcome the table gives it ----

SHARED_PROBES: dict[str, object] = {
    "top_k": 5,
    "min_p": 0.1,
    "repetition_penalty": 1.2,
    "presence_penalty": 0.5,
    "frequency_penalty": 0.5,
    "stop_token_ids": [7],
    "include_stop_str_in_output": True,
    "ignore_eos": True,
    "min_tokens": 2,
    "skip_special_tokens": False,
    "spaces_between_special_tokens": False,
    "truncate_prompt_tokens": 2,
    "prompt_logprobs": 1,
    "allowed_token_ids": [1],
    "bad_words": ["x"],
    "guided_json": {"type": "object"},
    "guided_regex": "a+",
    "guided_choice": ["yes", "no"],
    "guided_grammar": 'start: "yes" | "no"',
    "structured_outputs": {"choice": ["a", "b"]},
    "guided_decoding_backend": "xgrammar",
    "guided_whitespace_pattern": " ",
    "priority": 1,
    "request_id": "probe-id",
    "logits_processors": ["m.f"],
    "return_tokens_as_token_ids": True,
    "kv_transfer_params": {"a": 1},
    "vllm_xargs": {"a": 1},
    "use_beam_search": True,
    "length_penalty": 0.5,
    "cache_salt": "s",
    "logit_bias": {"1": 1.0},
    "echo": True,
    "user": "u",
    "response_format": {"type": "json_object"},
}
NESTED_PROBES = {  # each beside structured_outputs.regex, the constraint they qualify
    "structured_outputs.json": {"type": "object"},
    "structured_outputs.choice": ["a"],
    "structured_outputs.grammar": 'start: "a"',
    "structured_outputs.json_object": True,
    "structured_outputs.backend": "xgrammar",
    "structured_outputs.disable_fallback": True,
    "structured_outputs.structural_tag": "x",
    "structured_outputs.whitespace_pattern": " ",
    "structured_outputs.disable_any_whitespace": True,
    "structured_outputs.disable_additional_properties": True,
}
CHAT_PROBES: dict[str, object] = {
    "add_generation_prompt": False,
    "continue_final_message": True,
    "chat_template": "{{ messages }}",
    "mm_processor_kwargs": {},
    "include_reasoning": False,
    "structural_tag": "x",
    "add_special_tokens": True,
    "parallel_tool_calls": False,
    "metadata": {"a": "b"},
}
COMPLETION_PROBES: dict[str, object] = {
    "prompt_embeds": "x",
    "suffix": "x",
    "best_of": 2,
    "add_special_tokens": False,
}
# what a probe needs set in both requests: chat's echo repeats a last assistant message
BESIDE = {
    "continue_final_message": {"add_generation_prompt": False},
    "echo": {"messages": [*CHAT, {"role": "assistant", "content": "Sure:"}]},
}
# implemented, with no effect a scripted answer shows on the tiny model's template: their own tests below
OWN_TESTS = {"documents", "chat_template_kwargs"}


def _cases():
    for path, own in (("/v1/completions", COMPLETION_PROBES), ("/v1/chat/completions", CHAT_PROBES)):
        for field, value in {**SHARED_PROBES, **own}.items():
            beside = BESIDE.get(field, {}) if path.endswith("chat/completions") or field != "echo" else {}
            yield path, field, {field: value}, beside
        for dotted, value in NESTED_PROBES.items():
            key = dotted.split(".")[1]
            beside = {} if key in ("json", "choice", "grammar", "json_object") else {"regex": "a+"}
            base = {"structured_outputs": beside} if beside else {}
            yield path, dotted, {"structured_outputs": {**beside, key: value}}, base


async def _seen(app, backend, path: str, body: dict):
    """What a request made the router do: its status, the error's param, what the backend was sent (prompt
    ids, sampling parameters), the answer's id kind and its text."""
    before = len(backend.calls)
    r = await post(app, path, body)
    if r.status_code != 200:
        return r.status_code, r.json()["error"]["param"], None
    _, prompt_ids, params = backend.calls[before]
    choice = r.json()["choices"][0]
    text = choice["text"] if "text" in choice else choice["message"]["content"]
    return 200, None, (prompt_ids, params, r.json()["id"].endswith("-probe-id"), text)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("path", "field", "set_", "beside"), list(_cases()), ids=lambda v: v if isinstance(v, str) else ""
)
async def test_each_extension_field_has_its_documented_outcome(tok, path, field, set_, beside):
    """Refused: a 400 naming the field. No effect: exactly what the request without it does. Implemented:
    something the workers are sent (or the answer's id) changes."""
    from tandem.worker.router import openai_fields

    backend = ScriptedBackend(tok)
    app = create_app(backend, tok, SERVED)
    base = {**ENDPOINTS[path], **beside}
    status, param, seen = await _seen(app, backend, path, {**base, **set_})
    outcome = openai_fields.outcome(field)
    if outcome == openai_fields.REFUSED:
        assert (status, param) == (400, field)
        return
    assert status == 200, param
    _, _, baseline = await _seen(app, backend, path, base)
    if outcome == openai_fields.NO_OP:
        assert seen == baseline
    else:
        assert seen != baseline


def test_every_extension_field_is_probed():
    from tandem.worker.router.openai_vllm import (
        StructuredOutputs,
        VllmChatExtensions,
        VllmCompletionExtensions,
        VllmSamplingExtensions,
    )

    probed = set(SHARED_PROBES) | set(CHAT_PROBES) | set(COMPLETION_PROBES) | OWN_TESTS
    models = (VllmSamplingExtensions, VllmChatExtensions, VllmCompletionExtensions)
    assert {n for m in models for n in m.model_fields} - probed == set()
    nested = {f"structured_outputs.{f.alias or n}" for n, f in StructuredOutputs.model_fields.items()}
    assert nested - set(NESTED_PROBES) == {"structured_outputs.regex"}  # the one the others stand beside


# ---- what the implemented ones do ----


@pytest.mark.asyncio
async def test_documents_and_chat_template_kwargs_reach_the_template(tok):
    import copy

    from tandem.worker.hf.tokenizer import compile_chat_template

    templated = copy.copy(tok)
    templated._template = compile_chat_template(
        "{% for d in documents or [] %}[{{ d.title }}]{% endfor %}{% if thinking %}<think>{% endif %}"
        "{% for m in messages %}{{ m.content }}{% endfor %}"
    )
    backend = ScriptedBackend(tok)
    app = create_app(backend, templated, SERVED)
    body = {
        **ENDPOINTS["/v1/chat/completions"],
        "documents": [{"title": "Doc", "text": "x"}],
        "chat_template_kwargs": {"thinking": True, "messages": "cannot replace the messages"},
    }
    assert (await post(app, "/v1/chat/completions", body)).status_code == 200
    assert tok.decode(backend.calls[0][1]) == "[Doc]<think>Be brief.Say hello"


@pytest.mark.asyncio
async def test_continue_final_message_leaves_the_last_message_open(tok):
    backend = ScriptedBackend(tok)
    app = create_app(backend, tok, SERVED)
    messages = [*CHAT, {"role": "assistant", "content": "Hello, I am"}]
    body = {
        "model": SERVED,
        "messages": messages,
        "add_generation_prompt": False,
        "continue_final_message": True,
    }
    assert (await post(app, "/v1/chat/completions", body)).status_code == 200
    assert tok.decode(backend.calls[0][1], skip_special_tokens=False).endswith("Hello, I am")


@pytest.mark.asyncio
async def test_text_options_shape_the_answer(tok):
    backend = ScriptedBackend(tok)
    app = create_app(backend, tok, SERVED)
    base = {**ENDPOINTS["/v1/completions"], "stop": [" here."]}
    plain = (await post(app, "/v1/completions", base)).json()["choices"][0]["text"]
    kept = (await post(app, "/v1/completions", {**base, "include_stop_str_in_output": True})).json()
    assert plain == "Hello world, stop" and kept["choices"][0]["text"] == "Hello world, stop here."
    ids = (
        await post(app, "/v1/completions", {**base, "logprobs": 0, "return_tokens_as_token_ids": True})
    ).json()
    assert ids["choices"][0]["logprobs"]["tokens"][:2] == [f"token_id:{t}" for t in backend.ids[:2]]
    long_prompt = {**ENDPOINTS["/v1/completions"], "prompt": [5, 6, 7, 8, 9], "truncate_prompt_tokens": 2}
    assert (await post(app, "/v1/completions", long_prompt)).status_code == 200
    assert backend.calls[-1][1] == [8, 9]


@pytest.mark.asyncio
async def test_two_output_constraints_are_refused_naming_the_second(tok):
    app = create_app(ScriptedBackend(tok), tok, SERVED)
    body = {
        **ENDPOINTS["/v1/chat/completions"],
        "guided_regex": "a+",
        "response_format": {"type": "json_object"},
    }
    r = await post(app, "/v1/chat/completions", body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format"
    bad = {**ENDPOINTS["/v1/completions"], "guided_regex": "(unclosed"}
    r = await post(app, "/v1/completions", bad)
    assert r.status_code == 400 and r.json()["error"]["param"] == "guided_regex"


@pytest.mark.asyncio
@pytest.mark.parametrize("stream", [False, True])
async def test_echo_puts_the_prompt_before_the_answer(tok, stream):
    app = create_app(ScriptedBackend(tok), tok, SERVED)
    ids_prompt = tok.encode("Once upon a time", add_special_tokens=False)
    for prompt, echoed in (("Once upon a time", "Once upon a time"), (ids_prompt, "Once upon a time")):
        r = await post(
            app, "/v1/completions", {"model": SERVED, "prompt": prompt, "echo": True, "stream": stream}
        )
        if stream:
            chunks = sse_events(r.text)[:-1]
            assert chunks[0]["choices"][0]["text"] == echoed
            text = "".join(c["choices"][0]["text"] for c in chunks)
        else:
            text = r.json()["choices"][0]["text"]
        assert text == echoed + ANSWER
    chat = {
        "model": SERVED,
        "messages": [*CHAT, {"role": "assistant", "content": "Sure:"}],
        "echo": True,
        "add_generation_prompt": False,
        "continue_final_message": True,
        "stream": stream,
    }
    r = await post(app, "/v1/chat/completions", chat)
    if stream:
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in sse_events(r.text)[:-1])
    else:
        text = r.json()["choices"][0]["message"]["content"]
    assert text == "Sure:" + ANSWER


@pytest.mark.asyncio
async def test_echo_with_logprobs_scores_the_prompt_first_as_evaluation_harnesses_read_it(tok):
    """lm-eval-harness's log-likelihood request: echo, logprobs, the prompt's tokens scored before the
    answer's."""
    backend = ScriptedBackend(tok, "Hello world")
    app = create_app(backend, tok, SERVED)
    prompt_ids = tok.encode("Once upon a time")
    body = {"model": SERVED, "prompt": "Once upon a time", "echo": True, "logprobs": 1, "max_tokens": 2}
    choice = (await post(app, "/v1/completions", body)).json()["choices"][0]
    lp = choice["logprobs"]
    assert choice["text"] == "Once upon a time" + "Hello world"
    assert backend.calls[0][2].prompt_logprobs == 1  # the workers were asked to score the prompt
    assert lp["tokens"] == [tok.decode([t], skip_special_tokens=False) for t in prompt_ids] + [
        "Hello",
        " world",
    ]
    n = len(prompt_ids)
    assert lp["token_logprobs"] == pytest.approx([None] + [-0.01 * p for p in range(1, n)] + [-0.1, -0.2])
    assert (
        lp["top_logprobs"][0] is None and len(lp["top_logprobs"][1]) == 1 + 1
    )  # one alternative, and the token
    assert lp["text_offset"] == sorted(lp["text_offset"]) and lp["text_offset"][0] == 0
    r = await post(app, "/v1/completions", {**body, "stream": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "echo"


@pytest.mark.asyncio
@pytest.mark.parametrize("path", list(ENDPOINTS))
async def test_prompt_logprobs_in_vllms_shape(tok, path):
    backend = ScriptedBackend(tok)
    app = create_app(backend, tok, SERVED)
    body = (await post(app, path, {**ENDPOINTS[path], "prompt_logprobs": 2, "max_tokens": 3})).json()
    prompt_ids = backend.calls[0][1]
    scores = body["choices"][0]["prompt_logprobs"] if path == "/v1/completions" else body["prompt_logprobs"]
    assert len(scores) == len(prompt_ids) and scores[0] is None
    for p, entry in enumerate(scores[1:], 1):
        mine = entry[str(prompt_ids[p])]
        assert mine["logprob"] == pytest.approx(-0.01 * p)
        assert mine["decoded_token"] == tok.decode([prompt_ids[p]], skip_special_tokens=False)
        assert entry["3"]["rank"] == (1 if prompt_ids[p] != 3 else 2)  # the harness's likeliest is token 3
    r = await post(app, path, {**ENDPOINTS[path], "prompt_logprobs": 1, "stream": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt_logprobs"
