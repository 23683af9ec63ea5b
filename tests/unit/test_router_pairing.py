"""Which prefill-decode pairs the router introduces (pure), and when it tries a failed pair again."""

from __future__ import annotations

import asyncio

from tandem.v1 import common_pb2
from tandem.worker.router.membership import Worker
from tandem.worker.router.pairing import KvPairing, pairs_to_connect
from tandem.worker.router.selection import WorkerView


class RefusingStub:
    """A prefill worker whose channel to any decode worker never connects."""

    def __init__(self) -> None:
        self.handshakes = 0

    async def Handshake(self, request, timeout):  # noqa: N802 - the RPC's name
        self.handshakes += 1
        return common_pb2.HandshakeReply(peer_connected=False)


def worker(address: str, role: str, *, known: bool = True, healthy: bool = True, draining: bool = False):
    view = WorkerView(address, healthy=healthy, draining=draining)
    info = common_pb2.WorkerInfo(worker_id=address) if known else None
    return Worker(role, view, channel=None, stub=RefusingStub(), info=info)  # type: ignore[arg-type]


def pool(role: str, *workers: Worker) -> dict[str, Worker]:
    return {w.view.address: w for w in workers}


def test_every_answering_pair_is_introduced_once():
    prefill = pool("prefill", worker("p1", "prefill"), worker("p2", "prefill", known=False))
    decode = pool(
        "decode", worker("d1", "decode"), worker("d2", "decode"), worker("d3", "decode", draining=True)
    )
    assert pairs_to_connect(prefill, decode, set()) == [("p1", "d1"), ("p1", "d2")]
    assert pairs_to_connect(prefill, decode, {("p1", "d1")}) == [("p1", "d2")]
    decode["d2"].view.healthy = False
    assert pairs_to_connect(prefill, decode, set()) == [("p1", "d1")]


def test_a_pair_that_did_not_connect_is_tried_again_later_not_every_round():
    now = [0.0]
    pairing = KvPairing(clock=lambda: now[0])
    prefill, decode = pool("prefill", worker("p1", "prefill")), pool("decode", worker("d1", "decode"))
    stub = prefill["p1"].stub

    async def rounds(n: int) -> None:
        for _ in range(n):
            pairing.update(prefill, decode)
            await asyncio.sleep(0)  # the background handshake runs
            await asyncio.sleep(0)

    asyncio.run(rounds(5))
    assert stub.handshakes == 1 and not pairing.connected
    now[0] = 60.0
    asyncio.run(rounds(1))
    assert stub.handshakes == 2


def test_a_joining_worker_is_routable_once_each_kv_channel_it_needs_was_tried():
    pairing = KvPairing()
    prefill = pool("prefill", worker("p1", "prefill"), worker("p2", "prefill", known=False))
    decode = pool("decode", worker("d1", "decode"), worker("d2", "decode", healthy=False))
    p1, p2, d1 = prefill["p1"], prefill["p2"], decode["d1"]
    assert not pairing.tried_all(p1, prefill, decode) and not pairing.tried_all(d1, prefill, decode)
    pairing.tried.add(("p1", "d1"))  # d2 does not answer: nothing to wait for
    assert pairing.tried_all(p1, prefill, decode) and pairing.tried_all(d1, prefill, decode)
    assert not pairing.tried_all(p2, prefill, decode)  # it never answered
