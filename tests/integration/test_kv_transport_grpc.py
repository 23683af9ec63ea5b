"""KV over a real gRPC server on loopback: gRPC and shared-memory paths byte for byte, stale epochs, bad
checksums, and a killed sender whose reservation is freed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from concurrent import futures

import grpc
import pytest
import torch

from tandem.v1 import common_pb2, decode_pb2
from tandem.worker.kv_transport.base import KvLayout, KvTransferError
from tandem.worker.kv_transport.codec import INT8
from tandem.worker.kv_transport.grpc_stream import (
    BULK_CHANNEL_OPTIONS,
    StreamKvSender,
    push_kv_handler,
    staging_for,
)
from tandem.worker.kv_transport.receiver import KvReceiver
from tandem.worker.kv_transport.staging import StagingPool, StagingRing
from tandem.worker.kv_transport.tensor_store import TensorKvStore

LAYOUT = KvLayout(num_layers=4, block_size=16, num_kv_heads=4, head_dim=64, dtype=torch.bfloat16)
NUM_BLOCKS = 96


class Decode:
    """A decode worker reduced to its KV side: a store, a receiver, a staging pool, PushKv on loopback."""

    def __init__(self):
        self.store = TensorKvStore(LAYOUT, NUM_BLOCKS)
        self.free = set(range(NUM_BLOCKS))
        self.committed = []
        self.pool = StagingPool([StagingRing.create_shm(1 << 20)])
        self.rx = KvReceiver(self.store, LAYOUT, on_release=self._release, on_commit=self._commit)
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=BULK_CHANNEL_OPTIONS)
        handler = grpc.method_handlers_generic_handler(
            "tandem.v1.DecodeService", {"PushKv": push_kv_handler(self.rx)}
        )
        self.server.add_generic_rpc_handlers((handler,))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def _release(self, released):
        self.free.update(released.block_ids)
        if released.reservation.staging is not None:
            self.pool.give_back(released.reservation.staging)

    def _commit(self, done):
        self.committed.append(done)
        if done.reservation.staging is not None:
            self.pool.give_back(done.reservation.staging)

    def reserve(self, transfer_id, n, transport=common_pb2.KV_TRANSPORT_GRPC, lease_s=10.0):
        ids = sorted(self.free)[:n]
        self.free.difference_update(ids)
        res = self.rx.reserve(transfer_id, "req-" + transfer_id, ids, lease_s)
        reply = decode_pb2.ReserveReply(
            block_ids=ids, epoch=res.epoch, transport=common_pb2.KV_TRANSPORT_GRPC
        )
        if transport == common_pb2.KV_TRANSPORT_SHM:
            ring = self.pool.lend(res.epoch)
            assert ring is not None
            res.staging = ring
            reply.transport, reply.shm_name = transport, ring.name
        return reply

    def close(self):
        self.server.stop(None)
        self.pool.close()


@pytest.fixture
def decode():
    d = Decode()
    yield d
    d.close()


@pytest.fixture
def channel(decode):
    ch = grpc.insecure_channel(f"127.0.0.1:{decode.port}", options=BULK_CHANNEL_OPTIONS)
    yield ch
    ch.close()


def _push(channel, transfer_id, reply, src, src_ids, **kw):
    sender = StreamKvSender(channel, transfer_id, reply, LAYOUT, ring=staging_for(reply), **kw)
    for layer in range(LAYOUT.num_layers):
        k, v = src.read_blocks(layer, src_ids)
        sender.send(layer, list(reply.block_ids), k, v)
    return sender.commit(first_token=123, first_token_logprob=-0.25)


@pytest.mark.parametrize("transport", [common_pb2.KV_TRANSPORT_GRPC, common_pb2.KV_TRANSPORT_SHM])
def test_kv_arrives_byte_for_byte(decode, channel, transport):
    src = TensorKvStore.random(LAYOUT, NUM_BLOCKS, seed=1)
    src_ids = list(range(50, 90))  # 40 blocks x 4 layers x 16 KiB = 2.5 MiB; the 1 MiB ring wraps
    reply = decode.reserve("t1", len(src_ids), transport)
    result = _push(channel, "t1", reply, src, src_ids, chunk_bytes=256 << 10)
    assert result.status == decode_pb2.PUSH_KV_STATUS_COMMITTED, result
    assert result.chunks_applied == LAYOUT.num_layers * 3  # 16 blocks of 16 KiB per 256 KiB chunk
    for layer in range(LAYOUT.num_layers):
        k, v = decode.store.read_blocks(layer, list(reply.block_ids))
        ks, vs = src.read_blocks(layer, src_ids)
        assert torch.equal(k.view(torch.int16), ks.view(torch.int16))
        assert torch.equal(v.view(torch.int16), vs.view(torch.int16))
    (done,) = decode.committed
    assert done.first_token == 123 and done.first_token_logprob == -0.25
    assert decode.pool.free == 1  # ring returned on commit


def test_int8_compressed_transfer_is_close(decode, channel):
    src = TensorKvStore.random(LAYOUT, NUM_BLOCKS, seed=2)
    reply = decode.reserve("tq", 8)
    assert (
        _push(channel, "tq", reply, src, list(range(8)), compression=INT8).status
        == decode_pb2.PUSH_KV_STATUS_COMMITTED
    )
    k, _ = decode.store.read_blocks(0, list(reply.block_ids))
    ks, _ = src.read_blocks(0, list(range(8)))
    rel = ((k.float() - ks.float()).norm() / ks.float().norm()).item()
    assert 0 < rel < 0.01


def test_stale_epoch_is_dropped(decode, channel):
    src = TensorKvStore.random(LAYOUT, NUM_BLOCKS, seed=3)
    old = decode.reserve("t2", 4)
    new = decode.rx.reserve("t2", "req-t2", list(old.block_ids), 10.0)  # re-reserved: a newer epoch
    stale = _push(channel, "t2", old, src, [0, 1, 2, 3])
    assert stale.status == decode_pb2.PUSH_KV_STATUS_REJECTED
    assert stale.chunks_dropped_stale == LAYOUT.num_layers and stale.chunks_applied == 0
    assert not decode.store.k[0][list(old.block_ids)].any()
    fresh = decode_pb2.ReserveReply(block_ids=old.block_ids, epoch=new.epoch)
    assert _push(channel, "t2", fresh, src, [0, 1, 2, 3]).status == decode_pb2.PUSH_KV_STATUS_COMMITTED


def test_corrupted_checksum_is_rejected_and_blocks_freed(decode, channel):
    reply = decode.reserve("t3", 2)
    free_before = len(decode.free)
    sender = StreamKvSender(channel, "t3", reply, LAYOUT)
    payload = bytes(2 * 2 * LAYOUT.block_nbytes)
    header = decode_pb2.KvChunkHeader(
        transfer_id="t3",
        epoch=reply.epoch,
        kind=decode_pb2.KV_CHUNK_KIND_DATA,
        layer=0,
        block_ids=reply.block_ids,
        checksum=12345,
        has_checksum=True,
    )
    sender.send_chunk(header, payload)
    with pytest.raises(KvTransferError, match="DATA_LOSS"):
        sender.commit(first_token=1)
    assert len(decode.free) == free_before + 2 and len(decode.rx.table) == 0


SENDER = textwrap.dedent(
    """
    import sys, time, grpc, torch
    from tandem.v1 import decode_pb2
    from tandem.worker.kv_transport.base import KvLayout
    from tandem.worker.kv_transport.grpc_stream import BULK_CHANNEL_OPTIONS, StreamKvSender
    port, epoch, ids = int(sys.argv[1]), int(sys.argv[2]), [int(x) for x in sys.argv[3].split(",")]
    layout = KvLayout(4, 16, 4, 64, torch.bfloat16)
    ch = grpc.insecure_channel(f"127.0.0.1:{port}", options=BULK_CHANNEL_OPTIONS)
    s = StreamKvSender(ch, "t4", decode_pb2.ReserveReply(block_ids=ids, epoch=epoch), layout)
    k = torch.ones(len(ids), 16, 4, 64, dtype=torch.bfloat16)
    s.send(0, ids, k, k)
    print("sent", flush=True)
    time.sleep(600)
    """
)


def test_killed_sender_frees_its_reservation(decode):
    reply = decode.reserve("t4", 6, lease_s=30.0)
    free_before = len(decode.free)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            SENDER,
            str(decode.port),
            str(reply.epoch),
            ",".join(map(str, reply.block_ids)),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "sent"
        deadline = time.monotonic() + 20
        while not decode.rx.table.get("t4").received and time.monotonic() < deadline:
            time.sleep(0.02)
        assert decode.rx.table.get("t4").received, "first layer never arrived"
        os.kill(proc.pid, signal.SIGKILL)
        while len(decode.free) < free_before + 6 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        proc.kill()
        proc.wait()
    assert len(decode.free) == free_before + 6, "blocks of the killed sender's transfer were not returned"
    assert len(decode.rx.table) == 0


def test_reservation_without_a_sender_expires(decode):
    decode.reserve("t5", 3, lease_s=0.2)
    assert decode.rx.expire() == []
    time.sleep(0.25)
    (gone,) = decode.rx.expire()
    assert gone.reason == "lease expired" and len(decode.free) == NUM_BLOCKS
