"""The KV transfer with an 8-bit cache: packed blocks travel as they are (scales included), the wire
compression is a no-op for them, and two workers that store KV differently are refused with a clear error."""

from __future__ import annotations

import pytest
import torch

from tandem.v1 import common_pb2 as C
from tandem.worker.engine.layers.kv_int8 import pack
from tandem.worker.engine.loading import load_model
from tandem.worker.engine.runner.engine import Engine, EngineConfig
from tandem.worker.kv_transport.base import InvalidChunk, KvLayout
from tandem.worker.kv_transport.codec import (
    INT8,
    NONE,
    chunk_nbytes,
    decode_blocks,
    encode_blocks,
    wire_compression,
)
from tandem.worker.kv_transport.handshake import check_compatible
from tandem.worker.kv_transport.tensor_store import TensorKvStore
from tandem.worker.serve.wire import worker_info

PACKED = KvLayout(
    num_layers=2, block_size=16, num_kv_heads=4, head_dim=64, dtype=torch.bfloat16, kv_cache_dtype="int8"
)
FULL = KvLayout(num_layers=2, block_size=16, num_kv_heads=4, head_dim=64, dtype=torch.bfloat16)


def test_a_packed_block_is_its_values_and_scales_in_bytes():
    assert PACKED.block_shape == (16, 4, 68) and PACKED.storage_dtype == torch.uint8
    assert PACKED.block_nbytes == 16 * 4 * 68
    assert FULL.block_nbytes / PACKED.block_nbytes == pytest.approx(2 * 64 / 68)


def test_packed_blocks_round_trip_byte_for_byte():
    k = pack(torch.randn(5, 16, 4, 64)).to(torch.uint8)
    v = pack(torch.randn(5, 16, 4, 64))
    parts, scales = encode_blocks(k, v)
    data = torch.cat(parts)
    assert data.numel() == chunk_nbytes(PACKED, 5) and scales == []
    k2, v2 = decode_blocks(data, PACKED, 5)
    assert torch.equal(k2, k) and torch.equal(v2, v)
    store = TensorKvStore(PACKED, 8)
    store.write_blocks(1, [6, 2, 3, 0, 7], k2, v2)
    got_k, got_v = store.read_blocks(1, [6, 2, 3, 0, 7])
    assert torch.equal(got_k, k) and torch.equal(got_v, v)


def test_wire_compression_is_a_no_op_for_an_8_bit_cache():
    assert wire_compression("int8", "auto") == INT8
    assert wire_compression("int8", "int8") == NONE
    assert wire_compression("none", "int8") == NONE
    packed = pack(torch.randn(1, 16, 4, 64))
    with pytest.raises(ValueError, match="travels raw"):
        encode_blocks(packed, packed, INT8)
    with pytest.raises(InvalidChunk, match="uncompressed"):
        decode_blocks(
            torch.zeros(chunk_nbytes(PACKED, 1, INT8), dtype=torch.uint8), PACKED, 1, INT8, [1.0, 1.0]
        )


@pytest.fixture(scope="module")
def infos(tiny_model_dir):
    model = load_model(tiny_model_dir)

    def info(role: str, kv_cache_dtype: str) -> C.WorkerInfo:
        engine = Engine(model, EngineConfig(block_size=16, num_kv_blocks=4, kv_cache_dtype=kv_cache_dtype))
        return worker_info(engine, f"{role}-{kv_cache_dtype}", role, "tiny")

    return info


def test_worker_info_carries_the_cache_storage_and_the_layout_follows(infos):
    info = infos("decode", "int8")
    assert info.kv_cache_dtype == "int8" and info.dtype == "float32"
    layout = KvLayout.from_worker_info(info)
    assert layout.packed and layout.block_shape[2] == info.head_dim + 4
    assert not KvLayout.from_worker_info(C.WorkerInfo(dtype="float32", head_dim=8)).packed  # older peers


def test_prefill_and_decode_must_store_kv_alike(infos):
    assert check_compatible(infos("prefill", "int8"), infos("decode", "int8")) == []
    (problem,) = check_compatible(infos("prefill", "int8"), infos("decode", "auto"))
    assert "kv_cache_dtype differs" in problem and "'int8'" in problem and "'auto'" in problem
    assert "engine.kvCacheDtype" in problem
