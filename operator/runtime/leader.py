"""Lease-based leader election, so two operator replicas never both act.

Written against the Lease API alone, through the operator's own client (runtime/kube.py).
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import socket
import threading
import time
from typing import Any

from tandem.operator.runtime.kube import ApiError, Kube

log = logging.getLogger("tandem.operator")


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _micro(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(value: str | None) -> dt.datetime | None:
    """A Lease's MicroTime (RFC 3339, UTC) as an aware datetime."""
    return dt.datetime.fromisoformat(value) if value else None


def lease_free(
    holder: str | None, renewed: dt.datetime | None, duration: int, me: str, now: dt.datetime
) -> bool:
    """Pure rule: we may take the lease if it is ours, unheld, or its holder let it expire."""
    if not holder or holder == me or renewed is None:
        return True
    return now > renewed + dt.timedelta(seconds=duration)


class Leader:
    """wait() blocks until this process holds the Lease, then renews it in a thread; losing it exits."""

    def __init__(
        self,
        kube: Kube,
        name: str,
        namespace: str,
        lease_seconds: int = 15,
        renew_seconds: int = 10,
        retry_seconds: int = 2,
    ):
        if not retry_seconds < renew_seconds < lease_seconds:
            raise ValueError("need retry_seconds < renew_seconds < lease_seconds")
        self.name, self.namespace = name, namespace
        self.lease_seconds, self.renew_seconds, self.retry_seconds = (
            lease_seconds,
            renew_seconds,
            retry_seconds,
        )
        self.identity = f"{socket.gethostname()}-{os.getpid()}"
        self.kube = kube

    def _body(self, spec: dict[str, Any], resource_version: str | None = None) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if resource_version:
            meta["resourceVersion"] = resource_version
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}

    def try_acquire(self) -> bool:
        """One attempt to take or renew the lease; optimistic concurrency makes a race lose cleanly."""
        now = _now()
        mine = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self.lease_seconds,
            "renewTime": _micro(now),
        }
        lease = self.kube.get("Lease", self.namespace, self.name)
        if lease is None:
            try:
                self.kube.create(self._body({**mine, "acquireTime": _micro(now), "leaseTransitions": 0}))
                return True
            except ApiError as e:
                if e.status == 409:
                    return False
                raise
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity")
        duration = spec.get("leaseDurationSeconds") or self.lease_seconds
        if not lease_free(holder, parse_time(spec.get("renewTime")), duration, self.identity, now):
            return False
        ours = holder == self.identity and spec.get("acquireTime")
        body = {
            **mine,
            "acquireTime": spec["acquireTime"] if ours else _micro(now),
            "leaseTransitions": (spec.get("leaseTransitions") or 0) + (holder != self.identity),
        }
        try:
            self.kube.replace(self._body(body, lease["metadata"]["resourceVersion"]))
            return True
        except ApiError as e:
            if e.status == 409:
                return False
            raise

    def _attempt(self) -> bool:
        try:
            return self.try_acquire()
        except Exception as e:  # API hiccup: try again later
            log.warning("leader election: %s", e)
            return False

    def wait(self) -> None:
        log.info("leader election: %s waiting for %s/%s", self.identity, self.namespace, self.name)
        while not self._attempt():
            time.sleep(self.retry_seconds)
        log.info("leader election: %s leads %s/%s", self.identity, self.namespace, self.name)
        threading.Thread(target=self._renew_forever, daemon=True, name="lease-renewal").start()

    def _renew_forever(self) -> None:
        last = time.monotonic()
        while True:
            time.sleep(self.retry_seconds)
            if self._attempt():
                last = time.monotonic()
            elif time.monotonic() - last > self.renew_seconds:
                log.error("leader election: lost the lease, exiting so another replica takes over")
                os._exit(1)

    def release(self) -> None:
        """Expire our lease on a clean shutdown, so a successor does not wait out the lease."""
        try:
            lease = self.kube.get("Lease", self.namespace, self.name)
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            past = _now() - dt.timedelta(hours=1)
            self.kube.merge_patch(
                "Lease",
                self.namespace,
                self.name,
                {"spec": {"leaseDurationSeconds": 1, "renewTime": _micro(past)}},
            )
        except Exception as e:  # shutting down: nothing useful to do on failure
            log.warning("leader election: could not release the lease: %s", e)
