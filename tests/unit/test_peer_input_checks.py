"""What a peer with a valid identity may still not send (pure parts): non-finite KV scales, a CUDA IPC
description reaching past its buffer, a decode address that is a socket path or a gRPC scheme, and KV that
arrived unauthenticated entering the shared prefix cache."""

from __future__ import annotations

import math

import pytest
import torch

from tandem.v1 import decode_pb2
from tandem.worker.api.params import SamplingParams
from tandem.worker.engine.loading import load_model
from tandem.worker.engine.runner.engine import Engine, EngineConfig
from tandem.worker.kv_transport.base import KvLayout
from tandem.worker.kv_transport.codec import INT8, InvalidChunk, chunk_nbytes, decode_blocks
from tandem.worker.kv_transport.cuda_ipc import check_buffer
from tandem.worker.serve.prefill import check_decode_address


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_chunk_with_a_non_finite_scale_is_refused(bad):
    layout = KvLayout(num_layers=1, block_size=4, num_kv_heads=2, head_dim=8, dtype=torch.float32)
    data = torch.zeros(chunk_nbytes(layout, 1, INT8), dtype=torch.uint8)
    decode_blocks(data, layout, 1, INT8, [0.5, 0.5])
    with pytest.raises(InvalidChunk, match="finite"):
        decode_blocks(data, layout, 1, INT8, [0.5, bad])


def test_a_cuda_ipc_description_must_cover_exactly_its_buffer():
    good = decode_pb2.CudaIpcBuffer(
        device=0,
        handle=bytes(64),
        storage_size=1 << 20,
        ref_counter_name="/torch_4242_1234567_0",
        event_handle=bytes(64),
    )
    assert check_buffer(good, 1 << 20, local_device=0) == []
    for field, value in (("storage_offset", 1 << 19), ("ref_counter_offset", 1 << 40)):
        bad = decode_pb2.CudaIpcBuffer()
        bad.CopyFrom(good)
        setattr(bad, field, value)
        assert check_buffer(bad, 1 << 20, local_device=0), field


@pytest.mark.parametrize(
    "address", ["10.0.0.7:50051", "[fd00::7]:50051", "llama-decode-0.llama.ns.svc:50051"]
)
def test_pod_addresses_may_be_dialled(address):
    assert check_decode_address(address) is None


@pytest.mark.parametrize(
    "address",
    [
        "unix:/run/docker.sock",
        "unix:123",
        "unix-abstract:x",
        "dns:///a.b:1",
        "ipv4:10.0.0.1:1",
        "localhost:1",
        "10.0.0.7",
        "10.0.0.7:0",
        "10.0.0.7:99999",
        "a..b:1",
        "-a.b:1",
        "",
        ":50051",
    ],
)
def test_socket_paths_schemes_and_non_addresses_are_not(address):
    assert check_decode_address(address)


def test_unauthenticated_kv_never_enters_the_prefix_cache(tiny_model_dir):
    engine = Engine(load_model(tiny_model_dir), EngineConfig(block_size=4, num_kv_blocks=32))
    prompt = list(range(10, 30))
    params = SamplingParams(max_tokens=2, ignore_eos=True)
    for share, cached_after in ((False, 0), (True, 16)):
        table, cached = engine.reserve(prompt, params)
        assert cached == 0
        engine.admit_prefilled(f"r-{share}", prompt, params, table, first_token=1, share=share)
        _, cached = engine.reserve(prompt, params)  # what the next request with this prompt would skip
        assert cached == cached_after, share
        while engine.has_work():
            engine.step()
        engine.blocks.release(_)
