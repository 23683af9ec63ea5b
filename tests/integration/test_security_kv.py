"""Attacks on the workers' gRPC ports by peers that hold a valid identity: through the reservation a prefill
worker is handed (a crafted pickle where the CUDA IPC handle used to be, a staging ring name that walks out of
/dev/shm), a Reserve asking to pin blocks for weeks, a commit naming a token outside the vocabulary, and a
Prefill naming socket paths or probing ports. Each is refused by real worker processes on loopback, which
keep serving."""

from __future__ import annotations

import os
import pickle
import socket
import time

import grpc
import httpx
import numpy as np
import pytest
import torch

from tandem.operator.local.plan import ProcessPlan
from tandem.operator.local.scale import dial
from tandem.v1 import common_pb2, decode_pb2, decode_pb2_grpc, prefill_pb2, prefill_pb2_grpc
from tandem.worker.kv_transport.base import KvLayout, KvTransferError
from tandem.worker.kv_transport.grpc_stream import StreamKvSender
from tests.integration.stacks import running_stack, spec

pytestmark = pytest.mark.slow


class _MakeDir:
    """Unpickling this creates a directory: proof that peer bytes were unpickled."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, data: bytes) -> bytes:
    """A length-delimited protobuf field, written by hand so any bytes can go under any number."""
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def _prefill_raw(reservation: bytes) -> bytes:
    req = prefill_pb2.PrefillRequest(
        request_id="attack",
        transfer_id="attack",
        prompt_token_ids=list(range(1, 21)),
        decode_address="127.0.0.1:1",
    )
    req.sampling.max_tokens, req.sampling.top_p = 1, 1.0
    return req.SerializeToString() + _field(6, reservation)


def _call(prefill: ProcessPlan, raw: bytes) -> grpc.RpcError | prefill_pb2.PrefillReply:
    """Prefill with the stack's router identity: what a compromised router could send."""
    with dial(prefill, "router") as ch:
        rpc = ch.unary_unary(
            "/tandem.v1.PrefillService/Prefill", response_deserializer=prefill_pb2.PrefillReply.FromString
        )
        try:
            return rpc(raw, timeout=60)
        except grpc.RpcError as e:
            return e


@pytest.fixture(scope="module")
def stack(tiny_model_dir, tmp_path_factory):
    with running_stack(spec("sec", tiny_model_dir), tmp_path_factory.mktemp("sec")) as s:
        yield s


def _prefill(stack) -> ProcessPlan:
    return next(p for p in stack[0].plans if p.role == "prefill")


def _still_serving(stack) -> None:
    running, url = stack
    assert all(proc.poll() is None for proc in running.running.values())
    r = httpx.post(
        f"{url}/v1/completions", json={"model": "tiny", "prompt": "Hi", "max_tokens": 4}, timeout=60
    )
    assert r.status_code == 200, r.text


def test_crafted_pickle_in_the_old_handle_field_is_never_unpickled(stack, tmp_path):
    marker = tmp_path / "unpickled"
    reservation = decode_pb2.ReserveReply(
        transport=common_pb2.KV_TRANSPORT_CUDA_IPC, shm_name="tandem-kv-" + "0" * 24, block_ids=[0, 1]
    ).SerializeToString() + _field(8, pickle.dumps(_MakeDir(str(marker))))
    result = _call(_prefill(stack), _prefill_raw(reservation))
    assert isinstance(result, grpc.RpcError) and "top_p" not in str(result.details()), (
        result
    )  # got past validation
    assert not marker.exists(), "the prefill worker unpickled peer bytes"
    _still_serving(stack)


def test_pickle_as_cuda_ipc_fields_is_refused(stack, tmp_path):
    marker = tmp_path / "unpickled"
    reservation = decode_pb2.ReserveReply(
        transport=common_pb2.KV_TRANSPORT_CUDA_IPC,
        shm_name="tandem-kv-" + "0" * 24,
        block_ids=[0, 1],
        cuda_ipc=decode_pb2.CudaIpcBuffer(
            handle=pickle.dumps(_MakeDir(str(marker))), ref_counter_name="/torch_1_2_3"
        ),
    ).SerializeToString()
    err = _call(_prefill(stack), _prefill_raw(reservation))
    assert isinstance(err, grpc.RpcError) and err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
    assert "staging ring refused" in str(err.details()), err
    assert not marker.exists()
    _still_serving(stack)


def test_ring_name_outside_dev_shm_is_refused_and_the_file_untouched(stack, tmp_path):
    victim = tmp_path / "victim"
    data = bytearray(64 + (1 << 16))
    np.ndarray((8,), dtype=np.uint64, buffer=data)[2] = 1 << 16  # laid out like a ring the old code would map
    victim.write_bytes(bytes(data))
    reservation = decode_pb2.ReserveReply(
        transport=common_pb2.KV_TRANSPORT_SHM, shm_name=os.path.relpath(victim, "/dev/shm"), block_ids=[0, 1]
    ).SerializeToString()
    err = _call(_prefill(stack), _prefill_raw(reservation))
    assert isinstance(err, grpc.RpcError) and err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
    assert "staging ring refused" in str(err.details()), err
    assert victim.read_bytes() == bytes(data)
    _still_serving(stack)


# --- peers are not trusted: what an authenticated peer may still not do -----------------------------------


def _decode(stack) -> ProcessPlan:
    return next(p for p in stack[0].plans if p.role == "decode")


def _reserve(stack, request_id: str, lease_ms: int = 0, prompt: int = 20) -> decode_pb2.ReserveReply:
    with dial(_decode(stack), "router") as ch:
        return decode_pb2_grpc.DecodeServiceStub(ch).Reserve(
            decode_pb2.ReserveRequest(
                transfer_id=f"t-{request_id}",
                request_id=request_id,
                prompt_token_ids=list(range(1, prompt + 1)),
                sampling=common_pb2.SamplingParams(max_tokens=4, top_p=1.0),
                lease_ms=lease_ms,
                transports=[common_pb2.KV_TRANSPORT_GRPC],
            ),
            timeout=10,
        )


def test_a_reserve_cannot_pin_blocks_past_the_services_lease(stack):
    before = time.time()
    reply = _reserve(stack, "long-lease", lease_ms=4_000_000_000 // 1000)  # ~46 days asked
    assert reply.lease_deadline_ms / 1000 <= before + 30 + 5, reply.lease_deadline_ms / 1000 - before
    with dial(_decode(stack), "router") as ch:
        decode_pb2_grpc.DecodeServiceStub(ch).Abort(
            decode_pb2.AbortRequest(request_id="long-lease"), timeout=10
        )


def test_a_commit_naming_a_token_outside_the_vocabulary_fails_that_request_only(stack):
    """The KV arrives in full from a prefill identity, then the commit names token 10**9: that transfer is
    refused and its stream ends with an error; the worker and every other request keep going."""
    reply = _reserve(stack, "bad-token")
    decode = _decode(stack)
    with dial(decode, "router") as ch:
        info = (
            decode_pb2_grpc.DecodeServiceStub(ch).Handshake(common_pb2.HandshakeRequest(), timeout=10).worker
        )
        tokens = decode_pb2_grpc.DecodeServiceStub(ch).StreamTokens(
            decode_pb2.StreamTokensRequest(request_id="bad-token"), timeout=30
        )
        layout = KvLayout.from_worker_info(info)
        with dial(decode, "prefill") as push:
            sender = StreamKvSender(push, "t-bad-token", reply, layout, timeout_s=20)
            shape = (len(reply.block_ids), *layout.block_shape)
            zeros = torch.zeros(shape, dtype=layout.storage_dtype)
            for layer in range(layout.num_layers):
                sender.send(layer, list(reply.block_ids), zeros, zeros)
            with pytest.raises(KvTransferError, match="outside the vocabulary"):
                sender.commit(10**9, 0.0)
            sender.close()
        events = list(tokens)
    assert events and events[-1].error and not any(e.has_token for e in events), events
    _still_serving(stack)


def test_prefill_dials_no_socket_paths_and_tells_nothing_of_other_ports(stack):
    """A caller naming where the prefill worker pushes KV: a socket path or a gRPC scheme is refused outright,
    and a closed port and an open port of something else fail alike (Prefill is no port scanner)."""
    prefill = _prefill(stack)

    def prefill_to(address: str) -> grpc.RpcError:
        req = prefill_pb2.PrefillRequest(
            request_id=f"scan-{address}",
            transfer_id="scan",
            decode_address=address,
            prompt_token_ids=list(range(1, 21)),
            sampling=common_pb2.SamplingParams(max_tokens=1, top_p=1.0),
            reservation=decode_pb2.ReserveReply(
                block_ids=[0, 1],
                epoch=1,
                transport=common_pb2.KV_TRANSPORT_GRPC,
                lease_deadline_ms=int((time.time() + 3) * 1000),
            ),
        )
        with dial(prefill, "router") as ch, pytest.raises(grpc.RpcError) as err:
            prefill_pb2_grpc.PrefillServiceStub(ch).Prefill(req, timeout=60)
        return err.value

    for address in ("unix:/tmp/tandem.sock", "unix:123", "dns:///x:1", "localhost", "[::1]:0"):
        err = prefill_to(address)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (address, err)
    router_port = stack[1].rsplit(":", 1)[1]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    answers = {a: prefill_to(a) for a in (f"127.0.0.1:{closed}", f"127.0.0.1:{router_port}")}
    assert {(e.code(), e.details()) for e in answers.values()} == {
        (
            grpc.StatusCode.UNAVAILABLE,
            "KV transfer failed: the decode worker could not be reached as a decode worker of this service",
        )
    }, answers
    _still_serving(stack)
