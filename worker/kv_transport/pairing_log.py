"""Says in the log which KV transport a worker and each peer use: once per pair and transport (the first
push, or the handshake), so the choice is visible without a line per request."""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict

from tandem.v1 import common_pb2

REMEMBERED = 1024  # (peer, transport) pairs kept; an older pair seen again is logged again


def transport_label(kind: int) -> str:
    """A transport as logs and metric labels name it: grpc, shm, cuda_ipc (a value this build does not know:
    its number)."""
    try:
        return common_pb2.KvTransport.Name(kind).removeprefix("KV_TRANSPORT_").lower()
    except ValueError:
        return str(kind)


class PairingLog:
    def __init__(self, logger: logging.Logger, limit: int = REMEMBERED):
        self.logger, self.limit = logger, limit
        self._seen: OrderedDict[tuple[str, int], None] = OrderedDict()
        self._lock = threading.Lock()

    def note(self, peer: str, kind: int, message: str, *args: object) -> bool:
        """Log `message % (*args, transport)` the first time `peer` uses transport `kind`; True when it
        logged."""
        key = (peer, kind)
        with self._lock:
            if key in self._seen:
                self._seen.move_to_end(key)
                return False
            self._seen[key] = None
            if len(self._seen) > self.limit:
                self._seen.popitem(last=False)
        self.logger.info(message, *args, transport_label(kind))
        return True
