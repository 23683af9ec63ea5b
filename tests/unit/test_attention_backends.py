"""Both attention backends against transformers: the SDPA reference and FlexAttention over the page table.

Flex runs eagerly on the CPU (compiled only on CUDA), so these cases stay short: a prompt, a few decode
steps, and one mixed step (fresh prompt, prompt chunk over cached context, batched decodes) whose
sequences own scattered, non-consecutive blocks.
"""

from __future__ import annotations

import pytest
import torch

from tandem.worker.api.params import SamplingParams
from tandem.worker.engine.layers.attention import AttentionBatch
from tests.hf_reference import LLAMA_GQA, engine_for, hf_greedy, hf_model, ours_from

BS = 8


@pytest.fixture(scope="module")
def pair():
    hf = hf_model(LLAMA_GQA)
    return hf, ours_from(hf)


def _prompt(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, 500, (n,), generator=g).tolist()


def _slots(table: list[int], start: int, n: int) -> list[int]:
    return [table[p // BS] * BS + p % BS for p in range(start, start + n)]


def _step(model, kv, backend: str, rows: list[tuple[list[int], int, list[int]]]) -> torch.Tensor:
    """One forward of several sequences, each (new tokens, tokens already cached, block table)."""
    ids, pos, slots = [], [], []
    for tokens, start, table in rows:
        ids += tokens
        pos += range(start, start + len(tokens))
        slots += _slots(table, start, len(tokens))
    batch = AttentionBatch(
        [len(t) for t, _, _ in rows],
        [s + len(t) for t, s, _ in rows],
        [tb for _, _, tb in rows],
        torch.tensor(slots),
        BS,
        backend,
    )
    with torch.no_grad():
        return model.logits(model(torch.tensor(ids), torch.tensor(pos), kv.k, kv.v, batch))


def _hf_last(hf, tokens: list[int], n: int) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([tokens])).logits[0, -n:]


@pytest.mark.parametrize("backend", ["sdpa", "flex"])
def test_prompt_then_decode_steps_match_transformers(pair, backend):
    hf, ours = pair
    kv = engine_for(ours).kv
    table = [40, 3, 17, 22, 9, 31]  # scattered blocks
    prompt = _prompt(29, seed=1)
    logits = _step(ours, kv, backend, [(prompt, 0, table)])
    torch.testing.assert_close(logits, _hf_last(hf, prompt, len(prompt)), atol=1e-4, rtol=0)
    tokens = list(prompt)
    for _ in range(3):
        tokens.append(int(logits[-1].argmax()))
        logits = _step(ours, kv, backend, [([tokens[-1]], len(tokens) - 1, table)])
        torch.testing.assert_close(logits, _hf_last(hf, tokens, 1), atol=1e-4, rtol=0)


def test_mixed_step_flex_equals_sdpa_and_transformers(pair):
    """Fresh prompt + a chunk over cached context + two decodes in one step, on both backends."""
    hf, ours = pair
    a, b, c, d = _prompt(21, 2), _prompt(30, 3), _prompt(12, 4), _prompt(17, 5)
    tables = {"a": [5, 60, 2], "b": [11, 7, 50, 1], "c": [33, 34], "d": [70, 4, 45]}
    outs = {}
    for backend in ("sdpa", "flex"):
        kv = engine_for(ours).kv
        # cache what is "already computed": b's first 19 tokens, all but the last token of c and d
        _step(
            ours, kv, "sdpa", [(b[:19], 0, tables["b"]), (c[:-1], 0, tables["c"]), (d[:-1], 0, tables["d"])]
        )
        rows = [
            (a, 0, tables["a"]),
            (b[19:], 19, tables["b"]),
            ([c[-1]], 11, tables["c"]),
            ([d[-1]], 16, tables["d"]),
        ]
        outs[backend] = _step(ours, kv, backend, rows)
    torch.testing.assert_close(outs["flex"], outs["sdpa"], atol=1e-5, rtol=0)
    flex = outs["flex"]
    torch.testing.assert_close(flex[:21], _hf_last(hf, a, 21), atol=1e-4, rtol=0)
    torch.testing.assert_close(flex[21:32], _hf_last(hf, b, 11), atol=1e-4, rtol=0)
    torch.testing.assert_close(flex[32:33], _hf_last(hf, c, 1), atol=1e-4, rtol=0)
    torch.testing.assert_close(flex[33:34], _hf_last(hf, d, 1), atol=1e-4, rtol=0)


def test_flex_engine_greedy_tokens_match_transformers(pair):
    """Through the engine (scheduler, chunked prefill, batched decode) with the flex backend."""
    hf, ours = pair
    engine = engine_for(ours, attention="flex", prefill_chunk_tokens=9, max_batch_tokens=12)
    prompts = [_prompt(13, 6), _prompt(5, 7)]
    greedy = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    ids = [engine.add_request(p, greedy) for p in prompts]
    got: dict[str, list[int]] = {i: [] for i in ids}
    while engine.has_work():
        for o in engine.step():
            got[o.request_id].append(o.token_id)
    assert engine.blocks.num_used == 0
    for rid, prompt in zip(ids, prompts, strict=True):
        assert got[rid] == hf_greedy(hf, prompt, 4)


def test_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="attention backend"):
        AttentionBatch([1], [1], [[0]], torch.tensor([0]), BS, "paged-magic")
