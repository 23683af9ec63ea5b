"""Attacks on a prefill worker's gRPC port through the reservation it is handed: a crafted pickle where
the CUDA IPC handle used to be, and a staging ring name that walks out of /dev/shm. Both are refused by
real worker processes on loopback, which keep serving."""

from __future__ import annotations

import os
import pickle

import grpc
import httpx
import numpy as np
import pytest

from tandem.operator.local.plan import ProcessPlan
from tandem.operator.local.scale import dial
from tandem.v1 import common_pb2, decode_pb2, prefill_pb2
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
        request_id="attack", transfer_id="attack", prompt_token_ids=list(range(1, 21)), decode_address="127.0.0.1:1"
    )
    req.sampling.max_tokens, req.sampling.top_p = 1, 1.0
    return req.SerializeToString() + _field(6, reservation)


def _call(prefill: ProcessPlan, raw: bytes) -> grpc.RpcError | prefill_pb2.PrefillReply:
    """Prefill with the stack's router identity: what a compromised router could send."""
    with dial(prefill, "router") as ch:
        rpc = ch.unary_unary("/tandem.v1.PrefillService/Prefill", response_deserializer=prefill_pb2.PrefillReply.FromString)
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
    r = httpx.post(f"{url}/v1/completions", json={"model": "tiny", "prompt": "Hi", "max_tokens": 4}, timeout=60)
    assert r.status_code == 200, r.text


def test_crafted_pickle_in_the_old_handle_field_is_never_unpickled(stack, tmp_path):
    marker = tmp_path / "unpickled"
    reservation = decode_pb2.ReserveReply(
        transport=common_pb2.KV_TRANSPORT_CUDA_IPC, shm_name="tandem-kv-" + "0" * 24, block_ids=[0, 1]
    ).SerializeToString() + _field(8, pickle.dumps(_MakeDir(str(marker))))
    result = _call(_prefill(stack), _prefill_raw(reservation))
    assert isinstance(result, grpc.RpcError) and "top_p" not in str(result.details()), result  # got past validation
    assert not marker.exists(), "the prefill worker unpickled peer bytes"
    _still_serving(stack)


def test_pickle_as_cuda_ipc_fields_is_refused(stack, tmp_path):
    marker = tmp_path / "unpickled"
    reservation = decode_pb2.ReserveReply(
        transport=common_pb2.KV_TRANSPORT_CUDA_IPC,
        shm_name="tandem-kv-" + "0" * 24,
        block_ids=[0, 1],
        cuda_ipc=decode_pb2.CudaIpcBuffer(handle=pickle.dumps(_MakeDir(str(marker))), ref_counter_name="/torch_1_2_3"),
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
