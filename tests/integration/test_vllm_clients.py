"""What clients of a vLLM server send, through a real local stack (router, prefill and decode processes, every
prompt prefilled on the prefill pool, so the first token is sampled there and the rest on the decode worker):
guidellm's exact request bodies (streamed, continuous usage), and vLLM's sampling knobs through the official
openai client's extra_body, their tokens checked against the engine run in process with the same parameters.

guidellm is not a test dependency (its 0.8.1 release pulls 33 packages, datasets, pandas, pyarrow and sanic
among them, and downgrades click and multidict): its own `guidellm run` runs in an environment of its own
through `uv tool run` (uv installs this project in CI), and its request bodies are also replayed as it builds
them (guidellm/backends/openai/request_handlers.py), so a refusal shows the field it names."""

from __future__ import annotations

import json
import shutil
import subprocess

import httpx
import openai
import pytest

from tandem.worker.api.params import SamplingParams
from tandem.worker.engine.loading import load_model
from tandem.worker.engine.runner.engine import Engine, EngineConfig
from tandem.worker.hf.tokenizer import Tokenizer
from tests.engine_runs import run_to_completion
from tests.integration.stacks import running_stack, spec

pytestmark = pytest.mark.slow

OUTPUT_TOKENS = 12
GUIDELLM_VERSION = "0.8.1"
GUIDELLM_REQUESTS = 8
PROMPT = "The quick brown fox jumps over the lazy dog and then"
# guidellm 0.8.1's bodies for a synthetic request of OUTPUT_TOKENS output tokens, streamed
GUIDELLM_STREAM = {"stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
GUIDELLM = {
    "/v1/completions": {
        "model": "tiny",
        **GUIDELLM_STREAM,
        "max_tokens": OUTPUT_TOKENS,
        "stop": None,
        "ignore_eos": True,
        "prompt": PROMPT,
    },
    "/v1/chat/completions": {
        "model": "tiny",
        **GUIDELLM_STREAM,
        "max_completion_tokens": OUTPUT_TOKENS,
        "stop": None,
        "ignore_eos": True,
        "messages": [{"role": "user", "content": [{"type": "text", "text": PROMPT}]}],
    },
}


@pytest.fixture(scope="module")
def stack(tiny_model_dir, tmp_path_factory):
    obj = spec("vllm-clients", tiny_model_dir)
    obj["spec"]["router"] = {"disaggregation": {"mode": "always"}}
    with running_stack(obj, tmp_path_factory.mktemp("vllm-clients")) as (_, url):
        yield url


@pytest.fixture(scope="module")
def client(stack):
    return openai.OpenAI(base_url=f"{stack}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.mark.parametrize("path", list(GUIDELLM))
def test_guidellm_bodies_stream_with_the_running_usage_on_every_chunk(stack, path):
    with httpx.stream("POST", f"{stack}{path}", json=GUIDELLM[path], timeout=120) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["X-Tandem-Prefill"] == "disaggregated"
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    counts = [c["usage"]["completion_tokens"] for c in chunks]
    assert counts == sorted(counts) and counts[-1] == OUTPUT_TOKENS  # ignore_eos: every token asked for
    assert chunks[-1]["choices"] == [] and len(set(counts)) > OUTPUT_TOKENS // 2  # counted as the tokens came
    assert all(
        c["usage"]["total_tokens"] == c["usage"]["prompt_tokens"] + n
        for c, n in zip(chunks, counts, strict=True)
    )


@pytest.fixture(scope="module")
def engine_tokens(tiny_model_dir):
    """The tokens the engine, run in process, gives a prompt with these sampling parameters."""
    model = load_model(tiny_model_dir)

    def run(prompt_ids: list[int], **params) -> list[int]:
        engine = Engine(model, EngineConfig(block_size=16, num_kv_blocks=64))
        sampling = SamplingParams(max_tokens=OUTPUT_TOKENS, temperature=0.0, ignore_eos=True, **params)
        return run_to_completion(engine, [(prompt_ids, sampling)])["r0"][0]

    return run


def stack_tokens(client, prompt_ids: list[int], **extra) -> list[int]:
    """The token ids the stack answers, read from its logprobs (return_tokens_as_token_ids)."""
    done = client.completions.create(
        model="tiny",
        prompt=prompt_ids,
        max_tokens=OUTPUT_TOKENS,
        temperature=extra.pop("temperature", 0),
        logprobs=0,
        extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True, **extra},
    )
    return [int(t.removeprefix("token_id:")) for t in done.choices[0].logprobs.tokens]


@pytest.mark.parametrize(
    "knobs",
    [
        {"repetition_penalty": 1.5},
        {"repetition_penalty": 0.6, "frequency_penalty": 1.0},
        {"presence_penalty": 2.0},
    ],
    ids=lambda k: "+".join(k),
)
def test_penalties_run_on_both_pools_as_the_engine_runs_them(client, engine_tokens, tiny_model_dir, knobs):
    prompt_ids = Tokenizer.from_dir(tiny_model_dir).encode(PROMPT)
    penalized = stack_tokens(client, prompt_ids, **knobs)
    assert penalized == engine_tokens(prompt_ids, **knobs)
    assert penalized != stack_tokens(client, prompt_ids)  # the knobs changed the answer


def test_min_p_one_keeps_only_the_likeliest_token_on_both_pools(client, tiny_model_dir):
    """min_p 1 drops every token less likely than the likeliest: sampling at temperature 1 is greedy."""
    prompt_ids = Tokenizer.from_dir(tiny_model_dir).encode(PROMPT)
    assert stack_tokens(client, prompt_ids, temperature=1.0, min_p=1.0, seed=3) == stack_tokens(
        client, prompt_ids
    )
    assert stack_tokens(client, prompt_ids, temperature=1.0, seed=3) != stack_tokens(client, prompt_ids)


def test_langchain_extra_body_fields_are_accepted(client):
    """What LangChain's ChatOpenAI sends for a vLLM server's knobs through extra_body."""
    done = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=4,
        extra_body={"repetition_penalty": 1.1, "skip_special_tokens": True, "top_k": 20, "min_p": 0.05},
    )
    assert done.choices[0].finish_reason in ("stop", "length") and done.usage.completion_tokens >= 1


def test_echo_with_logprobs_scores_the_prompt_as_transformers_does(client, tiny_model_dir):
    """lm-eval-harness's log-likelihood request (echo, logprobs, one token) on the disaggregated stack: the
    prompt runs where it is answered, and its tokens' logprobs are transformers' on the same checkpoint."""
    import torch
    from transformers import AutoModelForCausalLM

    prompt_ids = Tokenizer.from_dir(tiny_model_dir).encode(PROMPT)
    raw = client.completions.with_raw_response.create(
        model="tiny", prompt=prompt_ids, echo=True, logprobs=1, max_tokens=1, temperature=0
    )
    assert raw.headers["X-Tandem-Prefill"] == "local"  # scored where it is answered: no KV transfer
    scored = raw.parse().choices[0].logprobs.token_logprobs[: len(prompt_ids)]
    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([prompt_ids])).logits[0], dim=-1)
    assert scored[0] is None
    assert scored[1:] == pytest.approx(
        [float(ref[p - 1, t]) for p, t in enumerate(prompt_ids[1:], 1)], abs=1e-3
    )
    chat = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=1,
        extra_body={"prompt_logprobs": 2},
    )
    scores = chat.model_extra["prompt_logprobs"]
    assert scores[0] is None and all(len(s) in (2, 3) for s in scores[1:])  # two alternatives, and the token


@pytest.mark.skipif(
    shutil.which("uv") is None, reason="guidellm runs in its own environment through uv, not on PATH"
)
@pytest.mark.parametrize("path", list(GUIDELLM))
def test_guidellm_benchmarks_the_stack_with_no_failed_request(stack, tiny_model_dir, tmp_path, path):
    out = tmp_path / "guidellm.json"
    cmd = [
        "uv",
        "tool",
        "run",
        "--from",
        f"guidellm=={GUIDELLM_VERSION}",
        "guidellm",
        "run",
        "--backend",
        f"kind=openai_http,target={stack},model=tiny,request_format={path}",
        "--profile",
        "kind=synchronous",
        "--constraint",
        f"kind=max_requests,count={GUIDELLM_REQUESTS}",
        "--data",
        f"kind=synthetic_text,prompt_tokens=32,output_tokens={OUTPUT_TOKENS}",
        "--tokenizer",
        f"kind=hf_auto,model={tiny_model_dir}",
        "--output",
        f"kind=json,path={out}",
        "--disable-console",
    ]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    (benchmark,) = json.loads(out.read_text())["benchmarks"]
    totals = benchmark["metrics"]["request_totals"]
    assert totals == {
        "successful": GUIDELLM_REQUESTS,
        "errored": 0,
        "incomplete": 0,
        "total": GUIDELLM_REQUESTS,
    }
    assert benchmark["metrics"]["time_to_first_token_ms"]["successful"]["count"] == GUIDELLM_REQUESTS
