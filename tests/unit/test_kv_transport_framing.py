"""KvChunk framing by hand is byte-identical to protobuf and parses back without copying the payload."""

from __future__ import annotations

import os

import pytest
import xxhash

from tandem.v1 import decode_pb2
from tandem.worker.kv_transport.framing import checksum, pack_chunk, unpack_chunk


def _header(**kw):
    base = dict(
        transfer_id="t-1", epoch=7, kind=decode_pb2.KV_CHUNK_KIND_DATA, layer=3, block_ids=[5, 9, 300]
    )
    base.update(kw)
    return decode_pb2.KvChunkHeader(**base)


@pytest.mark.parametrize("size", [0, 1, 127, 128, 16384, 3 << 20])
def test_pack_equals_protobuf_serialization(size):
    payload = os.urandom(size)
    header = _header(checksum=checksum([payload]), has_checksum=True, scales=[0.5, 0.25])
    ours = pack_chunk(header, [payload[: size // 3], payload[size // 3 :]])
    assert ours == decode_pb2.KvChunk(header=header, payload=payload).SerializeToString()


def test_unpack_round_trip_gives_a_view():
    payload = os.urandom(4096)
    data = pack_chunk(_header(), [payload])
    header, view = unpack_chunk(data)
    assert header == _header()
    assert isinstance(view, memoryview) and view.obj is data and bytes(view) == payload


def test_unpack_reads_what_protobuf_writes_and_skips_unknown_fields():
    msg = decode_pb2.KvChunk(header=_header(first_token=42), payload=b"abc").SerializeToString()
    extra = b"\x18\x96\x01" + b"\x25\x01\x02\x03\x04"  # unknown varint field 3 and fixed32 field 4
    header, view = unpack_chunk(msg + extra)
    assert header.first_token == 42 and bytes(view) == b"abc"


def test_commit_without_payload_has_empty_view():
    header, view = unpack_chunk(pack_chunk(_header(kind=decode_pb2.KV_CHUNK_KIND_COMMIT)))
    assert header.kind == decode_pb2.KV_CHUNK_KIND_COMMIT and len(view) == 0


def test_truncated_chunk_is_an_error():
    data = pack_chunk(_header(), [b"x" * 100])
    with pytest.raises(ValueError):
        unpack_chunk(data[:-10])


def test_checksum_of_parts_equals_xxh3_of_concatenation():
    a, b = os.urandom(1000), os.urandom(333)
    assert checksum([a, b]) == xxhash.xxh3_64_intdigest(a + b) & 0xFFFFFFFF == checksum([a + b])
    assert checksum([a, b]) != checksum([b, a])
    assert checksum([]) == xxhash.xxh3_64_intdigest(b"") & 0xFFFFFFFF


def test_checksum_is_a_fixed32_and_matches_a_known_vector():
    # XXH3-64 of b"" with seed 0 is 0x2d06800538d394c2 (the reference test vector)
    assert checksum([b""]) == 0x38D394C2
    assert 0 <= checksum([os.urandom(64)]) < 1 << 32
