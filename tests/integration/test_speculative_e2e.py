"""`tandem up` with engine.speculative on (n-gram, and the model's own first layers as the draft): the same
greedy text as with it off, through the router, the prefill worker and the KV transfer, and the decode
worker's metrics show drafts accepted."""

from __future__ import annotations

import json

import httpx
import pytest

from tandem import names
from tests.integration.stacks import running_stack, spec

pytestmark = pytest.mark.slow


def _greedy(url: str, prompt: str, n: int = 40) -> tuple[str, int, str]:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True}
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    return choice["text"], r.json()["usage"]["completion_tokens"], choice["finish_reason"]


def _stream(url: str, prompt: str, n: int) -> str:
    body = {
        "model": "tiny",
        "prompt": prompt,
        "max_tokens": n,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    text = []
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                text.append(json.loads(line[6:])["choices"][0]["text"])
    return "".join(text)


def _decode_counter(stack, name: str) -> float:
    (decode,) = [p for p in stack.plans if p.role == "decode"]
    host = decode.address.rsplit(":", 1)[0]
    body = httpx.get(f"http://{host}:{decode.metrics_port}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in body.splitlines() if line.startswith(name + "{"))


PROMPTS = ["Hello", "one two three one two three one two three one two", "The quick brown fox " * 8]


@pytest.fixture(scope="module")
def plain_answers(tiny_model_dir, tmp_path_factory):
    with running_stack(spec("plain", tiny_model_dir), tmp_path_factory.mktemp("plain")) as (_, url):
        return [_greedy(url, p) for p in PROMPTS] + [_stream(url, PROMPTS[1], 30)]


@pytest.mark.parametrize(
    "speculative",
    [
        {"method": "ngram", "numTokens": 4},
        # the first 2 of the tiny model's 4 layers draft, over the KV the prefill worker sent
        {"method": "draft", "numTokens": 3, "draftModel": {"layers": 2}},
    ],
    ids=["ngram", "draft"],
)
def test_speculation_on_gives_the_same_greedy_text_as_off(
    tiny_model_dir, tmp_path, plain_answers, speculative
):
    prompts, want = PROMPTS, plain_answers
    on = spec("spec", tiny_model_dir, speculative=speculative)
    with running_stack(on, tmp_path / "spec") as (stack, url):
        got = [_greedy(url, p) for p in prompts] + [_stream(url, prompts[1], 30)]
        accepted = _decode_counter(stack, names.SPEC_ACCEPTED_TOKENS_TOTAL)
        proposed = _decode_counter(stack, names.SPEC_PROPOSED_TOKENS_TOTAL)
    assert got == want
    assert all(n == 40 and reason == "length" for _, n, reason in got[:3])
    assert 0 <= accepted <= proposed and proposed > 0
    if (
        speculative["method"] == "ngram"
    ):  # the random model's first layers seldom predict its last: only drafted
        assert accepted > 0
