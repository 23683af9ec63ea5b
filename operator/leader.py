"""Lease-based leader election, so two operator replicas never both act."""

from __future__ import annotations

import datetime as dt
import logging
import os
import socket
import threading

from kubernetes import client
from kubernetes.leaderelection import electionconfig, leaderelection
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

log = logging.getLogger("tandem.operator")


class Leader:
    """Blocks in wait() until this process holds the Lease; exits the process if it ever loses it."""

    def __init__(self, name: str, namespace: str, lease_seconds: int = 15, renew_seconds: int = 10,
                 retry_seconds: int = 2):
        self.name, self.namespace = name, namespace
        self.identity = f"{socket.gethostname()}-{os.getpid()}"
        self._leading = threading.Event()
        self._config = electionconfig.Config(
            LeaseLock(name, namespace, self.identity), lease_seconds, renew_seconds, retry_seconds,
            self._started, self._stopped)

    def _started(self) -> None:
        log.info("leader election: %s leads %s/%s", self.identity, self.namespace, self.name)
        self._leading.set()
        threading.Event().wait()  # keep the renew loop going for the life of the process

    def _stopped(self) -> None:
        log.error("leader election: lost the lease, exiting so another replica takes over")
        os._exit(1)

    def wait(self) -> None:
        threading.Thread(target=leaderelection.LeaderElection(self._config).run, daemon=True,
                         name="leader-election").start()
        log.info("leader election: %s waiting for %s/%s", self.identity, self.namespace, self.name)
        self._leading.wait()

    def release(self) -> None:
        """Expire our lease on a clean shutdown, so a successor does not wait out the lease."""
        api = client.CoordinationV1Api()
        try:
            lease = api.read_namespaced_lease(self.name, self.namespace)
            if lease.spec is None or lease.spec.holder_identity != self.identity:
                return
            past = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
            api.patch_namespaced_lease(self.name, self.namespace, {"spec": {
                "leaseDurationSeconds": 1, "renewTime": past.strftime("%Y-%m-%dT%H:%M:%S.%fZ")}})
        except Exception as e:  # shutting down: nothing useful to do on failure
            log.warning("leader election: could not release the lease: %s", e)
