"""Connections made before the first request needs them: the router names each decode worker to each prefill
worker as soon as both answer, so that the prefill worker's KV channel to it (TCP, TLS) is open before the
first transfer between them; and which of the router's own channels are connected now."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import grpc
from grpc import aio

from tandem.v1 import common_pb2

if TYPE_CHECKING:
    from tandem.worker.router.membership import Worker

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT_S = 5.0  # the prefill worker waits a moment for its channel, then answers
RETRY_S = 5.0  # a pair whose channel did not connect is tried again this much later

Pair = tuple[str, str]  # (prefill address, decode address)
PAIRED = ("prefill", "decode")  # the pools whose workers are routable once their KV channels were tried


def answering(workers: dict[str, Worker]) -> dict[str, Worker]:
    """The workers that answered their Handshake and Load and take work (pure)."""
    return {a: w for a, w in workers.items() if w.info is not None and w.view.healthy and not w.view.draining}


def pairs_to_connect(prefill: dict[str, Worker], decode: dict[str, Worker], skip: set[Pair]) -> list[Pair]:
    """Pairs of answering prefill and decode workers, but those in `skip` (connected, being connected, or
    waiting to try again) (pure)."""
    return [(p, d) for p in answering(prefill) for d in answering(decode) if (p, d) not in skip]


def connected_now(channel: aio.Channel) -> bool:
    """Whether a channel is connected, asked without dialling."""
    return channel.get_state(try_to_connect=False) == grpc.ChannelConnectivity.READY


class KvPairing:
    """The prefill-decode pairs whose KV channel is connected, and the handshakes that connect new ones: each
    in the background (a poll round never waits on one), a pair that failed tried again RETRY_S later."""

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, on_tried: Callable[[], None] = lambda: None
    ) -> None:
        self.clock, self.on_tried = clock, on_tried  # on_tried: after each handshake, answered or failed
        self.connected: set[Pair] = set()
        self.tried: set[Pair] = set()  # handshakes that answered (connected or not) or failed
        self._tasks: dict[Pair, asyncio.Task] = {}
        self._retry_at: dict[Pair, float] = {}  # pairs that failed: not before then

    def update(self, prefill: dict[str, Worker], decode: dict[str, Worker]) -> None:
        """Forget the pairs of workers that left; start a handshake for each new pair (or one due a retry)."""
        now = self.clock()
        self.connected = {(p, d) for p, d in self.connected if p in prefill and d in decode}
        self.tried = {(p, d) for p, d in self.tried if p in prefill and d in decode}
        self._retry_at = {pair: t for pair, t in self._retry_at.items() if t > now}
        skip = self.connected | set(self._tasks) | set(self._retry_at)
        for pair in pairs_to_connect(prefill, decode, skip):
            self._tasks[pair] = asyncio.create_task(self._connect(pair, prefill[pair[0]], decode[pair[1]]))

    async def _connect(self, pair: Pair, prefill: Worker, decode: Worker) -> None:
        why = ""
        try:
            reply = await prefill.stub.Handshake(  # type: ignore[attr-defined]
                common_pb2.HandshakeRequest(peer=decode.info, peer_address=pair[1]),
                timeout=HANDSHAKE_TIMEOUT_S,
            )
            if reply.peer_connected:
                self.connected.add(pair)
            else:
                why = "its channel did not connect"
        except aio.AioRpcError as e:
            why = f"{e.code().name} {e.details()}"
        finally:
            self._tasks.pop(pair, None)
            self.tried.add(pair)
        if why:
            self._retry_at[pair] = self.clock() + RETRY_S
            log.info("prefill worker %s not yet connected to decode worker %s (%s)", *pair, why)
        self.on_tried()

    def tried_all(self, worker: Worker, prefill: dict[str, Worker], decode: dict[str, Worker]) -> bool:
        """Whether a worker that answered has had a handshake with each answering worker of the other pool."""
        if worker.info is None:
            return False
        me = worker.view.address
        if worker.role == "prefill":
            return all((me, d) in self.tried for d in answering(decode))
        return all((p, me) in self.tried for p in answering(prefill))

    async def close(self) -> None:
        for task in list(self._tasks.values()):
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
