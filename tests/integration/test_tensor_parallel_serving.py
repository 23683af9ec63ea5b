"""Tensor parallelism through the local stack (`tandem up`): prefill and decode pools of two ranks each
(`resources.gpus: 2`; on the CPU, two gloo processes per worker) with the KV pushed between them give the
tokens of a one-rank colocated worker, for a dense model and a mixture of experts."""

from __future__ import annotations

import httpx
import pytest

from tandem.worker.devtools.tiny import TinySpec, create_tiny_model
from tests.integration.stacks import running_stack, spec

pytestmark = pytest.mark.slow

SHAPES = {
    "llama": TinySpec(layers=2, hidden=96, heads=6, kv_heads=2, intermediate=128, tie_embeddings=True),
    "qwen2_moe": TinySpec(arch="qwen2_moe", layers=2, hidden=64, heads=4, kv_heads=2, intermediate=96,
                          expert_intermediate=32, shared_intermediate=64),  # fmt: skip
}


def _gpus(obj: dict, **pools: int) -> dict:
    for pool, gpus in pools.items():
        obj["spec"][pool]["resources"] = {"gpus": gpus}
    return obj


@pytest.fixture(scope="module", params=list(SHAPES))
def stacks(request, tmp_path_factory):
    model_dir = create_tiny_model(tmp_path_factory.mktemp(request.param), SHAPES[request.param])
    logs = tmp_path_factory.mktemp(f"{request.param}-logs")
    name = request.param.replace("_", "-")
    disagg = _gpus(spec(f"tp-d-{name}", model_dir, prefillChunkTokens=32), prefill=2, decode=2)
    colo = spec(f"tp-c-{name}", model_dir, mode="colocated", prefillChunkTokens=32)
    with running_stack(disagg, logs / "d") as d, running_stack(colo, logs / "c") as c:
        yield d, c


def _greedy(url: str, prompt: str, n: int = 24) -> list[str]:
    r = httpx.post(
        f"{url}/v1/completions",
        json={"model": "tiny", "prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True, "logprobs": 1},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == n
    return r.json()["choices"][0]["logprobs"]["tokens"]


def test_two_rank_disaggregated_equals_one_rank_colocated_token_for_token(stacks):
    (disagg_stack, disagg), (_, colocated) = stacks
    long_prompt = " ".join(f"word{i}" for i in range(90))  # several 32-token chunks and 16-token blocks
    for prompt in ["Hello", long_prompt, "The quick brown fox jumps over the lazy dog."]:
        assert _greedy(disagg, prompt) == _greedy(colocated, prompt), prompt[:40]
    workers = [p for p in disagg_stack.plans if p.role in ("prefill", "decode")]
    assert all("--tensor-parallel" in p.argv and p.argv[p.argv.index("--tensor-parallel") + 1] == "2" for p in workers)
