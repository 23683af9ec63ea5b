"""KvChunk framing by hand: the bytes protobuf writes for KvChunk, without protobuf copying the payload."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import xxhash

from tandem.v1 import decode_pb2

_HEADER_TAG = b"\x0a"  # field 1, wire type 2
_PAYLOAD_TAG = b"\x12"  # field 2, wire type 2

Buffer = bytes | bytearray | memoryview


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _read_varint(buf: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint in KvChunk")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long in KvChunk")


CHECKSUM_NAME = "xxh3_64/32"  # the header's fixed32 checksum: low 32 bits of XXH3-64 (seed 0)
_MASK32 = 0xFFFFFFFF


def checksum(parts: Iterable[Buffer]) -> int:
    """Low 32 bits of XXH3-64 over the concatenation of parts (the chunk's bytes as they travel)."""
    parts = list(parts)
    if len(parts) == 1:
        return xxhash.xxh3_64_intdigest(parts[0]) & _MASK32
    h = xxhash.xxh3_64()
    for part in parts:
        h.update(part)
    return h.intdigest() & _MASK32


def pack_chunk(header: decode_pb2.KvChunkHeader, parts: Sequence[Buffer] = ()) -> bytes:
    """One wire message: KvChunk{header, payload = concatenation of parts}; the payload is copied once."""
    header_bytes = header.SerializeToString()
    views = [memoryview(p).cast("B") for p in parts]
    size = sum(len(v) for v in views)
    prefix = _HEADER_TAG + _varint(len(header_bytes)) + header_bytes
    if not size:
        return prefix
    return b"".join([prefix, _PAYLOAD_TAG, _varint(size), *views])


def unpack_chunk(data: Buffer) -> tuple[decode_pb2.KvChunkHeader, memoryview]:
    """Parse a KvChunk message; the payload is a view into `data`, not a copy."""
    buf = memoryview(data).cast("B")
    header = decode_pb2.KvChunkHeader()
    payload = buf[0:0]
    pos = 0
    while pos < len(buf):
        key, pos = _read_varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 2:
            length, pos = _read_varint(buf, pos)
            end = pos + length
            if end > len(buf):
                raise ValueError("truncated field in KvChunk")
            if field == 1:
                header.MergeFromString(buf[pos:end])
            elif field == 2:
                payload = buf[pos:end]
            pos = end
        elif wire == 0:
            _, pos = _read_varint(buf, pos)
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        else:
            raise ValueError(f"unsupported wire type {wire} in KvChunk")
    return header, payload


def identity(data: bytes) -> bytes:
    """Serializer for messages that are already framed."""
    return data
