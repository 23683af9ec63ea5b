"""Scripted gRPC workers for the router's backend tests: a decode worker's handshake and load report, and
servicers served on loopback ports, so each test writes only the behaviour it scripts."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent import futures
from typing import Any

import grpc

from tandem.v1 import common_pb2, decode_pb2_grpc

INFO = dict(model_name="tiny", dtype="float32", num_layers=2, num_kv_heads=2, head_dim=8, block_size=16)


class ScriptedDecode(decode_pb2_grpc.DecodeServiceServicer):
    """A decode worker that introduces itself and reports room for 100 blocks; subclasses script the rest."""

    def Handshake(self, request, context):
        info = common_pb2.WorkerInfo(worker_id="d", role=common_pb2.WORKER_ROLE_DECODE, **INFO)
        return common_pb2.HandshakeReply(worker=info)

    def Load(self, request, context):
        return common_pb2.LoadReport(worker_id="d", free_kv_blocks=100, total_kv_blocks=100)


def serve_on_loopback(
    servicers: Sequence[tuple[Callable[[Any, grpc.Server], None], Any]], threads: int = 4
) -> tuple[list[grpc.Server], list[str]]:
    """Each (add_*_to_server, servicer) on its own server at a free loopback port: the servers and
    addresses."""
    servers, addresses = [], []
    for add, servicer in servicers:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=threads))
        add(servicer, server)
        addresses.append(f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}")
        server.start()
        servers.append(server)
    return servers, addresses
