"""The 8-bit KV cache (`engine.kvCacheDtype: int8`): packing bounds, attention over 8-bit pages against the
full-precision cache, greedy agreement on the tiny model, twice the sequences in the same memory, and the
flex backend refused."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tandem.worker.api.params import SamplingParams
from tandem.worker.devtools.accuracy import agreement, greedy_continuation
from tandem.worker.engine.layers.attention import AttentionBatch, sdpa_paged_attention
from tandem.worker.engine.layers.kv_cache import KvCache, kv_block_nbytes
from tandem.worker.engine.layers.kv_int8 import pack, read_pages, unpack, write_slots
from tandem.worker.engine.loading import load_model
from tandem.worker.engine.memory import CPU_KV_BUDGET_BYTES, decode_gather_bytes, plan_kv_cache
from tandem.worker.engine.runner.engine import Engine, EngineConfig
from tandem.worker.hf.config import ModelConfig
from tests.hf_reference import LLAMA_GQA

BS = 8


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_model(tiny_model_dir)


def test_packed_rows_hold_int8_values_and_their_scale_within_half_a_step():
    x = torch.randn(6, 2, 64) * torch.logspace(-4, 2, 6)[:, None, None]
    packed = pack(x)
    assert packed.dtype == torch.uint8 and packed.shape == (6, 2, 68)
    scale = packed[..., 64:].contiguous().view(torch.float32)
    torch.testing.assert_close(scale[..., 0], x.abs().amax(-1) / 127)
    err = (unpack(packed, torch.float32) - x).abs()
    assert bool((err <= scale * 0.5 * (1 + 1e-6)).all())
    assert unpack(packed, torch.bfloat16).dtype == torch.bfloat16


def _caches(kvh: int, d: int, blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.zeros(blocks, BS, kvh, d), torch.zeros(blocks, BS, kvh, d + 4, dtype=torch.uint8)


def test_writes_pack_only_their_own_slots():
    full, packed = _caches(2, 16, 4)
    x = torch.randn(3, 2, 16)
    slots = torch.tensor([5, 6, 17])
    write_slots(full, slots, x)
    write_slots(packed, slots, x)
    got = read_pages(packed, torch.tensor([0, 2]), torch.float32).flatten(0, 1)
    torch.testing.assert_close(got[[5, 6, 9]], x, atol=float(x.abs().max()) / 127, rtol=0)
    assert int(packed[1].count_nonzero()) == 0 and int(packed[3].count_nonzero()) == 0


def test_attention_over_8_bit_pages_stays_within_a_stated_bound():
    """A decode batch and a chunk with cached context, read through each cache: the 8-bit output is within
    1% of the largest |value| (one int8 step is 0.4% of a row's absmax; measured: ~0.3%)."""
    gen = torch.Generator().manual_seed(0)
    nh, kvh, d, blocks = 8, 2, 64, 32
    ctx = [37, 20, 51]  # sequences 0 and 1 decode one token, sequence 2 prefills a chunk of 9 over 42 cached
    query_lens = [1, 1, 9]
    tables = [list(range(0, 5)), list(range(5, 8)), list(range(8, 15))]
    k_all = [torch.randn(c, kvh, d, generator=gen) for c in ctx]
    v_all = [torch.randn(c, kvh, d, generator=gen) for c in ctx]
    q = torch.randn(sum(query_lens), nh, d, generator=gen)
    slots = [
        torch.tensor([t[p // BS] * BS + p % BS for p in range(c)]) for c, t in zip(ctx, tables, strict=True)
    ]
    new = [slice(c - n, c) for c, n in zip(ctx, query_lens, strict=True)]
    k_new = torch.cat([k[s] for k, s in zip(k_all, new, strict=True)])
    v_new = torch.cat([v[s] for v, s in zip(v_all, new, strict=True)])
    batch = AttentionBatch(
        query_lens, ctx, tables, torch.cat([sl[s] for sl, s in zip(slots, new, strict=True)]), BS
    )
    outs = []
    for packed in (False, True):
        cache_k, cache_v = (_caches(kvh, d, blocks)[packed] for _ in range(2))
        for sl, k, v in zip(slots, k_all, v_all, strict=True):
            write_slots(cache_k, sl, k)
            write_slots(cache_v, sl, v)
        outs.append(sdpa_paged_attention(q, k_new, v_new, cache_k, cache_v, batch, d**-0.5))
    full, eight = outs
    rel = float((eight - full).abs().max()) / max(float(v.abs().max()) for v in v_all)
    assert 0 < rel < 0.01, rel


@pytest.mark.slow  # a whole greedy generation twice: over a minute on a busy 2-core machine
def test_greedy_tokens_with_the_8_bit_cache_agree_with_the_full_cache(tiny):
    results = []
    for seed in (0, 1, 2):
        prompt = torch.randint(
            3, tiny.config.vocab_size, (20,), generator=torch.Generator().manual_seed(seed)
        ).tolist()
        results.append(agreement(tiny, tiny, prompt, n=64, kv_cache_dtype="int8"))
    # measured on the seed-0 tiny model (fp32): rel error 0.3-0.5%, top-1 agreement 0.95-1.0
    assert max(r.rel_error for r in results) < 0.02, results
    assert sum(r.top1_agreement for r in results) / len(results) >= 0.9, results


def test_the_engine_decodes_a_batch_over_the_8_bit_cache_as_one_sequence_alone(tiny):
    engine = Engine(
        tiny, EngineConfig(block_size=BS, num_kv_blocks=64, kv_cache_dtype="int8", prefill_chunk_tokens=8)
    )
    assert engine.kv.k[0].dtype == torch.uint8
    prompts = [list(range(3, 3 + n)) for n in (5, 19, 11)]
    greedy = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    ids = [engine.add_request(p, greedy) for p in prompts]
    got: dict[str, list[int]] = {i: [] for i in ids}
    while engine.has_work():
        for o in engine.step():
            got[o.request_id].append(o.token_id)
    alone = greedy_continuation(tiny, prompts[0], 16, kv_cache_dtype="int8")
    assert got[ids[0]] == alone  # the 5-token prompt is one chunk, like the reference's prefill
    assert all(len(t) == 16 for t in got.values()) and engine.blocks.num_used == 0


def test_the_planner_fits_about_twice_the_sequences_in_the_same_memory(tiny, tiny_model_dir):
    tiny_bf16 = load_model(tiny_model_dir, "bfloat16")
    config = ModelConfig.from_hf(dict(LLAMA_GQA))  # head_dim 16: the scales weigh the most here
    for dtype, at_least in ((torch.bfloat16, 1.6), (torch.float32, 3.2)):
        full = kv_block_nbytes(config, 16, dtype)
        eight = kv_block_nbytes(config, 16, dtype, "int8")
        assert full / eight >= at_least, (dtype, full, eight)
    base = EngineConfig(block_size=16, max_model_len=1024)
    budget = CPU_KV_BUDGET_BYTES * 10 // 100
    head = tiny.config.head_dim
    for model, elem in ((tiny, 4), (tiny_bf16, 2)):  # bytes an element against 1 + 4 / head_dim
        plans = {
            d: plan_kv_cache(model, dataclasses.replace(base, kv_cache_dtype=d), memory_percent=10)
            for d in ("auto", "int8")
        }
        seqs = plans["int8"].max_concurrent_sequences / plans["auto"].max_concurrent_sequences
        assert seqs == pytest.approx(elem * head / (head + 4), rel=0.01)
        assert all(p.total_bytes <= budget for p in plans.values())


def test_decode_attention_room_counts_the_unpacked_copy_of_an_8_bit_cache():
    packed, full, size, layers = 16 * 8 * 68 * 2 * 4, 16 * 8 * 64 * 2 * 4 * 2, 16, 4  # bytes per block
    tokens = 1000 * size
    room = decode_gather_bytes(1 << 40, packed, size, layers, tokens, gathered_block_bytes=packed + full)
    assert room == tokens * ((packed + full) // size) // layers
    assert room > decode_gather_bytes(1 << 40, packed, size, layers, tokens)


def test_the_8_bit_cache_with_flex_attention_is_refused():
    with pytest.raises(ValueError, match="kvCacheDtype int8 needs engine.attention sdpa"):
        EngineConfig(attention="flex", kv_cache_dtype="int8")
    with pytest.raises(ValueError, match="kvCacheDtype"):
        EngineConfig(kv_cache_dtype="fp4")


def test_the_kv_cache_stores_packed_blocks_the_transfer_reads_as_they_are(tiny):
    kv = KvCache(tiny.config, 4, BS, torch.float32, "cpu", "int8")
    assert kv.k[0].shape == (4, BS, tiny.config.num_kv_heads, tiny.config.head_dim + 4)
    rows = torch.randint(
        0, 256, (2, BS, tiny.config.num_kv_heads, tiny.config.head_dim + 4), dtype=torch.uint8
    )
    kv.write_blocks(1, [2, 3], rows, rows)
    k, v = kv.read_blocks(1, [2, 3])
    assert torch.equal(k, rows) and torch.equal(v, rows)
