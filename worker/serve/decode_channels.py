"""The prefill worker's kept channels to decode workers: bounded (least recently used closed first), and
redialled with the new credentials when its client certificate is renewed in place, while a KV push open on
an old channel finishes (the old channels are closed at the renewal after)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import grpc

from tandem.worker.api.tls import ClientCertWatch, TlsConfig
from tandem.worker.api.tls import channel as tls_channel

MAX_DECODE_CHANNELS = 64  # decode workers a prefill worker keeps a channel to


class DecodeChannels:
    def __init__(
        self, tls: TlsConfig | None, options: Sequence[tuple[str, Any]] = (), limit: int = MAX_DECODE_CHANNELS
    ) -> None:
        self.options, self.limit = list(options), limit
        self.certs = ClientCertWatch(tls)
        self._open: OrderedDict[str, grpc.Channel] = OrderedDict()  # least recently used first
        self.renewed_away: list[grpc.Channel] = []  # the channels of the last renewal
        self._lock = threading.Lock()

    def get(self, address: str) -> grpc.Channel:
        """The kept channel to `address` (with mutual TLS, one whose certificate says decode in this
        service)."""
        to_close: list[grpc.Channel] = []
        with self._lock:
            if self.certs.renewed() is not None:
                to_close, self.renewed_away = self.renewed_away, list(self._open.values())
                self._open.clear()
            channel = self._open.get(address)
            if channel is not None:
                self._open.move_to_end(address)
                return channel
            tls = self.certs.tls
            channel = self._open[address] = tls_channel(
                address, tls.to("decode") if tls else None, self.options
            )
            if len(self._open) > self.limit:
                to_close.append(self._open.popitem(last=False)[1])
        for old in to_close:
            old.close()
        return channel

    def open(self, address: str, timeout_s: float) -> bool:
        """Connect the kept channel to `address` now (TCP, and TLS with mutual TLS), so that the first KV push
        to it does not wait for the connection; False when it is not connected within `timeout_s`."""
        try:
            grpc.channel_ready_future(self.get(address)).result(timeout=timeout_s)
        except grpc.FutureTimeoutError:
            return False
        return True

    def __len__(self) -> int:
        return len(self._open)
