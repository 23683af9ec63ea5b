"""Our model and engine against Hugging Face transformers on random weights (fp32, no download)."""

from __future__ import annotations

import pytest
import torch

from tandem.worker.api.params import SamplingParams
from tandem.worker.engine.models.llama import AttentionBatch
from tandem.worker.engine.runner.engine import StepOutput
from tests.hf_reference import LLAMA_GQA, QWEN2_BIAS, engine_for, hf_greedy, hf_model, ours_from

CONFIGS = {"llama-gqa-rope3": LLAMA_GQA, "qwen2-qkv-bias": QWEN2_BIAS}


@pytest.fixture(scope="module", params=list(CONFIGS))
def pair(request):
    hf = hf_model(CONFIGS[request.param])
    return hf, ours_from(hf)


def _prompt(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, 500, (n,), generator=g).tolist()


def _forward(model, kv, tokens: list[int], start: int, table: list[int], block_size: int) -> torch.Tensor:
    n = len(tokens)
    slots = [table[p // block_size] * block_size + p % block_size for p in range(start, start + n)]
    batch = AttentionBatch([n], [start + n], [table], torch.tensor(slots), block_size)
    with torch.no_grad():
        hidden = model(torch.tensor(tokens), torch.arange(start, start + n), kv.k, kv.v, batch)
        return model.logits(hidden)


def assert_prompt_and_decode_steps_match(hf, ours, prompt_len: int, steps: int) -> None:
    """Our logits equal transformers' (fp32, 1e-4) for a prompt and then for each greedy decode step."""
    engine = engine_for(ours)
    prompt = _prompt(prompt_len, seed=1)
    table = list(range(10))
    logits = _forward(ours, engine.kv, prompt, 0, table, 8)
    with torch.no_grad():
        ref = hf(torch.tensor([prompt])).logits[0]
    torch.testing.assert_close(logits, ref, atol=1e-4, rtol=0)
    tokens = list(prompt)
    for _ in range(steps):
        nxt = int(logits[-1].argmax())
        tokens.append(nxt)
        logits = _forward(ours, engine.kv, [nxt], len(tokens) - 1, table, 8)
        with torch.no_grad():
            ref = hf(torch.tensor([tokens])).logits[0, -1:]
        torch.testing.assert_close(logits, ref, atol=1e-4, rtol=0)


def test_prompt_and_each_decode_step_match_transformers(pair):
    hf, ours = pair
    assert_prompt_and_decode_steps_match(hf, ours, prompt_len=37, steps=12)


def _run(engine, prompts: list[list[int]], n: int) -> dict[str, list[int]]:
    greedy = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    ids = [engine.add_request(p, greedy) for p in prompts]
    out: dict[str, list[int]] = {i: [] for i in ids}
    while engine.has_work():
        step: list[StepOutput] = engine.step()
        for o in step:
            out[o.request_id].append(o.token_id)
    assert engine.blocks.num_used == 0
    return out


def test_continuous_batch_of_different_lengths_matches_transformers(pair):
    hf, ours = pair
    prompts = [_prompt(n, seed=n) for n in (5, 19, 33, 8)]
    got = _run(engine_for(ours), prompts, 64)
    for rid, prompt in zip(got, prompts, strict=True):
        assert got[rid] == hf_greedy(hf, prompt, 64)


def test_chunked_prefill_matches_transformers(pair):
    hf, ours = pair
    prompts = [_prompt(45, seed=3), _prompt(22, seed=4)]
    engine = engine_for(ours, prefill_chunk_tokens=7, max_batch_tokens=16)
    got = _run(engine, prompts, 64)
    for rid, prompt in zip(got, prompts, strict=True):
        assert got[rid] == hf_greedy(hf, prompt, 64)


def test_prefix_cache_hit_gives_same_tokens(pair):
    hf, ours = pair
    engine = engine_for(ours)  # block_size 8
    shared = _prompt(40, seed=5)  # five full blocks
    first = _run(engine, [shared + [7, 8, 9]], 64)
    second_prompt = shared + [11, 12]
    free_before = engine.blocks.num_free
    rid = engine.add_request(second_prompt, SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True))
    out = [o.token_id for o in engine.step()]
    sched = engine.last_schedule
    assert sched is not None and [s.request_id for s in sched.seqs] == [rid]
    computed = sched.num_new_tokens[0]
    assert len(second_prompt) - computed == len(shared), "the shared blocks must come from the prefix cache"
    assert computed == 2 and engine.seqs[rid].num_computed == len(second_prompt)
    while engine.has_work():
        out += [o.token_id for o in engine.step()]
    assert engine.blocks.num_free == free_before
    assert list(first.values())[0] == hf_greedy(hf, shared + [7, 8, 9], 64)
    assert out == hf_greedy(hf, second_prompt, 64)


def test_prompt_logprobs_match_transformers_across_chunks_and_past_the_prefix_cache(pair):
    """Each prompt token's logprob, rank and likeliest alternatives, as transformers' logits give them, with
    the prompt run in chunks and run again (its blocks cached: it still runs whole)."""
    hf, ours = pair
    prompt = _prompt(21, seed=5)
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([prompt])).logits[0].float(), dim=-1)
    engine = engine_for(ours, prefill_chunk_tokens=8)
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True, prompt_logprobs=3)
    for run in range(2):
        rid = engine.add_request(prompt, params, request_id=f"r{run}")
        firsts = []
        while engine.has_work():
            firsts += [o for o in engine.step() if o.request_id == rid and o.prompt_logprobs is not None]
        (first,) = firsts
        assert first.prompt_logprobs is not None and len(first.prompt_logprobs) == len(prompt) - 1
        for p, (lp, rank, top) in enumerate(first.prompt_logprobs, start=1):
            want = ref[p - 1]
            assert lp == pytest.approx(float(want[prompt[p]]), abs=1e-4)
            assert rank == int((want > want[prompt[p]]).sum()) + 1
            assert [t for t, _ in top] == want.topk(3).indices.tolist()
    assert engine.blocks.prefix_hit_tokens == 0  # neither run reused the cache
