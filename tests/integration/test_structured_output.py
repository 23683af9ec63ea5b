"""Structured output through a real local stack (router, prefill and decode processes, every prompt prefilled
on the prefill pool) with the official openai client: its parse helper with a pydantic model, JSON mode, tool
calls (forced, named, streamed, parsed), several choices, top_logprobs, min_tokens, and a field the server
does not implement refused by name. The tiny model's weights are random, so only the grammar makes its answers
parse."""

from __future__ import annotations

import json
from typing import Literal

import openai
import pytest
from pydantic import BaseModel, Field

from tandem.worker.hf.tokenizer import Tokenizer
from tests.integration.stacks import running_stack, spec

pytestmark = pytest.mark.slow

USER = [{"role": "user", "content": "What is the weather like today?"}]


class Weather(BaseModel):
    colour: Literal["red", "green", "blue"]
    count: int = Field(ge=0, le=99)
    ok: bool
    tags: list[Literal["a", "b"]] = Field(max_length=3)
    note: str = Field(max_length=12)


class GetWeather(BaseModel):
    city: Literal["Lisbon", "Oslo"]
    unit: Literal["C", "F"]


WEATHER_TOOL = openai.pydantic_function_tool(GetWeather, name="get_weather", description="Weather in a city")
TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "strict": True,  # the parse helper reads only strict tools
        "parameters": {
            "type": "object",
            "properties": {"zone": {"enum": ["UTC", "CET"]}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}


@pytest.fixture(scope="module")
def client(tiny_model_dir, tmp_path_factory):
    obj = spec("structured", tiny_model_dir)
    obj["spec"]["router"] = {
        "disaggregation": {"mode": "always"}
    }  # prefill samples the first token, decode the rest
    with running_stack(obj, tmp_path_factory.mktemp("structured")) as (_, url):
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_parse_helper_returns_the_pydantic_model_across_the_pools(client):
    raw = client.chat.completions.with_raw_response.parse(
        model="tiny", messages=USER, response_format=Weather, temperature=1.0, seed=7, max_tokens=200, n=3
    )
    assert raw.headers["X-Tandem-Prefill"] == "disaggregated"
    done = raw.parse()
    assert [c.index for c in done.choices] == [0, 1, 2]
    for choice in done.choices:
        assert choice.finish_reason == "stop", choice.message.content
        assert isinstance(choice.message.parsed, Weather)
        assert Weather.model_validate_json(choice.message.content or "") == choice.message.parsed
    assert len({c.message.content for c in done.choices}) > 1  # each choice its own seed


def test_json_mode_answers_one_json_object(client):
    # any JSON object: keys and nesting are the random model's, so a seed whose object ends within the budget
    done = client.chat.completions.create(
        model="tiny",
        messages=USER,
        response_format={"type": "json_object"},
        temperature=1.0,
        seed=9,
        max_tokens=300,
    )
    choice = done.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    assert (
        isinstance(json.loads(choice.message.content or ""), dict) and len(choice.message.content or "") > 2
    )


def test_without_a_grammar_the_same_request_is_not_json(client):
    done = client.chat.completions.create(model="tiny", messages=USER, temperature=1.0, seed=7, max_tokens=60)
    with pytest.raises(json.JSONDecodeError):
        Weather.model_validate(json.loads(done.choices[0].message.content or ""))


def test_required_tool_choice_answers_a_tool_call(client):
    done = client.chat.completions.create(
        model="tiny",
        messages=USER,
        tools=[WEATHER_TOOL, TIME_TOOL],
        tool_choice="required",
        temperature=1.0,
        seed=1,
        max_tokens=100,
    )
    choice = done.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    arguments = json.loads(call.function.arguments)
    if call.function.name == "get_weather":
        GetWeather.model_validate(arguments)
    else:
        assert call.function.name == "get_time" and arguments["zone"] in ("UTC", "CET")


def test_named_tool_choice_calls_that_tool_and_the_parse_helper_reads_it(client):
    done = client.chat.completions.parse(
        model="tiny",
        messages=USER,
        tools=[WEATHER_TOOL, TIME_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        temperature=1.0,
        seed=2,
        max_tokens=100,
    )
    (call,) = done.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and isinstance(call.function.parsed_arguments, GetWeather)


def test_a_streamed_tool_call_arrives_in_the_tool_calls_shape(client):
    chunks = list(
        client.chat.completions.create(
            model="tiny",
            messages=USER,
            tools=[TIME_TOOL],
            tool_choice="required",
            temperature=1.0,
            seed=4,
            max_tokens=100,
            stream=True,
        )
    )
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    calls = [tc for d in deltas for tc in d.tool_calls or []]
    assert [c.function.name for c in calls] == ["get_time"]
    assert json.loads(calls[0].function.arguments)["zone"] in ("UTC", "CET")
    assert not "".join(d.content or "" for d in deltas)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_a_tool_result_turn_is_rendered_and_answered(client):
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_time", "arguments": '{"zone": "UTC"}'},
    }
    messages = [
        *USER,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "12:00"},
    ]
    done = client.chat.completions.create(
        model="tiny", messages=messages, tools=[TIME_TOOL], max_tokens=5, temperature=0
    )
    assert done.usage.prompt_tokens > 0 and done.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_top_logprobs_list_the_alternatives(client):
    done = client.chat.completions.create(
        model="tiny", messages=USER, max_tokens=6, temperature=0, logprobs=True, top_logprobs=4
    )
    for entry in done.choices[0].logprobs.content:
        alternatives = [t.logprob for t in entry.top_logprobs]
        assert len(alternatives) == 4 and alternatives == sorted(alternatives, reverse=True)
        assert entry.logprob == pytest.approx(alternatives[0], abs=1e-4)  # greedy: the likeliest token


def test_min_tokens_holds_back_a_stop_token_on_both_pools(client, tiny_model_dir):
    """The greedy first token made a stop id ends the answer at once; min_tokens keeps it (and EOS) out of
    the first tokens, the first of them sampled on the prefill worker."""
    tokenizer = Tokenizer.from_dir(tiny_model_dir)
    one = client.completions.create(model="tiny", prompt="Once upon", max_tokens=1, temperature=0, logprobs=0)
    first = one.choices[0].logprobs.tokens[0]
    stop_ids = [
        i for i in range(tokenizer.vocab_size) if tokenizer.decode([i], skip_special_tokens=False) == first
    ]
    body = {"model": "tiny", "prompt": "Once upon", "max_tokens": 8, "temperature": 0, "logprobs": 0}
    stopped = client.completions.create(**body, extra_body={"stop_token_ids": stop_ids})
    assert stopped.usage.completion_tokens == 1 and stopped.choices[0].finish_reason == "stop"
    held = client.completions.create(**body, extra_body={"stop_token_ids": stop_ids, "min_tokens": 4})
    assert held.usage.completion_tokens >= 4 and first not in held.choices[0].logprobs.tokens[:4]


def test_a_field_the_server_does_not_implement_is_refused_by_name(client):
    with pytest.raises(openai.BadRequestError, match="frobnicate"):
        client.chat.completions.create(model="tiny", messages=USER, extra_body={"frobnicate": 1})
    with pytest.raises(openai.BadRequestError, match="logit_bias"):
        client.chat.completions.create(model="tiny", messages=USER, logit_bias={"5": 10})
