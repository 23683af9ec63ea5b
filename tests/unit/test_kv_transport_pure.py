"""The KV transport's pure decisions: chunking, the codec, compression error, handshake, staging offsets."""

from __future__ import annotations

import pytest
import torch

from tandem.v1 import common_pb2 as C
from tandem.worker.kv_transport.base import InvalidChunk, KvLayout, dtype_from_name, dtype_name
from tandem.worker.kv_transport.chunking import plan_chunks
from tandem.worker.kv_transport.codec import INT8, NONE, chunk_nbytes, decode_blocks, encode_blocks
from tandem.worker.kv_transport.compression import dequantize_int8, quantize_int8
from tandem.worker.kv_transport.handshake import (
    check_compatible,
    choose_transport,
    reserve_transport,
    reserve_transports,
)
from tandem.worker.kv_transport.staging import ring_start

LAYOUT = KvLayout(num_layers=2, block_size=16, num_kv_heads=4, head_dim=64, dtype=torch.bfloat16)


def test_plan_chunks_covers_every_block_once_within_the_limit():
    per_block = 2 * LAYOUT.block_nbytes  # 16 KiB of keys+values
    plan = plan_chunks(100, per_block, max_chunk_bytes=1 << 20)
    assert [i for r in plan for i in r] == list(range(100))
    assert all(len(r) * per_block <= 1 << 20 for r in plan)
    assert len(plan) == 2  # 64 blocks per MiB


def test_plan_chunks_sends_an_oversized_block_alone():
    assert plan_chunks(3, 10 << 20, max_chunk_bytes=1 << 20) == [range(0, 1), range(1, 2), range(2, 3)]
    assert plan_chunks(0, 100) == []


def test_codec_round_trip_is_exact_uncompressed():
    k = torch.randn(5, *LAYOUT.block_shape).to(LAYOUT.dtype)
    v = torch.randn(5, *LAYOUT.block_shape).to(LAYOUT.dtype)
    parts, scales = encode_blocks(k, v)
    data = torch.cat(parts)
    assert data.numel() == chunk_nbytes(LAYOUT, 5) and scales == []
    k2, v2 = decode_blocks(data, LAYOUT, 5)
    assert torch.equal(k2, k) and torch.equal(v2, v)


def test_codec_rejects_a_payload_of_the_wrong_size():
    parts, _ = encode_blocks(
        torch.zeros(2, *LAYOUT.block_shape, dtype=LAYOUT.dtype),
        torch.zeros(2, *LAYOUT.block_shape, dtype=LAYOUT.dtype),
    )
    with pytest.raises(InvalidChunk):
        decode_blocks(torch.cat(parts), LAYOUT, 3)


def test_int8_compression_error_is_small_and_halves_the_bytes():
    torch.manual_seed(0)
    k = (torch.randn(32, *LAYOUT.block_shape) * torch.linspace(0.1, 10, 32)[:, None, None, None]).to(
        LAYOUT.dtype
    )
    v = torch.randn(32, *LAYOUT.block_shape).to(LAYOUT.dtype)
    parts, scales = encode_blocks(k, v, INT8)
    data = torch.cat(parts)
    assert data.numel() == chunk_nbytes(LAYOUT, 32, INT8) == chunk_nbytes(LAYOUT, 32, NONE) // 2
    k2, v2 = decode_blocks(data, LAYOUT, 32, INT8, scales)
    for orig, back in ((k, k2), (v, v2)):
        err = (back.float() - orig.float()).abs()
        per_block_max = orig.float().abs().reshape(32, -1).amax(1)
        # rounding to 1/127 of each block's absmax (+ bf16 rounding of the result)
        assert (err.reshape(32, -1).amax(1) <= per_block_max / 254 + per_block_max / 128).all()
        rel = (err.norm() / orig.float().norm()).item()
        assert rel < 0.01, rel


def test_quantize_handles_an_all_zero_block():
    q, s = quantize_int8(torch.zeros(2, 4))
    assert s.tolist() == [0.0, 0.0] and torch.equal(dequantize_int8(q, s, torch.float32), torch.zeros(2, 4))


def _info(**kw):
    base = dict(
        worker_id="w",
        model_name="tiny",
        dtype="bfloat16",
        num_layers=2,
        num_kv_heads=4,
        head_dim=64,
        block_size=16,
        protocol_version=1,
        host_id="h1",
        transports=[C.KV_TRANSPORT_GRPC, C.KV_TRANSPORT_SHM],
        shm_capable=True,
        cuda_device=-1,
    )
    base.update(kw)
    return C.WorkerInfo(**base)


def test_compatible_workers_have_no_problems():
    assert check_compatible(_info(role=C.WORKER_ROLE_PREFILL), _info(role=C.WORKER_ROLE_DECODE)) == []


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("model_name", "other"),
        ("dtype", "float16"),
        ("num_layers", 3),
        ("num_kv_heads", 8),
        ("head_dim", 128),
        ("block_size", 32),
    ],
)
def test_each_layout_mismatch_is_named(field, value):
    problems = check_compatible(_info(), _info(**{field: value}))
    assert len(problems) == 1 and field in problems[0]


def test_two_prefill_workers_cannot_pair():
    problems = check_compatible(_info(role=C.WORKER_ROLE_PREFILL), _info(role=C.WORKER_ROLE_PREFILL))
    assert problems == ["WORKER_ROLE_PREFILL cannot receive KV"]


def test_choose_transport():
    same = _info(), _info()
    assert choose_transport(*same) == C.KV_TRANSPORT_SHM
    assert choose_transport(_info(), _info(host_id="h2")) == C.KV_TRANSPORT_GRPC
    assert choose_transport(_info(host_id=""), _info(host_id="")) == C.KV_TRANSPORT_GRPC
    assert choose_transport(_info(), _info(shm_capable=False)) == C.KV_TRANSPORT_GRPC
    gpu = dict(
        cuda_device=0,
        cuda_device_uuid="GPU-a",
        transports=[C.KV_TRANSPORT_GRPC, C.KV_TRANSPORT_SHM, C.KV_TRANSPORT_CUDA_IPC],
    )
    assert choose_transport(_info(**gpu), _info(**gpu)) == C.KV_TRANSPORT_CUDA_IPC  # one host, one GPU
    # another GPU (a pod sees only its own: cuda:0 in both, another UUID) cannot be opened by the sender
    assert choose_transport(_info(**gpu), _info(**{**gpu, "cuda_device_uuid": "GPU-b"})) == C.KV_TRANSPORT_SHM
    assert (
        choose_transport(_info(**gpu), _info(**{**gpu, "cuda_device": -1, "cuda_device_uuid": ""}))
        == C.KV_TRANSPORT_SHM
    )
    assert choose_transport(_info(**gpu), _info(**{**gpu, "host_id": "h2"})) == C.KV_TRANSPORT_GRPC


GRPC, SHM, NONE_IN_COMMON = C.KV_TRANSPORT_GRPC, C.KV_TRANSPORT_SHM, C.KV_TRANSPORT_UNSPECIFIED


def test_forced_transports_are_honoured_or_refused():
    shm_only = dict(transports=[SHM])
    grpc_only = dict(transports=[GRPC], shm_capable=False)
    assert choose_transport(_info(**shm_only), _info(**shm_only)) == SHM
    assert choose_transport(_info(**shm_only), _info(**{**shm_only, "host_id": "h2"})) == NONE_IN_COMMON
    assert choose_transport(_info(), _info(**grpc_only)) == GRPC  # same host, but the receiver forces gRPC
    assert choose_transport(_info(**shm_only), _info(**grpc_only)) == NONE_IN_COMMON
    (problem,) = check_compatible(_info(**shm_only), _info(**grpc_only))
    assert "no KV transport in common" in problem and "KV_TRANSPORT_SHM" in problem


@pytest.mark.parametrize(
    "offered, host, receiver, granted",
    [
        ([GRPC, SHM], "h1", {}, SHM),  # same host, both offer shared memory
        ([GRPC, SHM], "h2", {}, GRPC),  # another host
        ([GRPC, SHM], "", {}, GRPC),  # a sender that does not say where it runs
        ([], "h1", {}, GRPC),  # a sender that offers nothing: the stream, the protocol's baseline
        (
            [SHM],
            "h1",
            {"transports": [GRPC], "shm_capable": False},
            NONE_IN_COMMON,
        ),  # forced shm meets forced grpc
        ([SHM], "h2", {"transports": [SHM]}, NONE_IN_COMMON),  # forced shm across hosts
        ([GRPC, SHM], "h1", {"transports": [GRPC], "shm_capable": False}, GRPC),
        (
            [GRPC, SHM, C.KV_TRANSPORT_CUDA_IPC],
            "h1",
            {"cuda_device": 0, "transports": [GRPC, SHM, C.KV_TRANSPORT_CUDA_IPC]},
            SHM,
        ),
    ],
)
def test_reserve_transport_is_choose_transport_over_what_the_reservation_offers(
    offered, host, receiver, granted
):
    assert reserve_transport(offered, host, _info(**receiver)) == granted


def test_a_reservation_from_a_prefill_worker_on_the_same_gpu_gets_cuda_ipc():
    cuda = C.KV_TRANSPORT_CUDA_IPC
    receiver = _info(cuda_device=0, cuda_device_uuid="GPU-a", transports=[cuda, GRPC], shm_capable=False)
    assert reserve_transport([cuda, GRPC], "h1", receiver, "GPU-a") == cuda
    assert reserve_transports([cuda, GRPC], "h1", receiver, "GPU-a") == [
        cuda,
        GRPC,
    ]  # the stream when every buffer is lent
    assert reserve_transport([cuda, GRPC], "h1", receiver, "GPU-b") == GRPC  # a GPU the sender cannot open
    assert reserve_transport([cuda, GRPC], "h2", receiver, "GPU-a") == GRPC  # another host
    assert reserve_transport([cuda, GRPC], "h1", receiver) == GRPC  # a sender that does not name its GPU


def test_ring_start_never_wraps_a_chunk():
    assert ring_start(0, 10, 100) == 0
    assert ring_start(90, 10, 100) == 90
    assert ring_start(95, 10, 100) == 100
    assert ring_start(250, 60, 100) == 300
    with pytest.raises(ValueError):
        ring_start(0, 101, 100)


def test_dtype_names_round_trip():
    assert dtype_from_name(dtype_name(torch.bfloat16)) is torch.bfloat16
    with pytest.raises(ValueError):
        dtype_from_name("Tensor")
