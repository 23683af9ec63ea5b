"""Property-based tests of the KV chunk path: the framing, and the decode side's PushKv handler over a
real receiver and block store, fed a genuine transfer with one fault in it (a corrupted, truncated,
replayed, reordered, stale-epoch, foreign-block or unknown-transfer chunk).

Whatever arrives: nothing corrupt is committed (a committed transfer holds exactly the sent KV), no block
outside the reservation is written, and every reservation ends committed or freed, never leaked."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tandem.v1 import decode_pb2
from tandem.worker.kv_transport.base import KvLayout
from tandem.worker.kv_transport.codec import encode_blocks
from tandem.worker.kv_transport.framing import pack_chunk, unpack_chunk
from tandem.worker.kv_transport.grpc_stream import push_kv_handler
from tandem.worker.kv_transport.receiver import KvReceiver, chunk_checksum
from tandem.worker.kv_transport.tensor_store import TensorKvStore

LAYOUT = KvLayout(num_layers=2, block_size=4, num_kv_heads=2, head_dim=8, dtype=torch.float16)
NUM_BLOCKS = 12
LEASE_S = 5.0
FAULTS = ("none", "corrupt", "truncate", "replay", "reorder", "stale", "foreign", "unknown", "drop_commit")
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), database=None)


# ---- framing ----

headers = st.builds(
    decode_pb2.KvChunkHeader,
    transfer_id=st.text(max_size=40),
    epoch=st.integers(0, 2**64 - 1),
    kind=st.sampled_from([decode_pb2.KV_CHUNK_KIND_DATA, decode_pb2.KV_CHUNK_KIND_COMMIT]),
    layer=st.integers(0, 2**32 - 1),
    block_ids=st.lists(st.integers(0, 2**32 - 1), max_size=8),
    checksum=st.integers(0, 2**32 - 1),
    has_checksum=st.booleans(),
    sequence=st.integers(0, 2**32 - 1),
)


@SETTINGS
@given(header=headers, parts=st.lists(st.binary(max_size=300), max_size=4))
def test_framing_round_trips_any_header_and_payload(header, parts):
    back, payload = unpack_chunk(pack_chunk(header, parts))
    assert back == header and bytes(payload) == b"".join(parts)


@SETTINGS
@given(header=headers, payload=st.binary(min_size=1, max_size=300), data=st.data())
def test_mangled_frames_parse_or_fail_cleanly(header, payload, data):
    """Truncated, bit-flipped or arbitrary bytes: a parse error (ValueError or protobuf's DecodeError),
    never another exception; a truncated frame never yields the whole payload."""
    frame = bytearray(pack_chunk(header, [payload]))
    how = data.draw(st.sampled_from(["truncate", "flip", "random"]))
    if how == "truncate":
        frame = frame[: data.draw(st.integers(0, len(frame) - 1))]
    elif how == "flip":
        at = data.draw(st.integers(0, len(frame) - 1))
        frame[at] ^= data.draw(st.integers(1, 255))
    else:
        frame = bytearray(data.draw(st.binary(max_size=200)))
    try:
        _, got = unpack_chunk(bytes(frame))
    except (ValueError, DecodeError):
        return
    if how == "truncate":
        assert bytes(got) != payload


# ---- the receiver behind the PushKv handler ----


class Aborted(Exception):
    """What grpc's context.abort raises."""


class Context:
    def abort(self, code, details):
        raise Aborted(code, details)


@dataclass
class Rig:
    store: TensorKvStore = field(default_factory=lambda: TensorKvStore(LAYOUT, NUM_BLOCKS))
    freed: list[int] = field(default_factory=list)
    committed: list = field(default_factory=list)
    now: float = 0.0

    def __post_init__(self) -> None:
        self.rx = KvReceiver(
            self.store,
            LAYOUT,
            on_release=lambda r: self.freed.extend(r.block_ids),
            on_commit=self.committed.append,
            clock=lambda: self.now,
        )
        self.push = push_kv_handler(self.rx).stream_unary


def genuine_frames(transfer_id: str, epoch: int, block_ids: list[int], kv: dict, run: int) -> list[bytes]:
    """The chunks a sender writes for a transfer: per layer, runs of `run` blocks, in sequence,
    checksummed."""
    frames = []
    for layer in range(LAYOUT.num_layers):
        for start in range(0, len(block_ids), run):
            ids = block_ids[start : start + run]
            k = torch.stack([kv[layer, b][0] for b in ids])
            v = torch.stack([kv[layer, b][1] for b in ids])
            parts, _ = encode_blocks(k, v)
            header = decode_pb2.KvChunkHeader(
                transfer_id=transfer_id,
                epoch=epoch,
                kind=decode_pb2.KV_CHUNK_KIND_DATA,
                layer=layer,
                block_ids=ids,
                sequence=len(frames),
                checksum=chunk_checksum(parts),
                has_checksum=True,
            )
            frames.append(pack_chunk(header, [p.numpy().data for p in parts]))
    return frames


def commit_frame(transfer_id: str, epoch: int) -> bytes:
    return pack_chunk(
        decode_pb2.KvChunkHeader(
            transfer_id=transfer_id, epoch=epoch, kind=decode_pb2.KV_CHUNK_KIND_COMMIT, first_token=7
        )
    )


def with_fault(frames: list[bytes], fault: str, at: int, data, res, kv_other: dict) -> list[bytes]:
    """The genuine stream with one fault at chunk `at` (the commit frame is last)."""
    frames = list(frames)
    at = min(at, len(frames) - 2)  # a data chunk
    if fault == "corrupt":
        frame = bytearray(frames[at])
        i = data.draw(st.integers(len(frame) - 64, len(frame) - 1))  # inside the payload
        frame[i] ^= data.draw(st.integers(1, 255))
        frames[at] = bytes(frame)
    elif fault == "truncate":
        frames[at] = frames[at][: data.draw(st.integers(1, len(frames[at]) - 1))]
    elif fault == "replay":
        frames.insert(data.draw(st.integers(at + 1, len(frames) - 1)), frames[at])
    elif fault == "reorder":  # two data chunks swapped (the stream has at least two: see the test)
        at = min(at, len(frames) - 3)
        frames[at], frames[at + 1] = frames[at + 1], frames[at]
    elif fault in ("stale", "foreign", "unknown"):
        header, payload = unpack_chunk(frames[at])
        if fault == "stale":  # the same transfer at an older epoch, carrying other bytes
            header.epoch = res.epoch - 1
            ids = list(header.block_ids)
            parts, _ = encode_blocks(
                torch.stack([kv_other[header.layer, b][0] for b in ids]),
                torch.stack([kv_other[header.layer, b][1] for b in ids]),
            )
            header.checksum = chunk_checksum(parts)
            frames.insert(at, pack_chunk(header, [p.numpy().data for p in parts]))
        elif fault == "foreign":  # a block this transfer does not hold
            outside = sorted(set(range(NUM_BLOCKS)) - set(res.block_ids))
            header.block_ids[0] = data.draw(st.sampled_from(outside))
            frames[at] = pack_chunk(header, [payload])
        else:
            header.transfer_id = "someone-else"
            frames.insert(at, pack_chunk(header, [payload]))
    elif fault == "drop_commit":
        frames.pop()
    return frames


def random_kv(block_ids: list[int], seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    shape = LAYOUT.block_shape
    return {
        (layer, b): (torch.randn(shape, generator=g).half(), torch.randn(shape, generator=g).half())
        for layer in range(LAYOUT.num_layers)
        for b in block_ids
    }


@SETTINGS
@given(
    block_ids=st.lists(st.integers(0, NUM_BLOCKS - 1), min_size=1, max_size=4, unique=True),
    run=st.integers(1, 3),
    fault=st.sampled_from(FAULTS),
    at=st.integers(0, 20),
    supersede=st.booleans(),
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_nothing_corrupt_is_committed_and_no_reservation_leaks(
    block_ids, run, fault, at, supersede, seed, data
):
    rig = Rig()
    res = rig.rx.reserve("t", "r", block_ids, LEASE_S)
    if supersede or fault == "stale":  # a newer epoch of the same transfer replaces the first
        res = rig.rx.reserve("t", "r", block_ids, LEASE_S)
        rig.freed.clear()
    kv = random_kv(block_ids, seed)
    frames = genuine_frames("t", res.epoch, block_ids, kv, run) + [commit_frame("t", res.epoch)]
    assert len(frames) >= 3  # one chunk per layer at least: two data chunks to reorder
    frames = with_fault(frames, fault, at, data, res, random_kv(block_ids, seed + 1))

    def stream():
        for frame in frames:
            yield unpack_chunk(frame)  # a frame that does not parse ends the stream with an error

    try:
        reply = rig.push(stream(), Context())
    except (Aborted, ValueError, DecodeError):
        reply = None
    committed = bool(rig.committed)
    if reply is not None and reply.status == decode_pb2.PUSH_KV_STATUS_COMMITTED:
        assert committed
    if committed:  # exactly the sent bytes, in every layer of every reserved block
        for (layer, b), (k, v) in kv.items():
            assert torch.equal(rig.store.k[layer][b], k) and torch.equal(rig.store.v[layer][b], v)
    if fault in ("corrupt", "truncate", "replay", "reorder", "foreign", "drop_commit"):
        assert not committed, f"a transfer with a {fault} chunk was committed"
    if fault in ("none", "stale"):
        assert committed, f"a clean transfer ({fault}) was not committed: {reply}"
    for b in set(range(NUM_BLOCKS)) - set(block_ids):  # nothing written outside the reservation
        for layer in range(LAYOUT.num_layers):
            assert not rig.store.k[layer][b].any() and not rig.store.v[layer][b].any()
    rig.now += 2 * LEASE_S
    rig.rx.expire()
    assert len(rig.rx.table) == 0
    assert committed or sorted(rig.freed) == sorted(block_ids), "blocks neither committed nor freed"
    assert not (committed and rig.freed), "blocks both handed to a sequence and freed"


def test_a_replayed_chunk_is_refused_even_with_a_valid_checksum():
    rig = Rig()
    res = rig.rx.reserve("t", "r", [1, 2], LEASE_S)
    frames = genuine_frames("t", res.epoch, [1, 2], random_kv([1, 2], 0), run=1)
    with pytest.raises(Aborted):
        rig.push(iter([unpack_chunk(f) for f in [frames[0], frames[0], *frames[1:]]]), Context())
    assert sorted(rig.freed) == [1, 2] and not rig.committed
