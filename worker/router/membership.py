"""Which workers the router knows, and how each is doing: membership and polled health and load.

Membership comes from the command line (an address, or `dns:///name:port` for every pod behind a headless
Service) and, if given, a JSON workers file that may change. A worker that leaves the membership stops
getting requests but keeps its channel until the requests it holds have finished; one that joins is
dialled and polled (Handshake once, then Load) before it is routable. A name that fails to resolve keeps
the addresses it last resolved to (one DNS failure must not retire a whole pool), and says so in a log line
and in `stale_names`; a name the DNS answers has no addresses (a headless Service whose pods are gone) empties
its pool. A prefill or decode worker is placed by the role it reports in Load, whatever list
names it: one that changed role (SetRole, between prefill, decode and colocated) leaves its old pool
(finishing what it holds there) and is dialled again, asking for its new role's certificate, in the other,
with no restart.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc import aio

from tandem.v1 import colocated_pb2_grpc, common_pb2, decode_pb2_grpc, prefill_pb2_grpc
from tandem.worker.api.tls import ClientCertWatch, TlsConfig, aio_channel
from tandem.worker.router.pairing import PAIRED, KvPairing
from tandem.worker.router.selection import WorkerView

log = logging.getLogger(__name__)

STUBS = {
    "prefill": prefill_pb2_grpc.PrefillServiceStub,
    "decode": decode_pb2_grpc.DecodeServiceStub,
    "colocated": colocated_pb2_grpc.ColocatedServiceStub,
}
UNHEALTHY_FOR_S = 2.0
DNS_PREFIX = "dns:///"
FLIPPABLE = ("prefill", "decode", "colocated")  # the roles a worker may change between at runtime
REPORTED_ROLES = {
    common_pb2.WORKER_ROLE_PREFILL: "prefill",
    common_pb2.WORKER_ROLE_DECODE: "decode",
    common_pb2.WORKER_ROLE_COLOCATED: "colocated",
}


def placed_role(listed: str, reported: str | None) -> str:
    """The pool a worker belongs in (pure): the role it last reported, when it differs from the list's (it
    changed role); the list's otherwise (not polled yet)."""
    if reported is not None and reported != listed and listed in FLIPPABLE and reported in FLIPPABLE:
        return reported
    return listed


@dataclass
class Worker:
    role: str
    view: WorkerView
    channel: aio.Channel
    stub: object
    info: common_pb2.WorkerInfo | None = None
    unhealthy_until: float = 0.0
    in_use: int = 0  # request attempts holding this worker (its channel must stay open)
    reported_role: str | None = None  # the role its last load report named
    link_suspect_until: float = 0.0  # a KV push to it broke this recently: the next one that breaks fails it

    def mark_failed(self) -> None:
        self.view.healthy = False
        self.unhealthy_until = time.monotonic() + UNHEALTHY_FOR_S


class Pools:
    """The workers of each role, by address, and those that left but still finish requests."""

    def __init__(
        self,
        static: dict[str, list[str]],
        workers_file: str | None = None,
        tls: TlsConfig | None = None,
        resolver: Callable[[str], list[str]] | None = None,
    ):
        self.static = static
        self.resolver = resolver or resolve  # address -> addresses; raises DiscoveryError
        self.workers_file = workers_file
        self.tls = tls  # mutual TLS to every worker, or plaintext
        self.certs = ClientCertWatch(tls)  # renewed in place: new channels, the open calls finish on the old
        self.renewed_away: list[
            tuple[Worker, aio.Channel]
        ] = []  # old channels, closed once their worker is idle
        self._file_mtime = 0.0
        self.workers: dict[str, dict[str, Worker]] = {r: {} for r in STUBS}
        self.retiring: list[Worker] = []  # left the membership, still finishing requests
        self._resolved: dict[str, list[str]] = {}  # dns:/// name -> the addresses it last resolved to
        self.stale_names: set[str] = set()  # names whose last lookup failed (their last good set is kept)
        self.reported: dict[
            str, str
        ] = {}  # address -> the role it last reported, where that differs from its list's
        # prefill workers' KV channels, connected before the first transfer
        self.kv_pairing = KvPairing(on_tried=self._settle_warming)

    def views(self, role: str) -> list[WorkerView]:
        return [w.view for w in self.workers[role].values()]

    def _wanted(self) -> dict[str, list[str]]:
        wanted = {r: list(self.static.get(r, [])) for r in STUBS}
        if self.workers_file and os.path.exists(self.workers_file):
            data = json.loads(Path(self.workers_file).read_text() or "{}")
            for role in STUBS:
                wanted[role] = list(dict.fromkeys(wanted[role] + list(data.get(role, []))))
        return {
            role: [a for address in addresses for a in self._resolve(address)]
            for role, addresses in wanted.items()
        }

    def _resolve(self, address: str) -> list[str]:
        fresh: list[str] | None = None
        try:
            fresh = self.resolver(address)
        except DiscoveryError as e:
            if address not in self.stale_names:
                log.warning("%s; keeping its last %d addresses", e, len(self._resolved.get(address, [])))
        if fresh is not None and address in self.stale_names:
            log.info("%s resolves again (%d addresses)", address, len(fresh))
        if fresh == [] and self._resolved.get(address):
            log.info("%s has no addresses now (its pods are gone); its workers leave the pool", address)
        kept = keep_last_good(self._resolved.get(address), fresh)
        if fresh is None:
            self.stale_names.add(address)
        else:
            self.stale_names.discard(address)
        if address.startswith(DNS_PREFIX):
            self._resolved[address] = kept
        return kept

    def _redial_if_renewed(self) -> None:
        """After a certificate renewal every worker gets a channel with the new credentials; the calls open
        on the old one keep it until the worker holds no request."""
        fresh = self.certs.renewed()
        if fresh is None:
            return
        self.tls = fresh
        for role, current in self.workers.items():
            for address, w in current.items():
                self.renewed_away.append((w, w.channel))
                w.channel = aio_channel(address, fresh.to(role))
                w.stub = STUBS[role](w.channel)
        log.info(
            "client certificate renewed: %d worker channel(s) redialled",
            sum(len(c) for c in self.workers.values()),
        )

    async def refresh(self, force: bool = False) -> None:
        """Dial workers that joined; retire those that left; move those that changed role."""
        self._redial_if_renewed()
        dynamic = any(a.startswith(DNS_PREFIX) for addresses in self.static.values() for a in addresses)
        if not force and not dynamic and self.workers_file and os.path.exists(self.workers_file):
            mtime = os.path.getmtime(self.workers_file)
            if mtime == self._file_mtime and any(self.workers.values()):
                return
            self._file_mtime = mtime
        try:
            wanted = await asyncio.to_thread(self._wanted)
        except (OSError, ValueError) as e:
            log.warning("workers file unreadable: %s", e)
            return
        wanted = self._placed(wanted)
        for role, addresses in wanted.items():
            current = self.workers[role]
            for address in addresses:
                if address not in current:
                    channel = aio_channel(address, self.tls.to(role) if self.tls else None)
                    current[address] = Worker(
                        role,
                        WorkerView(address, healthy=False, warming=role in PAIRED),
                        channel,
                        STUBS[role](channel),
                    )
            for address in list(current):
                if address not in addresses:  # scaled away: no new requests, the held ones finish
                    gone = current.pop(address)
                    gone.view.draining = True
                    self.retiring.append(gone)

    def _placed(self, listed: dict[str, list[str]]) -> dict[str, list[str]]:
        """The lists with each worker moved to the role it reports; reports of workers no list names are
        dropped."""
        out: dict[str, list[str]] = {r: [] for r in listed}
        for role, addresses in listed.items():
            for address in addresses:
                out.setdefault(placed_role(role, self.reported.get(address)), []).append(address)
        named = {a for addresses in listed.values() for a in addresses}
        self.reported = {a: r for a, r in self.reported.items() if a in named}
        return out

    def _settle_warming(self) -> None:
        """A joining prefill or decode worker is routable once each KV channel it needs was tried."""
        prefill, decode = self.workers["prefill"], self.workers["decode"]
        for w in (*prefill.values(), *decode.values()):
            w.view.warming = w.view.warming and not self.kv_pairing.tried_all(w, prefill, decode)

    async def close_retired(self) -> None:
        """Close the channels of workers that left the membership once no request holds them."""
        done = [w for w in self.retiring if w.in_use == 0]
        self.retiring = [w for w in self.retiring if w.in_use > 0]
        for w in done:
            await w.channel.close()
        idle = [ch for w, ch in self.renewed_away if w.in_use == 0]
        self.renewed_away = [(w, ch) for w, ch in self.renewed_away if w.in_use > 0]
        for ch in idle:
            await ch.close()

    async def close(self) -> None:
        await self.kv_pairing.close()
        for role in self.workers.values():
            for w in role.values():
                await w.channel.close()
        for w in self.retiring:
            await w.channel.close()
        for _, ch in self.renewed_away:
            await ch.close()

    async def poll_forever(self, interval_s: float | Callable[[], float]) -> None:
        """Refresh and poll every `interval_s` (or as often as it says each round)."""
        while True:
            await asyncio.sleep(interval_s() if callable(interval_s) else interval_s)
            try:
                await self.refresh()
                await self.close_retired()
                await self.poll_all()
            except Exception:  # keep polling whatever one round did
                log.exception("worker poll failed")

    async def poll_all(self, role: str | None = None) -> None:
        roles = [role] if role else list(self.workers)
        await asyncio.gather(*(poll(w) for r in roles for w in self.workers[r].values()))
        self.kv_pairing.update(self.workers["prefill"], self.workers["decode"])
        self._settle_warming()
        moved = [
            w
            for r in roles
            for w in self.workers[r].values()
            if placed_role(w.role, w.reported_role) != w.role
        ]
        if moved:
            for w in moved:
                log.info(
                    "worker %s now reports role %s: moved from the %s pool",
                    w.view.address,
                    w.reported_role,
                    w.role,
                )
                self.reported[w.view.address] = w.reported_role  # type: ignore[assignment]
            await self.refresh(force=True)
            joined = [
                self.workers[r][w.view.address]
                for w in moved
                for r in FLIPPABLE
                if w.view.address in self.workers[r]
            ]
            await asyncio.gather(*(poll(w) for w in joined))


async def poll(w: Worker) -> None:
    """One worker's health and load into its view (its Handshake first, once)."""
    try:
        info = w.info or (await w.stub.Handshake(common_pb2.HandshakeRequest(), timeout=2)).worker  # type: ignore[attr-defined]
        load = await w.stub.Load(common_pb2.LoadRequest(), timeout=2)  # type: ignore[attr-defined]
        w.info = info  # known once it also reported its load: until then it is still starting
    except aio.AioRpcError as e:
        if e.code() == grpc.StatusCode.UNAVAILABLE:
            w.view.healthy = (
                False  # out of rotation until it answers (a request failure also waits out a window)
            )
        return  # a slow answer (a busy worker) keeps the last load, it is not a failure
    w.reported_role = REPORTED_ROLES.get(load.role, w.reported_role)
    if time.monotonic() < w.unhealthy_until and not w.view.healthy:
        return  # a recent request failure outranks one good poll
    v = w.view
    if placed_role(w.role, w.reported_role) != w.role:  # it changed role: not routable here, whatever it says
        v.healthy, v.draining = True, True
        return
    v.healthy, v.draining = True, load.draining
    v.queued_prompt_tokens, v.running_sequences = load.queued_prompt_tokens, load.running_sequences
    v.free_kv_blocks, v.total_kv_blocks = load.free_kv_blocks, load.total_kv_blocks


class DiscoveryError(Exception):
    """A worker name could not be resolved now."""


def keep_last_good(previous: list[str] | None, fresh: list[str] | None) -> list[str]:
    """A name's addresses after a lookup (pure): the fresh answer, or the last good one when it failed."""
    if fresh is None:
        return list(previous or [])
    return fresh


# The name server answered that the name has no addresses: a headless Service whose last pod went (DNS says
# NXDOMAIN or no data for it), not a lookup that failed (EAI_AGAIN, EAI_FAIL), which keeps the last answer.
NO_SUCH_ADDRESSES = frozenset(
    code for code in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", None)) if code is not None
)


def resolve(address: str) -> list[str]:
    """`dns:///name:port` (a headless Service) to one `ip:port` per pod behind it (none once its pods are
    gone); others as they are. Raises DiscoveryError when the lookup fails."""
    if not address.startswith(DNS_PREFIX):
        return [address]
    host, _, port = address[len(DNS_PREFIX) :].rpartition(":")
    try:
        infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        if e.errno in NO_SUCH_ADDRESSES:
            return []
        raise DiscoveryError(f"cannot resolve {address}: {e}") from None
    except (OSError, ValueError) as e:
        raise DiscoveryError(f"cannot resolve {address}: {e}") from None
    ips = sorted({str(info[4][0]) for info in infos})
    return [f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}" for ip in ips]
