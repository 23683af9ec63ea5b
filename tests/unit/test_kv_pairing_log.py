"""A worker says which KV transport a peer uses once per pair and transport, not once per request."""

from __future__ import annotations

import logging

from tandem.v1 import common_pb2 as C
from tandem.worker.kv_transport.pairing_log import PairingLog, transport_label


def test_transport_labels_are_the_settings_names():
    assert [
        transport_label(k) for k in (C.KV_TRANSPORT_GRPC, C.KV_TRANSPORT_SHM, C.KV_TRANSPORT_CUDA_IPC)
    ] == ["grpc", "shm", "cuda_ipc"]
    assert transport_label(999) == "999"  # a peer's newer value is named, not an error


def test_each_pair_and_transport_is_logged_once(caplog):
    pairings = PairingLog(logging.getLogger("pairing-test"), limit=2)
    with caplog.at_level(logging.INFO, "pairing-test"):
        said = [
            pairings.note("a:1", C.KV_TRANSPORT_SHM, "KV to %s goes over %s", "a:1"),
            pairings.note("a:1", C.KV_TRANSPORT_SHM, "KV to %s goes over %s", "a:1"),
            pairings.note(
                "a:1", C.KV_TRANSPORT_GRPC, "KV to %s goes over %s", "a:1"
            ),  # every ring lent: the stream
            pairings.note(
                "b:1", C.KV_TRANSPORT_SHM, "KV to %s goes over %s", "b:1"
            ),  # the oldest pair is forgotten
            pairings.note("a:1", C.KV_TRANSPORT_SHM, "KV to %s goes over %s", "a:1"),
        ]
    assert said == [True, False, True, True, True]
    assert [r.getMessage() for r in caplog.records] == [
        "KV to a:1 goes over shm",
        "KV to a:1 goes over grpc",
        "KV to b:1 goes over shm",
        "KV to a:1 goes over shm",
    ]
