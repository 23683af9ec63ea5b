"""KV transfer throughput: gRPC stream and shared-memory staging against a raw loopback TCP socket, one run.

    python bench/kv_transfer.py [--sizes-mib 1 16 128] [--repeat 3]

The decode side (a PushKv/Reserve server over a plain tensor store) runs in this process; the sender runs
in a child process, as a prefill worker would. Each figure is the best of --repeat timed transfers, from
the first byte sent to the decode worker's acknowledgement that every block is written.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import socket
import struct
import threading
import time
import uuid
from concurrent import futures
from functools import partial

import grpc
import torch

from bench._smoke import add_smoke, smoke_sizes
from tandem.v1 import common_pb2, decode_pb2, decode_pb2_grpc
from tandem.worker.kv_transport.base import KvLayout
from tandem.worker.kv_transport.codec import as_bytes
from tandem.worker.kv_transport.grpc_stream import (
    BULK_CHANNEL_OPTIONS,
    StreamKvSender,
    add_decode_service,
    staging_for,
)
from tandem.worker.kv_transport.receiver import KvReceiver
from tandem.worker.kv_transport.staging import StagingPool, StagingRing
from tandem.worker.kv_transport.tensor_store import TensorKvStore

LAYOUT = KvLayout(num_layers=8, block_size=16, num_kv_heads=8, head_dim=128, dtype=torch.bfloat16)
BLOCK_ALL_LAYERS = 2 * LAYOUT.num_layers * LAYOUT.block_nbytes  # 512 KiB
G = torch.Generator().manual_seed(0)


class MiniDecode(decode_pb2_grpc.DecodeServiceServicer):
    """Reserve + PushKv over a TensorKvStore, enough for the transfer to be measured end to end."""

    def __init__(self, num_blocks: int, ring_bytes: int):
        self.store = TensorKvStore(LAYOUT, num_blocks)
        self.free = list(range(num_blocks))
        self.pool = StagingPool([StagingRing.create_shm(ring_bytes)])
        self.rx = KvReceiver(self.store, LAYOUT, on_release=self._release, on_commit=self._release)

    def _release(self, ended) -> None:
        res = ended.reservation
        self.free.extend(res.block_ids)
        if res.staging is not None:
            self.pool.give_back(res.staging)

    def Reserve(self, request, context):
        n = -(-len(request.prompt_token_ids) // LAYOUT.block_size)
        ids, self.free = self.free[:n], self.free[n:]
        res = self.rx.reserve(request.transfer_id, request.request_id, ids, request.lease_ms / 1000)
        reply = decode_pb2.ReserveReply(
            block_ids=ids, epoch=res.epoch, transport=common_pb2.KV_TRANSPORT_GRPC
        )
        if (
            common_pb2.KV_TRANSPORT_SHM in request.transports
            and (ring := self.pool.lend(res.epoch)) is not None
        ):
            res.staging = ring
            reply.transport, reply.shm_name, reply.shm_capacity = (
                common_pb2.KV_TRANSPORT_SHM,
                ring.name,
                ring.capacity,
            )
        return reply


def raw_tcp_server(listener: socket.socket, stop: threading.Event) -> None:
    buf = bytearray(256 << 20)
    view = memoryview(buf)
    while not stop.is_set():
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while True:
                head = conn.recv(8, socket.MSG_WAITALL)
                if len(head) < 8:
                    break
                (n,) = struct.unpack("<Q", head)
                got = 0
                while got < n:
                    got += conn.recv_into(view[got:n], n - got)
                conn.sendall(b"k")


def send_raw(sock: socket.socket, data: bytes) -> None:
    sock.sendall(struct.pack("<Q", len(data)))
    sock.sendall(data)
    assert sock.recv(1) == b"k"


def push(channel, reserve, kv, transport: int, checksum: bool | None) -> None:
    nblocks = kv[0][0].shape[0]
    req = decode_pb2.ReserveRequest(
        transfer_id=uuid.uuid4().hex,
        request_id="bench",
        prompt_token_ids=[0] * (nblocks * LAYOUT.block_size),
        lease_ms=60_000,
        transports=[transport],
    )
    reply = reserve(req)
    assert reply.transport == transport
    sender = StreamKvSender(
        channel, req.transfer_id, reply, LAYOUT, ring=staging_for(reply), checksum=checksum
    )
    for layer, (k, v) in enumerate(kv):
        sender.send(layer, list(reply.block_ids), k, v)
    result = sender.commit(first_token=1)
    assert result.status == decode_pb2.PUSH_KV_STATUS_COMMITTED, result
    if sender.ring is not None:
        sender.ring.close()


def sender_main(grpc_port: int, tcp_port: int, sizes_mib: list[int], repeat: int, out) -> None:
    torch.set_num_threads(1)
    channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}", options=BULK_CHANNEL_OPTIONS)
    reserve = channel.unary_unary(
        "/tandem.v1.DecodeService/Reserve",
        request_serializer=decode_pb2.ReserveRequest.SerializeToString,
        response_deserializer=decode_pb2.ReserveReply.FromString,
    )
    sock = socket.create_connection(("127.0.0.1", tcp_port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    results = {}
    empty = [(torch.empty(0, *LAYOUT.block_shape, dtype=LAYOUT.dtype),) * 2] * LAYOUT.num_layers
    fixed = []
    for _ in range(repeat + 1):
        t0 = time.perf_counter()
        push(channel, reserve, empty, common_pb2.KV_TRANSPORT_GRPC, None)
        fixed.append(time.perf_counter() - t0)
    results["fixed_ms"] = min(fixed[1:]) * 1e3
    for mib in sizes_mib:
        nblocks = max(1, (mib << 20) // BLOCK_ALL_LAYERS)
        shape = (nblocks, *LAYOUT.block_shape)
        kv = [
            (torch.randn(shape, generator=G).bfloat16(), torch.randn(shape, generator=G).bfloat16())
            for _ in range(LAYOUT.num_layers)
        ]
        cases = {
            "raw_tcp": partial(
                send_raw, sock, b"".join(as_bytes(t).numpy().tobytes() for pair in kv for t in pair)
            ),
            "grpc": partial(push, channel, reserve, kv, common_pb2.KV_TRANSPORT_GRPC, None),
            "grpc_nocrc": partial(push, channel, reserve, kv, common_pb2.KV_TRANSPORT_GRPC, False),
            "shm": partial(push, channel, reserve, kv, common_pb2.KV_TRANSPORT_SHM, None),
        }
        row = {}
        for name, fn in cases.items():
            fn()  # warm-up
            best = float("inf")
            for _ in range(repeat):
                t0 = time.perf_counter()
                fn()
                best = min(best, time.perf_counter() - t0)
            row[name] = nblocks * BLOCK_ALL_LAYERS / best / 1e9
        results[mib] = (nblocks * BLOCK_ALL_LAYERS, row)
    out.send(results)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mib", type=int, nargs="+", default=[1, 16, 128])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--ring-mib", type=int, default=32)
    add_smoke(parser)
    args = smoke_sizes(parser.parse_args(argv), sizes_mib=[1], repeat=1, ring_mib=4)
    torch.set_num_threads(1)

    num_blocks = max(1, (max(args.sizes_mib) << 20) // BLOCK_ALL_LAYERS)
    decode = MiniDecode(num_blocks, args.ring_mib << 20)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=BULK_CHANNEL_OPTIONS)
    add_decode_service(server, decode, decode.rx)
    grpc_port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()
    threading.Thread(target=raw_tcp_server, args=(listener, stop), daemon=True).start()

    ctx = mp.get_context("spawn")
    ours, theirs = ctx.Pipe()
    child = ctx.Process(
        target=sender_main, args=(grpc_port, listener.getsockname()[1], args.sizes_mib, args.repeat, theirs)
    )
    child.start()
    results = ours.recv()
    child.join()
    stop.set()
    listener.close()
    server.stop(None)
    decode.pool.close()

    print(
        f"KV layout: {LAYOUT.num_layers} layers x [{LAYOUT.block_size}, {LAYOUT.num_kv_heads}, "
        f"{LAYOUT.head_dim}] {LAYOUT.dtype}, best of {args.repeat}; GB/s = 1e9 bytes/s"
    )
    print(
        f"{'size':>8} {'raw TCP':>9} {'gRPC':>9} {'gRPC-nocrc':>11} {'shm':>9} {'gRPC/raw':>9} "
        f"{'nocrc/raw':>10} {'shm/gRPC':>9}"
    )
    fixed_ms = results.pop("fixed_ms")
    for nbytes, r in results.values():
        print(
            f"{nbytes / 2**20:>6.0f}Mi {r['raw_tcp']:>9.2f} {r['grpc']:>9.2f} {r['grpc_nocrc']:>11.2f} "
            f"{r['shm']:>9.2f} {r['grpc'] / r['raw_tcp']:>9.2f} {r['grpc_nocrc'] / r['raw_tcp']:>10.2f} "
            f"{r['shm'] / r['grpc']:>9.2f}"
        )
    print(f"fixed cost of one transfer (Reserve + empty PushKv stream + commit): {fixed_ms:.2f} ms")
    assert decode.rx.table.reserved_blocks() == 0 and len(decode.free) == num_blocks, "leaked KV blocks"
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
