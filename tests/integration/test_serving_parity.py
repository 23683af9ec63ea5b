"""Disaggregated serving through the local stack (`tandem up`) gives a one-rank colocated worker's tokens,
token for token, for each model family and tensor-parallel degree: a dense Llama and a Qwen2-MoE on two
ranks per worker (`resources.gpus: 2`; on the CPU, two gloo processes per worker), and a Mixtral on one,
with the KV pushed from prefill to decode between them."""

from __future__ import annotations

import pytest

from tandem.worker.devtools.tiny import TinySpec, create_tiny_model
from tests.integration.stacks import greedy_tokens, running_stack, spec

pytestmark = pytest.mark.slow

# (its tiny checkpoint, the ranks of each disaggregated worker)
CASES = {
    "llama": (TinySpec(layers=2, hidden=96, heads=6, kv_heads=2, intermediate=128, tie_embeddings=True), 2),
    "qwen2_moe": (
        TinySpec(
            arch="qwen2_moe",
            layers=2,
            hidden=64,
            heads=4,
            kv_heads=2,
            intermediate=96,
            expert_intermediate=32,
            shared_intermediate=64,
        ),
        2,
    ),
    "mixtral": (
        TinySpec(
            arch="mixtral",
            layers=2,
            hidden=64,
            heads=4,
            kv_heads=2,
            intermediate=96,
            experts=4,
            experts_per_token=2,
        ),
        1,
    ),
}


@pytest.fixture(scope="module", params=list(CASES))
def stacks(request, tmp_path_factory):
    shape, ranks = CASES[request.param]
    model_dir = create_tiny_model(tmp_path_factory.mktemp(request.param), shape)
    logs = tmp_path_factory.mktemp(f"{request.param}-logs")
    name = request.param.replace("_", "-")
    disagg = spec(f"par-d-{name}", model_dir, prefillChunkTokens=32)
    for pool in ("prefill", "decode"):
        disagg["spec"][pool]["resources"] = {
            "gpus": ranks if ranks > 1 else 0
        }  # one rank: the CPU, as `spec` has it
    colo = spec(f"par-c-{name}", model_dir, mode="colocated", prefillChunkTokens=32)
    with running_stack(disagg, logs / "d") as d, running_stack(colo, logs / "c") as c:
        yield d, c, ranks


def test_disaggregated_equals_one_rank_colocated_token_for_token(stacks):
    (disagg_stack, disagg), (_, colocated), ranks = stacks
    long_prompt = " ".join(f"word{i}" for i in range(90))  # several 32-token chunks and 16-token blocks
    for prompt in ["Hello", long_prompt, "The quick brown fox jumps over the lazy dog."]:
        assert greedy_tokens(disagg, prompt) == greedy_tokens(colocated, prompt), prompt[:40]
    workers = [p for p in disagg_stack.plans if p.role in ("prefill", "decode")]
    tp = [
        p.argv[p.argv.index("--tensor-parallel") + 1] if "--tensor-parallel" in p.argv else "1"
        for p in workers
    ]
    assert tp == [str(ranks)] * len(workers), tp
