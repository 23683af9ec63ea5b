"""The served decode worker grants CUDA IPC: on a GPU its offer includes it, the registry stages CUDA buffers,
and a prefill worker on the same GPU is handed one; another GPU, or every buffer lent, gets the stream."""

from __future__ import annotations

from concurrent import futures

import grpc
import pytest
import torch

from tandem.v1 import common_pb2 as C
from tandem.v1 import decode_pb2, decode_pb2_grpc
from tandem.worker.api.params import SamplingParams
from tandem.worker.api.wire import params_to_proto
from tandem.worker.engine.loading import load_model
from tandem.worker.engine.runner.engine import Engine, EngineConfig
from tandem.worker.engine.runner.engine_loop import EngineLoop
from tandem.worker.kv_transport import transports
from tandem.worker.kv_transport.grpc_stream import BULK_CHANNEL_OPTIONS
from tandem.worker.serve.decode import DecodeServicer, add_to_server
from tandem.worker.serve.wire import offered_transports, worker_info

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_a_prefill_worker_on_the_same_gpu_is_granted_a_cuda_buffer(tiny_model_dir):
    engine = Engine(
        load_model(tiny_model_dir, device="cuda:0"), EngineConfig(block_size=16, num_kv_blocks=64)
    )
    loop = EngineLoop(engine).start()
    offered = offered_transports("auto", "cuda:0")
    info = worker_info(engine, "decode-0", "decode", "tiny", offered)
    assert offered[0] == C.KV_TRANSPORT_CUDA_IPC and info.cuda_device_uuid
    staging = {
        t.kind: t.staging("cuda:0") for t in transports.REGISTRY if t.staged and t.kind in info.transports
    }
    servicer = DecodeServicer(loop, info, staging)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=BULK_CHANNEL_OPTIONS)
    add_to_server(server, servicer)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    stub = decode_pb2_grpc.DecodeServiceStub(grpc.insecure_channel(f"127.0.0.1:{port}"))

    def reserve(transfer_id: str, uuid: str) -> decode_pb2.ReserveReply:
        return stub.Reserve(
            decode_pb2.ReserveRequest(
                transfer_id=transfer_id,
                request_id="r-" + transfer_id,
                prompt_token_ids=list(range(1, 40)),
                sampling=params_to_proto(SamplingParams(max_tokens=4)),
                lease_ms=5000,
                transports=offered,
                prefill_host_id=info.host_id,
                prefill_cuda_device_uuid=uuid,
            ),
            timeout=30,
        )

    try:
        granted = [reserve(f"t{i}", info.cuda_device_uuid) for i in range(3)]
        assert [r.transport for r in granted[:2]] == [C.KV_TRANSPORT_CUDA_IPC] * 2
        assert all(r.HasField("cuda_ipc") and r.cuda_ipc.device == 0 and r.shm_name for r in granted[:2])
        assert granted[2].transport == C.KV_TRANSPORT_GRPC  # both buffers lent: the stream
        assert reserve("other", "GPU-another").transport == C.KV_TRANSPORT_GRPC
    finally:
        server.stop(None)
        servicer.close()
        loop.stop()
