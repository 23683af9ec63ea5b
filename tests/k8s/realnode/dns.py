"""A minimal cluster DNS for the real test node (no CoreDNS can be fetched here): answers A queries for
`<service>.<namespace>.svc.cluster.local` with the Service's endpoint addresses (ready ones, or all with
publishNotReadyAddresses), read from the API every second. There is no kube-proxy, so ClusterIP Services
also resolve to their endpoints. Anything else is NXDOMAIN: pods never reach a resolver off this machine."""

from __future__ import annotations

import json
import socket
import struct
import threading

from tandem.testing.cluster import ControlPlane

DOMAIN = "svc.cluster.local"
TTL = 1


def _names(msg: bytes, off: int) -> tuple[str, int]:
    labels = []
    while msg[off]:
        n = msg[off]
        labels.append(msg[off + 1 : off + 1 + n].decode("ascii", "replace"))
        off += n + 1
    return ".".join(labels).lower(), off + 1


class ClusterDns:
    """UDP DNS on (host, port) backed by the control plane's Services and EndpointSlices."""

    def __init__(self, cp: ControlPlane, host: str, port: int = 53):
        self.cp = cp
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.sock.settimeout(0.5)
        self.records: dict[str, list[str]] = {}
        self.stop_event = threading.Event()
        self.threads = [
            threading.Thread(target=self._serve, daemon=True),
            threading.Thread(target=self._refresh, daemon=True),
        ]

    def start(self) -> ClusterDns:
        for t in self.threads:
            t.start()
        return self

    def stop(self) -> None:
        self.stop_event.set()
        for t in self.threads:
            t.join(timeout=5)
        self.sock.close()

    def _refresh(self) -> None:
        while not self.stop_event.is_set():
            try:
                self.records = self._load()
            except Exception:  # the API server restarting or slow: keep the last answers
                pass
            self.stop_event.wait(1.0)

    def _load(self) -> dict[str, list[str]]:
        svcs = json.loads(self.cp.kubectl("get", "services", "-A", "-o", "json").stdout)["items"]
        slices = json.loads(self.cp.kubectl("get", "endpointslices", "-A", "-o", "json").stdout)["items"]
        publish_all = {
            (s["metadata"]["namespace"], s["metadata"]["name"])
            for s in svcs
            if s["spec"].get("publishNotReadyAddresses")
        }
        out: dict[str, list[str]] = {
            f"{s['metadata']['name']}.{s['metadata']['namespace']}.{DOMAIN}": [] for s in svcs
        }
        for sl in slices:
            ns = sl["metadata"]["namespace"]
            svc = sl["metadata"].get("labels", {}).get("kubernetes.io/service-name")
            if not svc:
                continue
            for ep in sl.get("endpoints") or []:
                ready = (ep.get("conditions") or {}).get("ready", True)
                if ready or (ns, svc) in publish_all:
                    out.setdefault(f"{svc}.{ns}.{DOMAIN}", []).extend(ep.get("addresses", []))
        return out

    def _serve(self) -> None:
        while not self.stop_event.is_set():
            try:
                msg, peer = self.sock.recvfrom(512)
            except (TimeoutError, OSError):
                continue
            try:
                self.sock.sendto(self._answer(msg), peer)
            except Exception:
                continue

    def _answer(self, msg: bytes) -> bytes:
        qid, _flags, _qdcount = struct.unpack("!HHH", msg[:6])
        name, off = _names(msg, 12)
        qtype, _qclass = struct.unpack("!HH", msg[off : off + 4])
        question = msg[12 : off + 4]
        addrs = self.records.get(name)
        if addrs is None:
            # NXDOMAIN, recursion available, one question
            return struct.pack("!HHHHHH", qid, 0x8183, 1, 0, 0, 0) + question
        answers = b""
        count = 0
        if qtype == 1:  # A
            for a in addrs:
                answers += b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, TTL, 4) + socket.inet_aton(a)
                count += 1
        return struct.pack("!HHHHHH", qid, 0x8580, 1, count, 0, 0) + question + answers
