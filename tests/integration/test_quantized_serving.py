"""Int8 weights and the 8-bit KV cache through the local stack: processes on loopback serve requests, and
the 8-bit blocks pushed prefill -> decode over the gRPC stream (and through shared memory) give the tokens
of a colocated worker with the same options."""

from __future__ import annotations

import pytest

from tests.integration.stacks import greedy_tokens, running_stack, spec

pytestmark = pytest.mark.slow

# kvTransfer.compression int8 is asked for too: with an 8-bit cache it must be a no-op, not a second rounding
QUANTIZED = {"prefillChunkTokens": 32, "kvCacheDtype": "int8"}


def _spec(name: str, model_dir, mode: str, transport: str = "grpc") -> dict:
    obj = spec(name, model_dir, mode=mode, **QUANTIZED)
    obj["spec"]["model"]["quantization"] = "int8"
    if mode == "disaggregated":  # colocated moves no KV and refuses a kvTransfer section
        obj["spec"]["kvTransfer"] = {"transport": transport, "compression": "int8"}
    return obj


@pytest.fixture(scope="module", params=["grpc", "shm"])
def disagg(tiny_model_dir, tmp_path_factory, request):
    obj = _spec(f"q-{request.param}", tiny_model_dir, "disaggregated", request.param)
    with running_stack(obj, tmp_path_factory.mktemp(f"q-{request.param}")) as s:
        yield s


@pytest.fixture(scope="module")
def colocated(tiny_model_dir, tmp_path_factory):
    with running_stack(_spec("q-colo", tiny_model_dir, "colocated"), tmp_path_factory.mktemp("q-colo")) as s:
        yield s


def test_quantized_disaggregated_equals_quantized_colocated_token_for_token(disagg, colocated):
    long_prompt = " ".join(f"word{i}" for i in range(120))  # several 32-token chunks and 16-token blocks
    shared = "The quick brown fox jumps over the lazy dog. " * 6
    for prompt in [
        "Hello",
        long_prompt,
        shared + "First ending.",
        shared + "Second ending, reusing the prefix.",
    ]:
        assert greedy_tokens(disagg[1], prompt) == greedy_tokens(colocated[1], prompt), prompt[:40]


def test_the_workers_run_int8_weights_and_an_8_bit_cache(disagg):
    stack, _ = disagg
    workers = [p for p in stack.plans if p.role in ("prefill", "decode")]
    assert len(workers) == 2
    for p in workers:
        argv = " ".join(p.argv)
        assert "--quantization int8" in argv and "--kv-cache-dtype int8" in argv
