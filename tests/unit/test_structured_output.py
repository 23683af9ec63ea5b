"""The router's side of structured output and the OpenAI request surface: every field declared (an unknown one
is a 400 naming it), response_format and tool_choice turned into grammars the workers receive, tool calls
read back in the OpenAI shape (whole and streamed), n choices, and the tiny model's chat template rendering
tools and tool turns exactly as transformers does."""

from __future__ import annotations

import json

import pytest

from tandem.worker.router.app import create_app
from tandem.worker.router.openai_schema import ChatCompletionRequest, CompletionRequest
from tandem.worker.router.structured import (
    ToolCall,
    may_be_tool_call,
    parse_tool_calls,
    response_format_grammar,
    tool_call_schema,
)
from tests.unit.router_harness import CHAT, SERVED, ScriptedBackend, post, sse_events

TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The time in a zone",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"enum": ["UTC", "CET"]}},
            "required": ["zone"],
        },
    },
}
CALL_TEXT = '{"name": "get_time", "arguments": {"zone": "UTC"}}'


def chat(**fields) -> dict:
    return {"model": SERVED, "messages": CHAT, **fields}


# --- every field is implemented or refused by name ------------------------------------------------------
@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", chat(frobnicate=1), "frobnicate"),
        ("/v1/chat/completions", chat(stream_options={"include_usage": True, "x": 1}), "stream_options"),
        (
            "/v1/chat/completions",
            {**chat(), "messages": [{"role": "user", "content": "x", "extra": 1}]},
            "messages",
        ),
        ("/v1/completions", {"model": SERVED, "prompt": "x", "unknown_knob": True}, "unknown_knob"),
        ("/v1/chat/completions", chat(logit_bias={"5": 10}), "logit_bias"),
        ("/v1/chat/completions", chat(store=True), "store"),
        ("/v1/chat/completions", chat(service_tier="priority"), "service_tier"),
        ("/v1/chat/completions", chat(modalities=["text", "audio"]), "modalities"),
        ("/v1/chat/completions", chat(reasoning_effort="high"), "reasoning_effort"),
        ("/v1/chat/completions", chat(prediction={"type": "content", "content": "x"}), "prediction"),
        ("/v1/chat/completions", chat(functions=[{"name": "f"}]), "functions"),
        ("/v1/chat/completions", chat(web_search_options={}), "web_search_options"),
        ("/v1/completions", {"model": SERVED, "prompt": "x", "suffix": "end"}, "suffix"),
        ("/v1/completions", {"model": SERVED, "prompt": "x", "best_of": 3}, "best_of"),
        ("/v1/chat/completions", chat(tool_choice="required"), "tool_choice"),  # no tools
        (
            "/v1/chat/completions",
            chat(tools=[TIME_TOOL], tool_choice={"type": "function", "function": {"name": "nope"}}),
            "tool_choice",
        ),
        ("/v1/chat/completions", chat(response_format={"type": "json_schema"}), "response_format"),
        (
            "/v1/chat/completions",
            chat(
                response_format={
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "nope"}},
                }
            ),
            "response_format.json_schema.schema",
        ),
        (
            "/v1/chat/completions",
            chat(response_format={"type": "json_object"}, ignore_eos=True),
            "ignore_eos",
        ),
        ("/v1/chat/completions", chat(min_tokens=9, max_tokens=3), "min_tokens"),
    ],
)
async def test_unimplemented_or_unknown_fields_are_400_naming_them(tok, path, body, param):  # noqa: F811
    backend = ScriptedBackend(tok)
    r = await post(create_app(backend, tok, SERVED), path, body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and param.split(".")[0] in r.json()["error"]["message"]
    assert backend.calls == []


def test_every_field_a_request_model_declares_is_forbidden_to_be_unknown():
    """No model of the request (nor of a nested part) ignores extra fields."""
    seen, todo = set(), [ChatCompletionRequest, CompletionRequest]
    while todo:
        model = todo.pop()
        if model in seen:
            continue
        seen.add(model)
        assert model.model_config.get("extra") == "forbid", model.__name__
        for field in model.model_fields.values():
            for arg in _types_in(field.annotation):
                if isinstance(arg, type) and hasattr(arg, "model_fields"):
                    todo.append(arg)
    assert len(seen) >= 10


def _types_in(annotation) -> list:
    args = getattr(annotation, "__args__", ())
    return [annotation, *[t for a in args for t in _types_in(a)]]


@pytest.mark.asyncio
async def test_no_op_values_of_unimplemented_fields_are_accepted(tok):  # noqa: F811
    backend = ScriptedBackend(tok)
    body = chat(
        store=False,
        service_tier="auto",
        modalities=["text"],
        user="u1",
        metadata={"k": "v"},
        parallel_tool_calls=False,
        safety_identifier="s",
        prompt_cache_key="p",
    )
    r = await post(create_app(backend, tok, SERVED), "/v1/chat/completions", body)
    assert r.status_code == 200, r.text


# --- grammars the workers receive -------------------------------------------------------------------------
@pytest.mark.asyncio
async def test_response_format_and_forced_tools_send_a_grammar_and_free_text_none(tok):  # noqa: F811
    backend = ScriptedBackend(tok)
    app = create_app(backend, tok, SERVED)
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    bodies = [
        chat(),
        chat(response_format={"type": "text"}),
        chat(response_format={"type": "json_object"}),
        chat(
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "a", "schema": schema, "strict": True},
            }
        ),
        chat(tools=[TIME_TOOL]),  # auto: the model may answer in text
        chat(tools=[TIME_TOOL], tool_choice="required"),
        chat(tools=[TIME_TOOL], tool_choice={"type": "function", "function": {"name": "get_time"}}),
        chat(min_tokens=3, logprobs=True, top_logprobs=5),
    ]
    for body in bodies:
        assert (await post(app, "/v1/chat/completions", body)).status_code == 200
    grammars = [params.grammar for _, _, params in backend.calls]
    assert grammars[:2] == [None, None] and grammars[4] is None and grammars[7] is None
    assert all(grammars[i] for i in (2, 3, 5, 6))

    def schema_of(grammar: str) -> dict:
        sent = json.loads(grammar)["grammars"][0]["json_schema"]
        assert sent.pop("x-guidance")["whitespace_flexible"] is False  # compact JSON, no runs of spaces
        return sent

    assert schema_of(grammars[3]) == schema
    assert schema_of(grammars[5]) == tool_call_schema([TIME_TOOL])
    last = backend.calls[-1][2]
    assert (last.min_tokens, last.top_logprobs, last.logprobs) == (3, 5, True)


def test_tool_call_schema_forces_name_and_arguments():
    one = tool_call_schema([TIME_TOOL])
    assert one["properties"]["name"] == {"const": "get_time"}
    assert one["properties"]["arguments"] == TIME_TOOL["function"]["parameters"]
    other = {"type": "function", "function": {"name": "ping"}}
    both = tool_call_schema([TIME_TOOL, other])
    assert [s["properties"]["name"]["const"] for s in both["anyOf"]] == ["get_time", "ping"]
    assert both["anyOf"][1]["properties"]["arguments"] == {"type": "object", "properties": {}}


def test_response_format_grammar_refuses_what_llguidance_cannot_enforce():
    from tandem.worker.router.openai_schema import ApiError

    assert response_format_grammar(None) is None and response_format_grammar({"type": "text"}) is None
    with pytest.raises(ApiError) as e:
        response_format_grammar(
            {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}
        )
    assert e.value.status == 400 and e.value.param == "response_format.json_schema.schema"


# --- tool calls read back --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "names"),
    [
        (CALL_TEXT, ["get_time"]),
        (f"  {CALL_TEXT}\n", ["get_time"]),
        (f"[{CALL_TEXT}, {CALL_TEXT}]", ["get_time", "get_time"]),
        (f"<tool_call>{CALL_TEXT}</tool_call>", ["get_time"]),
        ('{"name": "get_time", "parameters": {"zone": "CET"}}', ["get_time"]),
        ('{"name": "other", "arguments": {}}', None),  # not one of the tools
        ('{"name": "get_time", "arguments": "UTC"}', None),
        ("It is noon.", None),
        ('{"name": "get_time", "arguments": {', None),  # cut short
    ],
)
def test_parse_tool_calls(text, names):
    calls = parse_tool_calls(text, [TIME_TOOL])
    assert (None if calls is None else [c.name for c in calls]) == names
    if calls:
        assert all(isinstance(json.loads(c.arguments), dict) and c.id.startswith("call_") for c in calls)


def test_may_be_tool_call_holds_only_what_could_become_one():
    assert (
        may_be_tool_call("")
        and may_be_tool_call("  ")
        and may_be_tool_call(" {")
        and may_be_tool_call("<tool")
    )
    assert may_be_tool_call("<tool_call>{") and may_be_tool_call("[")
    assert not may_be_tool_call("It") and not may_be_tool_call("<b>") and not may_be_tool_call(" x{")


def test_tool_call_openai_shape():
    call = ToolCall("get_time", '{"zone": "UTC"}', id="call_1")
    assert call.as_openai() == {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_time", "arguments": '{"zone": "UTC"}'},
    }
    assert call.as_openai(index=2)["index"] == 2


@pytest.mark.asyncio
@pytest.mark.parametrize("tool_choice", ["required", "auto"])
async def test_a_tool_call_answer_in_the_openai_shape_whole_and_streamed(tok, tool_choice):  # noqa: F811
    backend = ScriptedBackend(tok, CALL_TEXT)
    app = create_app(backend, tok, SERVED)
    r = await post(app, "/v1/chat/completions", chat(tools=[TIME_TOOL], tool_choice=tool_choice))
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["function"] == {"name": "get_time", "arguments": '{"zone": "UTC"}'}
    r = await post(app, "/v1/chat/completions", chat(tools=[TIME_TOOL], tool_choice=tool_choice, stream=True))
    events = [e for e in sse_events(r.text) if isinstance(e, dict)]
    deltas = [e["choices"][0]["delta"] for e in events]
    assert not "".join(d.get("content") or "" for d in deltas)  # nothing of the call leaked as text
    calls = [c for d in deltas for c in d.get("tool_calls", [])]
    assert [(c["index"], c["function"]["name"]) for c in calls] == [(0, "get_time")]
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"


@pytest.mark.asyncio
async def test_with_tools_offered_plain_text_still_streams_as_content(tok):  # noqa: F811
    backend = ScriptedBackend(tok)
    r = await post(
        create_app(backend, tok, SERVED), "/v1/chat/completions", chat(tools=[TIME_TOOL], stream=True)
    )
    events = [e for e in sse_events(r.text) if isinstance(e, dict)]
    content = [e["choices"][0]["delta"].get("content") for e in events]
    assert "".join(c or "" for c in content) == "Hello world, stop here. END now"
    assert len([c for c in content if c]) > 2  # released as it came, once it could no longer be a call
    assert events[-1]["choices"][0]["finish_reason"] == "stop"


# --- n choices -------------------------------------------------------------------------------------------
@pytest.mark.asyncio
@pytest.mark.parametrize("stream", [False, True])
async def test_n_choices_are_n_generations_with_their_own_seeds(tok, stream):  # noqa: F811
    backend = ScriptedBackend(tok)
    r = await post(
        create_app(backend, tok, SERVED),
        "/v1/chat/completions",
        chat(n=3, seed=10, stream=stream, stream_options={"include_usage": True} if stream else None),
    )
    assert r.status_code == 200, r.text
    assert sorted(p.seed for _, _, p in backend.calls) == [10, 11, 12]
    assert len({rid for rid, _, _ in backend.calls}) == 3
    if stream:
        events = [e for e in sse_events(r.text) if isinstance(e, dict)]
        text = {i: "" for i in range(3)}
        for e in events:
            for c in e["choices"]:
                text[c["index"]] += c["delta"].get("content") or ""
        assert set(text.values()) == {"Hello world, stop here. END now"}
        usage = events[-1]["usage"]
    else:
        body = r.json()
        assert [c["index"] for c in body["choices"]] == [0, 1, 2]
        usage = body["usage"]
    assert usage["completion_tokens"] == 3 * len(backend.ids) and usage["prompt_tokens"] == len(
        backend.calls[0][1]
    )


# --- the chat template with tools, against transformers --------------------------------------------------
def test_tools_and_tool_turns_render_as_transformers_renders_them(tok, tiny_model_dir):  # noqa: F811
    import transformers

    hf = transformers.AutoTokenizer.from_pretrained(str(tiny_model_dir))
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_time", "arguments": '{"zone": "UTC"}'},
    }
    messages = [
        {"role": "user", "content": "What time is it?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "12:00"},
    ]
    ours = tok.apply_chat_template(messages, tools=[TIME_TOOL])
    assert ours == hf.apply_chat_template(
        messages, tools=[TIME_TOOL], tokenize=False, add_generation_prompt=True
    )
    assert tok.encode_chat(messages, tools=[TIME_TOOL]) == list(
        hf.apply_chat_template(messages, tools=[TIME_TOOL], add_generation_prompt=True, return_dict=False)
    )
    assert json.dumps(TIME_TOOL) in ours and CALL_TEXT in ours and "<|tool|>\n12:00" in ours
    assert tok.apply_chat_template(messages[:1]) == hf.apply_chat_template(
        messages[:1], tokenize=False, add_generation_prompt=True
    )
    assert "Tools:" not in tok.apply_chat_template(messages[:1])  # no tools: the prompt is as before
