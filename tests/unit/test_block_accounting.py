"""KV block accounting: after any mix of finished, aborted and preempted sequences the pool is empty again."""

from __future__ import annotations

import random

import pytest

from tandem.worker.api.params import InvalidRequest, SamplingParams
from tandem.worker.engine.core.block_manager import BlockManager, OutOfBlocks, prefix_hashes
from tandem.worker.engine.loading import load_model
from tandem.worker.engine.runner.engine import Engine, EngineConfig


@pytest.fixture(scope="module")
def tiny_model(tiny_model_dir):
    return load_model(tiny_model_dir)


def _register(bm: BlockManager, table: list[int], tokens: list[int], salt: str | None = None) -> None:
    """What the scheduler does once blocks are computed: publish each full block under its chained hash."""
    parent = bm.root(salt)
    for i, (block, h) in enumerate(zip(table, prefix_hashes(tokens, bm.block_size, parent), strict=False)):
        bm.register(block, h, parent, tokens[i * bm.block_size : (i + 1) * bm.block_size])
        parent = h


def test_block_manager_shares_cached_prefix_and_frees_everything():
    bm = BlockManager(num_blocks=8, block_size=4)
    tokens = list(range(10))
    table, cached = bm.allocate_prompt(tokens)
    assert (len(table), cached) == (3, 0)
    _register(bm, table, tokens)
    table2, cached2 = bm.allocate_prompt(tokens[:8] + [99, 98, 97])
    assert cached2 == 8 and table2[:2] == table[:2] and table2[2] not in table
    assert bm.num_used == 4
    bm.release(table)
    bm.release(table2)
    assert bm.num_used == 0 and bm.num_free == 8
    with pytest.raises(OutOfBlocks):
        bm.allocate(9)
    with pytest.raises(AssertionError):
        bm.release(table)  # a double free is a bug, never silently absorbed


def test_whole_prompt_cached_still_leaves_one_token_to_compute():
    bm = BlockManager(num_blocks=4, block_size=4)
    tokens = list(range(8))
    table, _ = bm.allocate_prompt(tokens)
    _register(bm, table, tokens)
    _, cached = bm.allocate_prompt(tokens)
    assert cached == 4  # the second block is recomputed so the request still gets logits
    assert (bm.prefix_queried_tokens, bm.prefix_hit_tokens) == (16, 4)  # what the hit-rate metric reads
    with pytest.raises(OutOfBlocks):
        bm.allocate_prompt(list(range(100, 120)))
    assert (bm.prefix_queried_tokens, bm.prefix_hit_tokens) == (16, 4)  # a refused prompt is not counted


def test_pool_returns_to_empty_after_finish_abort_and_preemption(tiny_model):
    # A pool too small for everyone at once forces preemption by recompute.
    engine = Engine(
        tiny_model, EngineConfig(block_size=4, num_kv_blocks=24, max_batch_tokens=64, prefill_chunk_tokens=16)
    )
    rng = random.Random(0)
    ids = []
    for i in range(10):
        prompt = [rng.randrange(2, 500) for _ in range(rng.randrange(3, 30))]
        ids.append(
            engine.add_request(
                prompt,
                SamplingParams(max_tokens=rng.randrange(4, 40), temperature=0.8, seed=i, ignore_eos=True),
            )
        )
    preempted, steps = 0, 0
    while engine.has_work():
        steps += 1
        if steps == 5:
            assert engine.abort(ids[3])
        if steps == 9:
            alive = ids[7] in engine.seqs  # it may already have finished
            assert engine.abort(ids[7]) is alive
            assert ids[7] not in engine.seqs and not engine.abort(ids[7])
        engine.step()
        preempted = max(preempted, sum(s.num_preemptions for s in engine.seqs.values()))
        assert engine.blocks.num_used <= engine.blocks.num_blocks
    assert preempted > 0, "the workload was meant to force preemption"
    assert engine.blocks.num_used == 0
    assert sorted(engine.blocks.free) == list(range(24))
    assert not engine.seqs


def test_preempted_sequence_gives_same_greedy_tokens(tiny_model):
    prompts = [[5 + i] * 20 + list(range(30, 40)) for i in range(6)]

    def run(num_blocks: int) -> tuple[dict[str, list[int]], int]:
        engine = Engine(tiny_model, EngineConfig(block_size=4, num_kv_blocks=num_blocks))
        out: dict[str, list[int]] = {}
        for p in prompts:
            out[engine.add_request(p, SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True))] = []
        worst = 0
        while engine.has_work():
            for o in engine.step():
                out[o.request_id].append(o.token_id)
            worst = max([worst] + [s.num_preemptions for s in engine.seqs.values()])
        return out, worst

    roomy, none = run(256)
    tight, some = run(40)
    assert none == 0 and some > 0
    assert roomy == tight


@pytest.mark.parametrize(
    "prompt, params, message",
    [
        ([], SamplingParams(), "empty"),
        ([1] * 5000, SamplingParams(), "context"),
        ([10**7], SamplingParams(), "token ids"),
    ],
)
def test_bad_requests_are_refused_with_a_reason(tiny_model, prompt, params, message):
    engine = Engine(tiny_model, EngineConfig(num_kv_blocks=64))
    with pytest.raises(InvalidRequest, match=message):
        engine.add_request(prompt, params)
    assert engine.blocks.num_used == 0 and not engine.has_work()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"stop": [""]}, "stop"),
    ],
)
def test_invalid_sampling_values(kwargs, message):
    with pytest.raises(InvalidRequest, match=message):
        SamplingParams(**kwargs)
