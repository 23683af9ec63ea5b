"""Reservation table and receiver: epochs, leases, aborts, and blocks returned on every path."""

from __future__ import annotations

import pytest
import torch

from tandem.v1 import decode_pb2
from tandem.worker.kv_transport.base import ChecksumMismatch, IncompleteTransfer, InvalidChunk, KvLayout
from tandem.worker.kv_transport.codec import encode_blocks
from tandem.worker.kv_transport.framing import pack_chunk, unpack_chunk
from tandem.worker.kv_transport.receiver import KvReceiver, chunk_checksum
from tandem.worker.kv_transport.reservations import ChunkVerdict, ReservationTable, classify_epoch
from tandem.worker.kv_transport.tensor_store import TensorKvStore


def test_classify_epoch():
    assert classify_epoch(3, 3) is ChunkVerdict.ACCEPT
    assert classify_epoch(3, 2) is ChunkVerdict.STALE
    assert classify_epoch(None, 1) is ChunkVerdict.UNKNOWN


def test_reserve_again_supersedes_with_a_newer_epoch():
    table = ReservationTable()
    first, gone = table.reserve("t", "r", [1, 2], num_layers=2, lease_s=1.0, now=0.0)
    assert gone == []
    second, gone = table.reserve("t", "r", [3], num_layers=2, lease_s=1.0, now=0.0)
    assert second.epoch > first.epoch and [g.block_ids for g in gone] == [[1, 2]]
    assert table.check("t", first.epoch, now=0.1) is ChunkVerdict.STALE
    assert table.check("t", second.epoch, now=0.1) is ChunkVerdict.ACCEPT


def test_lease_expiry_returns_blocks_and_progress_renews_it():
    table = ReservationTable()
    a, _ = table.reserve("a", "ra", [1, 2], num_layers=1, lease_s=1.0, now=0.0)
    table.reserve("b", "rb", [3], num_layers=1, lease_s=1.0, now=0.0)
    table.record("a", 0, [1], now=0.9)  # renews a's lease to 1.9
    assert table.expire(now=0.5) == []
    gone = table.expire(now=1.0)
    assert [g.block_ids for g in gone] == [[3]] and gone[0].reason == "lease expired"
    assert table.check("a", a.epoch, now=1.95) is ChunkVerdict.UNKNOWN  # expired but not yet reaped
    assert [g.block_ids for g in table.expire(now=2.0)] == [[1, 2]]
    assert len(table) == 0


def test_complete_needs_every_layer_block_and_hands_blocks_over():
    table = ReservationTable()
    res, _ = table.reserve("t", "r", [4, 5], num_layers=2, lease_s=10, now=0)
    table.record("t", 0, [4, 5], now=0)
    table.record("t", 1, [4], now=0)
    with pytest.raises(ValueError):
        table.complete("t", res.epoch)
    table.record("t", 1, [5], now=0)
    assert table.complete("t", res.epoch) is res
    assert table.expire(now=100) == [] and table.reserved_blocks() == 0


def test_abort_by_transfer_or_request_id():
    table = ReservationTable()
    table.reserve("t1", "r1", [1], 1, 10, 0)
    table.reserve("t2", "r2", [2], 1, 10, 0)
    assert [g.block_ids for g in table.abort(request_id="r2")] == [[2]]
    assert [g.block_ids for g in table.abort(transfer_id="t1")] == [[1]]
    assert table.abort(transfer_id="t1") == []


LAYOUT = KvLayout(num_layers=2, block_size=4, num_kv_heads=2, head_dim=8, dtype=torch.float16)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


@pytest.fixture
def rig():
    clock, freed, committed = Clock(), [], []
    store = TensorKvStore(LAYOUT, 16)
    rx = KvReceiver(
        store, LAYOUT, on_release=lambda r: freed.extend(r.block_ids), on_commit=committed.append, clock=clock
    )
    return rx, store, clock, freed, committed


def _chunk(res, layer, ids, k, v, corrupt=False, epoch=None, sequence=None):
    parts, _ = encode_blocks(k, v)
    header = decode_pb2.KvChunkHeader(
        transfer_id=res.transfer_id,
        epoch=epoch or res.epoch,
        kind=decode_pb2.KV_CHUNK_KIND_DATA,
        layer=layer,
        block_ids=ids,
        sequence=res.next_sequence if sequence is None else sequence,  # the next one due, unless told
    )
    header.checksum, header.has_checksum = chunk_checksum(parts), True
    raw = bytearray(pack_chunk(header, [memoryview(p.numpy()) for p in parts]))
    if corrupt:
        raw[-1] ^= 0xFF
    return unpack_chunk(bytes(raw))


def _kv(n, seed):
    g = torch.Generator().manual_seed(seed)
    shape = (n, *LAYOUT.block_shape)
    return torch.randn(shape, generator=g).half(), torch.randn(shape, generator=g).half()


def test_receiver_applies_commits_and_hands_over(rig):
    rx, store, _, freed, committed = rig
    res = rx.reserve("t", "r", [3, 7], lease_s=5)
    for layer in range(2):
        k, v = _kv(2, layer)
        assert rx.apply(*_chunk(res, layer, [7, 3], k, v)) is ChunkVerdict.ACCEPT
        assert torch.equal(store.k[layer][7], k[0]) and torch.equal(store.v[layer][3], v[1])
    verdict, done = rx.commit(decode_pb2.KvChunkHeader(transfer_id="t", epoch=res.epoch, first_token=9))
    assert verdict is ChunkVerdict.ACCEPT and done.first_token == 9 and committed == [done] and freed == []


def test_receiver_drops_stale_epoch_without_writing(rig):
    rx, store, _, freed, _ = rig
    old = rx.reserve("t", "r", [1], lease_s=5)
    new = rx.reserve("t", "r", [2], lease_s=5)
    assert freed == [1]  # superseded reservation freed
    k, v = _kv(1, 0)
    assert rx.apply(*_chunk(old, 0, [1], k, v)) is ChunkVerdict.STALE
    assert not store.k[0][1].any()
    assert rx.apply(*_chunk(new, 0, [2], k, v)) is ChunkVerdict.ACCEPT


def test_receiver_rejects_bad_checksum_and_foreign_blocks(rig):
    rx, store, _, _, _ = rig
    res = rx.reserve("t", "r", [1, 2], lease_s=5)
    k, v = _kv(1, 0)
    with pytest.raises(ChecksumMismatch):
        rx.apply(*_chunk(res, 0, [1], k, v, corrupt=True))
    assert not store.v[0][1].any()
    with pytest.raises(InvalidChunk):
        rx.apply(*_chunk(res, 0, [9], k, v))
    with pytest.raises(InvalidChunk):
        rx.apply(*_chunk(res, 5, [1], k, v))


def test_commit_before_all_blocks_is_incomplete(rig):
    rx, _, _, _, _ = rig
    res = rx.reserve("t", "r", [1], lease_s=5)
    k, v = _kv(1, 0)
    rx.apply(*_chunk(res, 0, [1], k, v))
    with pytest.raises(IncompleteTransfer):
        rx.commit(decode_pb2.KvChunkHeader(transfer_id="t", epoch=res.epoch))


def test_expired_reservation_frees_blocks_and_refuses_chunks(rig):
    rx, _, clock, freed, _ = rig
    res = rx.reserve("t", "r", [5, 6], lease_s=1)
    clock.now = 2.0
    k, v = _kv(2, 0)
    assert rx.apply(*_chunk(res, 0, [5, 6], k, v)) is ChunkVerdict.UNKNOWN
    assert [g.reason for g in rx.expire()] == ["lease expired"] and freed == [5, 6]
    assert rx.fail("t", res.epoch, "late") == []  # nothing left to free twice
