"""The CUDA IPC path: a sender process copies KV on the GPU into the decode process's staging buffer."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from concurrent import futures

import grpc
import pytest
import torch

from tandem.v1 import common_pb2, decode_pb2
from tandem.worker.kv_transport.base import KvLayout
from tandem.worker.kv_transport.grpc_stream import BULK_CHANNEL_OPTIONS, push_kv_handler
from tandem.worker.kv_transport.receiver import KvReceiver
from tandem.worker.kv_transport.tensor_store import TensorKvStore

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

LAYOUT = KvLayout(num_layers=4, block_size=16, num_kv_heads=8, head_dim=128, dtype=torch.bfloat16)

SENDER = textwrap.dedent(
    """
    import sys, grpc, torch
    from tandem.v1 import decode_pb2
    from tandem.worker.kv_transport.base import KvLayout
    from tandem.worker.kv_transport.grpc_stream import BULK_CHANNEL_OPTIONS, StreamKvSender, staging_for
    reply = decode_pb2.ReserveReply.FromString(bytes.fromhex(sys.stdin.read().strip()))
    layout = KvLayout(4, 16, 8, 128, torch.bfloat16)
    g = torch.Generator().manual_seed(7)
    ch = grpc.insecure_channel(f"127.0.0.1:{sys.argv[1]}", options=BULK_CHANNEL_OPTIONS)
    ring = staging_for(reply, cuda_device=0)
    assert ring is not None and ring.region.is_cuda
    s = StreamKvSender(ch, "g1", reply, layout, ring=ring, chunk_bytes=256 << 10)
    n = len(reply.block_ids)
    for layer in range(layout.num_layers):
        k = torch.randn(n, 16, 8, 128, generator=g).bfloat16().cuda()
        v = torch.randn(n, 16, 8, 128, generator=g).bfloat16().cuda()
        s.send(layer, list(reply.block_ids), k, v)
    print(s.commit(first_token=5).status, flush=True)
    """
)


def test_cuda_ipc_transfer_is_exact():
    from tandem.worker.kv_transport.cuda_ipc import create_cuda_ring, export_buffer

    store = TensorKvStore(LAYOUT, 64, device="cuda")
    committed = []
    rx = KvReceiver(store, LAYOUT, on_release=lambda r: None, on_commit=committed.append)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=BULK_CHANNEL_OPTIONS)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("tandem.v1.DecodeService", {"PushKv": push_kv_handler(rx)}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    ring = create_cuda_ring(1 << 20)
    try:
        ids = list(range(10, 50))  # 40 blocks x 64 KiB per layer: the 1 MiB ring wraps many times
        res = rx.reserve("g1", "rq", ids, lease_s=60)
        res.staging = ring
        ring.lend(res.epoch)
        reply = decode_pb2.ReserveReply(
            block_ids=ids,
            epoch=res.epoch,
            transport=common_pb2.KV_TRANSPORT_CUDA_IPC,
            shm_name=ring.name,
            cuda_ipc=export_buffer(ring),
        )
        out = subprocess.run(
            [sys.executable, "-c", SENDER, str(port)],
            input=reply.SerializeToString().hex(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == str(decode_pb2.PUSH_KV_STATUS_COMMITTED)
        g = torch.Generator().manual_seed(7)
        for layer in range(LAYOUT.num_layers):
            k = torch.randn(40, 16, 8, 128, generator=g).bfloat16()
            v = torch.randn(40, 16, 8, 128, generator=g).bfloat16()
            assert torch.equal(store.k[layer][10:50].cpu(), k) and torch.equal(store.v[layer][10:50].cpu(), v)
        assert committed and committed[0].first_token == 5
    finally:
        server.stop(None)
        ring.close()
