"""Prefix-cache hits are never decided by a hash alone, and tenants with different cache salts never
share a KV block: colliding prompts and salted requests against the block manager, the engine, the wire
and the router's request schema."""

from __future__ import annotations

import pytest

from tandem.worker.api.params import InvalidRequest, SamplingParams
from tandem.worker.api.wire import params_from_proto, params_to_proto
from tandem.worker.engine.core import block_manager
from tandem.worker.engine.core.block_manager import BlockManager, prefix_hashes, root_hash

BS = 4


def _publish(bm: BlockManager, tokens: list[int], salt: str | None = None) -> list[int]:
    """Allocate a prompt and publish its full blocks, as the scheduler does once they are computed."""
    table, _ = bm.allocate_prompt(tokens, cache_salt=salt)
    parent = bm.root(salt)
    for i, h in enumerate(prefix_hashes(tokens, BS, parent)):
        bm.register(table[i], h, parent, tokens[i * BS : (i + 1) * BS])
        parent = h
    return table


def test_prompts_whose_old_hashes_collide_do_not_share():
    victim = [7, 8, 9, 10, 11, 12, 13, 14, 15]
    # Python's int hash is n mod (2**61 - 1): the old `hash((parent, tuple(tokens)))` of these blocks is equal
    attacker = [victim[0] + (2**61 - 1)] + victim[1:4] + [99, 98, 97, 96, 95]
    assert hash((None, tuple(victim[:4]))) == hash((None, tuple(attacker[:4])))
    bm = BlockManager(num_blocks=16, block_size=BS)
    _publish(bm, victim)
    assert bm.cached_prefix(attacker) == []
    assert len(bm.cached_prefix(victim)) == 2  # the owner's own prefix still hits


def test_a_hash_collision_is_caught_by_comparing_tokens(monkeypatch):
    # A hash function that collides on purpose (only the first token counts): hits must still be checked.
    monkeypatch.setattr(
        block_manager, "block_hash", lambda parent, tokens: parent[:8] + bytes([tokens[0] % 256])
    )
    bm = BlockManager(num_blocks=16, block_size=BS)
    table = _publish(bm, [1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert bm.cached_prefix([1, 50, 51, 52, 5, 6, 7, 8, 9]) == []  # same hash, other tokens
    assert bm.cached_prefix([1, 2, 3, 4, 5, 60, 61, 62, 9]) == table[:1]  # first block really equal
    assert bm.cached_prefix([1, 2, 3, 4, 5, 6, 7, 8, 9]) == table[:2]


def test_hashes_are_sha256_chained_and_seeded_per_model():
    tokens = list(range(8))
    a, b = prefix_hashes(tokens, BS, root_hash(b"model-a")), prefix_hashes(tokens, BS, root_hash(b"model-b"))
    assert all(len(h) == 32 for h in a) and not set(a) & set(b)
    assert prefix_hashes(tokens[:4] + [0, 5, 6, 7], BS, root_hash(b"model-a"))[0] == a[0]
    assert prefix_hashes(tokens[:4] + [0, 5, 6, 7], BS, root_hash(b"model-a"))[1] != a[1]


@pytest.mark.parametrize("first, second", [("tenant-a", "tenant-b"), (None, "tenant-a"), ("tenant-a", None)])
def test_different_salts_never_share(first, second):
    bm = BlockManager(num_blocks=16, block_size=BS)
    tokens = list(range(20))
    _publish(bm, tokens, first)
    assert bm.cached_prefix(tokens, second) == []
    assert len(bm.cached_prefix(tokens, first)) == 4  # the same salt shares, as it chose to


def test_engine_reserve_respects_the_salt(tiny_model_dir):
    from tandem.worker.engine.loading import load_model
    from tandem.worker.engine.runner.engine import Engine, EngineConfig

    engine = Engine(
        load_model(tiny_model_dir), EngineConfig(block_size=BS, num_kv_blocks=64, prefix_cache_seed="tiny")
    )
    prompt = list(range(3, 40))
    engine.add_request(prompt, SamplingParams(max_tokens=1, temperature=0.0, cache_salt="tenant-a"))
    while engine.has_work():
        engine.step()
    for salt, expect_hit in (("tenant-a", True), ("tenant-b", False), (None, False)):
        table, cached = engine.reserve(prompt, SamplingParams(max_tokens=1, cache_salt=salt))
        assert (cached > 0) is expect_hit, salt
        engine.release(table)
    assert engine.blocks.num_used == 0


def test_cache_salt_crosses_the_wire_and_the_router_schema():
    from tandem.worker.router.openai_schema import CompletionRequest

    params = CompletionRequest(model="m", prompt="hi", cache_salt="tenant-a").sampling_params(8)
    assert params.cache_salt == "tenant-a"
    assert params_from_proto(params_to_proto(params)).cache_salt == "tenant-a"
    unsalted = CompletionRequest(model="m", prompt="hi").sampling_params(8)
    assert params_from_proto(params_to_proto(unsalted)).cache_salt is None
    with pytest.raises(InvalidRequest, match="cache_salt"):
        SamplingParams(cache_salt="")
