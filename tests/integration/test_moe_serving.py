"""Mixture-of-experts models through the local stack (`tandem up`): prefill and decode pools with the KV
pushed between them give the tokens of a colocated worker, for Mixtral and Qwen2-MoE tiny checkpoints."""

from __future__ import annotations

import httpx
import pytest

from tandem.worker.devtools.tiny import TinySpec, create_tiny_model
from tests.integration.stacks import running_stack, spec

pytestmark = pytest.mark.slow

SHAPE = dict(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=96, experts=4, experts_per_token=2)


@pytest.fixture(scope="module", params=["mixtral", "qwen2_moe"])
def stacks(request, tmp_path_factory):
    model_dir = create_tiny_model(tmp_path_factory.mktemp(request.param), TinySpec(arch=request.param, **SHAPE))
    logs = tmp_path_factory.mktemp(f"{request.param}-logs")
    disagg = spec(f"moe-d-{request.param}".replace("_", "-"), model_dir, prefillChunkTokens=32)
    colo = spec(f"moe-c-{request.param}".replace("_", "-"), model_dir, mode="colocated", prefillChunkTokens=32)
    with running_stack(disagg, logs / "d") as d, running_stack(colo, logs / "c") as c:
        yield d[1], c[1]


def _greedy(url: str, prompt: str, n: int = 24) -> list[str]:
    r = httpx.post(
        f"{url}/v1/completions",
        json={"model": "tiny", "prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True, "logprobs": 1},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == n
    return r.json()["choices"][0]["logprobs"]["tokens"]


def test_moe_disaggregated_equals_colocated_token_for_token(stacks):
    disagg, colocated = stacks
    long_prompt = " ".join(f"word{i}" for i in range(90))  # several 32-token chunks and 16-token blocks
    for prompt in ["Hello", long_prompt, "The quick brown fox jumps over the lazy dog."]:
        assert _greedy(disagg, prompt) == _greedy(colocated, prompt), prompt[:40]
