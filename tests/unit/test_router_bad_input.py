"""Bad input at the router's edge: every field range-checked (400 naming it), one served context length,
the OpenAI error shape for unknown routes, body limits (413, 408) and tokenization off the event loop."""

from __future__ import annotations

import asyncio
import threading

import pytest

from tandem import launch
from tandem.spec import InferenceServiceSpec
from tandem.worker.api.params import UINT32_MAX, UINT64_MAX, InvalidRequest, SamplingParams
from tandem.worker.api.wire import params_from_proto, params_to_proto
from tandem.worker.hf.config import served_context_length
from tandem.worker.hf.tokenizer import Tokenizer
from tandem.worker.router.app import create_app
from tandem.worker.router.limits import RequestLimits
from tests.unit.router_harness import CHAT, SERVED, ScriptedBackend, client_for, post


def completion(**fields) -> dict:
    return {"model": SERVED, "prompt": "x", **fields}


def chat(**fields) -> dict:
    return {"model": SERVED, "messages": CHAT, **fields}


BAD = [
    ("/v1/completions", completion(seed=2**64), "seed"),
    ("/v1/completions", completion(seed=-(2**63) - 1), "seed"),
    ("/v1/completions", completion(top_k=2**40), "top_k"),
    ("/v1/completions", completion(top_k=-5), "top_k"),
    ("/v1/completions", completion(stop_token_ids=[-1]), "stop_token_ids"),
    ("/v1/completions", completion(stop_token_ids=[2**32]), "stop_token_ids"),
    ("/v1/completions", completion(stop_token_ids=[10**6]), "stop_token_ids"),  # outside the vocabulary
    ("/v1/completions", completion(stop_token_ids=list(range(300))), "stop_token_ids"),
    ("/v1/completions", completion(stop=""), "stop"),
    ("/v1/completions", completion(stop=["a"] * 17), "stop"),
    ("/v1/completions", completion(stop=["x" * 2000]), "stop"),
    ("/v1/completions", completion(max_tokens=2**40), "max_tokens"),
    ("/v1/completions", completion(min_tokens=-1), "min_tokens"),
    ("/v1/completions", completion(n=0), "n"),
    ("/v1/completions", completion(logprobs=21), "logprobs"),
    ("/v1/completions", completion(logprobs=-1), "logprobs"),
    ("/v1/completions", completion(presence_penalty=3), "presence_penalty"),
    ("/v1/completions", completion(temperature=1e300), "temperature"),
    ("/v1/completions", completion(stream_options={"include_usage": True}), "stream_options"),
    ("/v1/chat/completions", chat(logprobs=True, top_logprobs=21), "top_logprobs"),
    ("/v1/chat/completions", chat(top_logprobs=1), "top_logprobs"),  # without logprobs: true
    ("/v1/chat/completions", chat(max_completion_tokens=0), "max_completion_tokens"),
    ("/v1/chat/completions", chat(top_p=1.5), "top_p"),
    ("/v1/chat/completions", chat(frequency_penalty=-7), "frequency_penalty"),
]


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("path", "body", "param"), BAD, ids=[f"{p}-{param}-{i}" for i, (p, _, param) in enumerate(BAD)]
)
async def test_out_of_range_fields_are_400_naming_the_field(tok, path, body, param):
    backend = ScriptedBackend(tok)
    r = await post(create_app(backend, tok, SERVED), path, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error" and param in err["message"]
    assert backend.calls == []


@pytest.mark.asyncio
async def test_nan_in_the_body_is_refused(tok):
    r = await post(
        create_app(ScriptedBackend(tok), tok, SERVED),
        "/v1/completions",
        b'{"model": "tiny", "prompt": "x", "temperature": NaN}',
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "temperature"


@pytest.mark.asyncio
async def test_edge_values_are_served_and_fit_the_wire(tok):
    """The extremes of every accepted range reach the backend and survive the protobuf round trip."""
    backend = ScriptedBackend(tok)
    app = create_app(backend, tok, SERVED)
    extremes = [
        completion(seed=-1, top_k=-1),
        completion(seed=2**63 - 1, top_k=UINT32_MAX, stop_token_ids=[0, tok.vocab_size - 1], logprobs=1),
        completion(seed=-(2**63), top_k=0, stop=["x" * 1024] * 16, presence_penalty=0),
        chat(logprobs=True, top_logprobs=1, temperature=100, top_p=1e-9),
    ]
    for body in extremes:
        path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
        r = await post(app, path, body)
        assert r.status_code == 200, r.text
    seeds = [params.seed for _, _, params in backend.calls]
    assert seeds == [UINT64_MAX, 2**63 - 1, 2**63, None]  # negative seeds as two's complement
    for _, _, params in backend.calls:
        back = params_from_proto(params_to_proto(params))
        assert (back.seed, back.top_k, back.stop_token_ids) == (
            params.seed,
            params.top_k,
            params.stop_token_ids,
        )


def test_sampling_params_refuse_what_the_wire_cannot_carry():
    for bad in (
        dict(seed=-1),
        dict(seed=2**64),
        dict(top_k=2**32),
        dict(max_tokens=2**32),
        dict(stop_token_ids=[-1]),
    ):
        with pytest.raises(InvalidRequest):
            SamplingParams(**bad)  # type: ignore[arg-type]
    SamplingParams(seed=UINT64_MAX, top_k=UINT32_MAX, max_tokens=UINT32_MAX, stop_token_ids=[UINT32_MAX])


# ---- one context length ----


def test_served_context_length_is_the_spec_bounded_by_the_model():
    assert served_context_length(4096, 2048) == 2048
    assert served_context_length(4096, 8192) == 4096  # never more than the model has positions for
    assert served_context_length(4096, None) == 4096


def test_router_and_workers_get_the_same_context_length():
    spec = InferenceServiceSpec.model_validate(
        {"model": {"source": {"path": "m"}, "servedName": "m", "maxContextLength": 2048}}
    )

    def flag(argv: list[str]) -> str:
        return argv[argv.index("--max-model-len") + 1]

    assert (
        flag(launch.router_argv(spec, "svc", "m"))
        == flag(launch.worker_argv(spec, "svc", "decode", "m"))
        == "2048"
    )


@pytest.mark.asyncio
async def test_prompt_plus_max_tokens_past_the_served_context_is_refused_and_models_reports_it(tok):
    app = create_app(ScriptedBackend(tok), tok, SERVED, max_model_len=64)
    prompt = list(range(10, 20))
    r = await post(app, "/v1/completions", completion(prompt=prompt, max_tokens=55))
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    assert (await post(app, "/v1/completions", completion(prompt=prompt, max_tokens=54))).status_code == 200
    async with client_for(app) as c:
        assert (await c.get("/v1/models")).json()["data"][0]["max_model_len"] == 64


# ---- the error shape everywhere ----


@pytest.mark.asyncio
async def test_unknown_path_and_wrong_method_answer_the_openai_error_shape(tok):
    async with client_for(create_app(ScriptedBackend(tok), tok, SERVED)) as c:
        missing = await c.get("/v1/nothing")
        wrong = await c.get("/v1/completions")
    assert missing.status_code == 404 and set(missing.json()["error"]) == {"message", "type", "param", "code"}
    assert wrong.status_code == 405 and wrong.json()["error"]["type"] == "invalid_request_error"
    assert "POST" in wrong.headers["allow"]


# ---- body limits ----


@pytest.mark.asyncio
async def test_a_declared_oversized_body_is_413_before_it_is_read(tok):
    backend = ScriptedBackend(tok)
    app = create_app(backend, tok, SERVED, limits=RequestLimits(max_body_bytes=1000))
    r = await post(app, "/v1/completions", completion(prompt="word " * 500))
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    assert backend.calls == []
    assert (await post(app, "/v1/completions", completion(prompt="word"))).status_code == 200


@pytest.mark.asyncio
async def test_an_undeclared_oversized_body_is_cut_off_at_the_limit(tok):
    app = create_app(ScriptedBackend(tok), tok, SERVED, limits=RequestLimits(max_body_bytes=1000))
    sent = []

    async def chunks():
        yield b'{"model": "tiny", "prompt": "'
        for _ in range(100):
            sent.append(1)
            yield b"x" * 100
        yield b'"}'

    async with client_for(app) as c:  # a streamed body carries no Content-Length
        r = await c.post("/v1/completions", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413


@pytest.mark.asyncio
async def test_a_slow_body_times_out_with_408(tok):
    app = create_app(ScriptedBackend(tok), tok, SERVED, limits=RequestLimits(body_timeout_s=0.2))

    async def trickle():
        yield b'{"model": "tiny",'
        await asyncio.sleep(5)
        yield b'"prompt": "x"}'

    async with client_for(app) as c:
        r = await asyncio.wait_for(c.post("/v1/completions", content=trickle()), timeout=4)
    assert r.status_code == 408 and r.json()["error"]["code"] == "request_timeout"
    assert app.state.admission.in_flight == 0


# ---- tokenization off the event loop ----


class RecordingTokenizer(Tokenizer):
    """The real tokenizer, noting which thread each encode ran on."""

    threads: list[int]

    def encode(self, *args, **kwargs) -> list[int]:
        self.threads.append(threading.get_ident())
        return super().encode(*args, **kwargs)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("path", "body"),
    [("/v1/completions", completion(prompt="a long prompt")), ("/v1/chat/completions", chat())],
)
async def test_prompts_are_tokenized_off_the_event_loop(tiny_model_dir, path, body):
    tok = RecordingTokenizer.from_dir(tiny_model_dir)
    tok.threads = []
    app = create_app(ScriptedBackend(tok), tok, SERVED)
    tok.threads.clear()
    r = await post(app, path, body)
    assert r.status_code == 200
    assert tok.threads and threading.get_ident() not in tok.threads


@pytest.mark.asyncio
async def test_a_body_that_is_not_json_or_not_an_object_is_400(tok):
    app = create_app(ScriptedBackend(tok), tok, SERVED)
    for raw in (b"", b"[]", b"null", b'"x"', b"\xff\xfe", b'{"model": "tiny", "prompt": "\\ud800"}'):
        r = await post(app, "/v1/completions", raw)
        assert r.status_code == 400, (raw, r.text)
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    async with client_for(app) as c:
        assert (await c.get("/health")).status_code == 200
