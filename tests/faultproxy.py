"""A fault-injecting TCP proxy on loopback, for tests: forwards to one upstream address and, on demand,
delays, cuts, resets or stalls each connection once it has carried a number of bytes upstream since the
fault was set (gRPC keeps connections open: bytes from before do not count). A stall holds the bytes
with the connection open (no FIN, no RST), as a hung peer or a black-holed route does, until the fault
is changed."""

from __future__ import annotations

import socket
import struct
import threading
import time
from dataclasses import dataclass


@dataclass
class Fault:
    mode: str = "pass"  # pass | delay | cut | reset | stall
    after_bytes: int = 0  # cut, reset or stall a connection once this many bytes went upstream through it
    delay_s: float = 0.0  # per forwarded read, in `delay` mode


class FaultProxy:
    def __init__(self, upstream: str) -> None:
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))
        self.fault = Fault()
        self.faults_injected = 0
        self.accepted = 0  # connections taken: the first says a client (the router's poll) dialled the proxy
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._closed = threading.Event()
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        with self._lock:
            for s in self._conns:
                _close(s)

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self.accepted += 1
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                _close(client)
                continue
            server.settimeout(None)
            with self._lock:
                self._conns += [client, server]
            sent: list = [0, self.fault]
            threading.Thread(target=self._pump, args=(client, server, sent, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, sent, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, sent: list, upstream: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                fault = self.fault
                if fault.mode == "delay":
                    time.sleep(fault.delay_s)
                if upstream:
                    if sent[1] is not fault:  # a new fault: count from now
                        sent[0], sent[1] = 0, fault
                    sent[0] += len(data)
                    if fault.mode == "stall" and sent[0] > fault.after_bytes:
                        self.faults_injected += 1
                        keep = max(0, len(data) - (sent[0] - fault.after_bytes))
                        dst.sendall(data[:keep])
                        while self.fault is fault and not self._closed.is_set():
                            time.sleep(0.02)  # hold the rest, connection open
                        data = data[keep:]
                    if fault.mode in ("cut", "reset") and sent[0] > fault.after_bytes:
                        self.faults_injected += 1
                        keep = max(0, len(data) - (sent[0] - fault.after_bytes))
                        dst.sendall(data[:keep])  # the transfer stops in the middle of a message
                        if fault.mode == "reset":  # RST instead of FIN
                            for s in (src, dst):
                                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                        break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            _close(src)
            _close(dst)


def _close(s: socket.socket) -> None:
    try:
        s.close()
    except OSError:
        pass
