"""How the kubelet judges and stops a pod: the workers' gRPC health probes on their health-only port, the
router's HTTP probes, and the worker's preStop drain."""

from __future__ import annotations

from typing import Any

from tandem import names
from tandem.identity import peer_name
from tandem.launch import drain_timeout_seconds, tls_argv
from tandem.operator.manifests.pod_tls import tls_dir
from tandem.spec import InferenceServiceSpec

PROBE_TIMEOUT_S = {"startup": 5, "readiness": 3, "liveness": 5}  # the health server answers in milliseconds


def worker_probes() -> dict[str, Any]:
    """gRPC health probes against the plaintext health-only port, served by its own server and threads, so
    that no load on the gRPC port (token streams, KV pushes) can delay them past their timeouts."""
    grpc = {"grpc": {"port": names.HEALTH_PORT}}
    t = PROBE_TIMEOUT_S
    return {
        "startupProbe": {**grpc, "periodSeconds": 10, "failureThreshold": 60, "timeoutSeconds": t["startup"]},
        "readinessProbe": {
            **grpc,
            "periodSeconds": 5,
            "failureThreshold": 3,
            "timeoutSeconds": t["readiness"],
        },
        # A draining worker is NOT_SERVING on the empty service name; liveness asks for the one that stays up,
        # so the kubelet never restarts a worker that is finishing its requests. It fails when the engine
        # loop itself is broken or stuck (serve/health.py).
        "livenessProbe": {
            "grpc": {**grpc["grpc"], "service": names.WORKER_LIVENESS_SERVICE},
            "periodSeconds": 10,
            "failureThreshold": 6,
            "timeoutSeconds": t["liveness"],
        },
    }


def worker_lifecycle(spec: InferenceServiceSpec, service: str, pool: str) -> dict[str, Any]:
    """preStop: drain the worker (no new work, finish what it holds) before the kubelet sends SIGTERM; over
    loopback with the pod's own certificate, the one caller besides the operator a worker drains for."""
    tls = tls_argv(spec, tls_dir(spec, pool))
    drain = [
        "tandem",
        "drain",
        "--address",
        f"127.0.0.1:{names.GRPC_PORT}",
        "--wait",
        "--timeout",
        str(drain_timeout_seconds(spec)),
        *tls,
        *(["--tls-server-name", peer_name(pool, service)] if tls else []),
    ]
    return {"preStop": {"exec": {"command": drain}}}


def router_probes() -> dict[str, Any]:
    """Readiness follows the worker pools (no healthy worker: out of the Service); liveness only the process,
    so a pool outage or a first rollout never restarts the router."""
    ready = {"httpGet": {"path": names.READINESS_PATH, "port": names.HTTP_PORT}}
    alive = {"httpGet": {"path": names.LIVENESS_PATH, "port": names.HTTP_PORT}}
    return {
        "readinessProbe": {**ready, "periodSeconds": 5, "failureThreshold": 3},
        "livenessProbe": {**alive, "periodSeconds": 10, "failureThreshold": 6},
    }
