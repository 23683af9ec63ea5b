"""`python -m tandem.operator` / `tandem operator`: run the kopf operator in or out of a cluster."""

from __future__ import annotations

import argparse
import logging
import os
import sys


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="tandem operator", description="Reconcile InferenceServices into GPU pools."
    )
    p.add_argument(
        "--kubeconfig",
        default=os.environ.get("KUBECONFIG"),
        help="kubeconfig file (default: in-cluster config, then ~/.kube/config)",
    )
    p.add_argument(
        "--namespace",
        "-n",
        action="append",
        default=[],
        help="watch only this namespace (repeatable); default: all namespaces",
    )
    p.add_argument(
        "--leader-elect",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="hold a coordination.k8s.io Lease before acting (default on)",
    )
    p.add_argument("--lease-name", default="tandem-operator")
    p.add_argument("--lease-namespace", default=os.environ.get("POD_NAMESPACE", "default"))
    p.add_argument("--lease-seconds", type=int, default=15)
    p.add_argument("--renew-seconds", type=int, default=10)
    p.add_argument("--retry-seconds", type=int, default=2)
    p.add_argument(
        "--health-port",
        type=int,
        default=None,
        help="serve /healthz on this port for the pod's probes (healthy while standby, then while leading)",
    )
    p.add_argument("--health-host", default="0.0.0.0")
    p.add_argument(
        "--liveness", default=None, help="kopf liveness endpoint, e.g. http://0.0.0.0:8080/healthz"
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="check the CRD is served, readable, and an operator holds the lease, then exit (helm test)",
    )
    p.add_argument(
        "--prometheus-url",
        default=os.environ.get("TANDEM_PROMETHEUS_URL"),
        help="the autoscaler reads Prometheus' HTTP API here; default: it scrapes the pods' /metrics",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=int(os.environ.get("TANDEM_OPERATOR_METRICS_PORT", "0")),
        help="serve the autoscaler's own metrics on this port (0: off)",
    )
    p.add_argument("--verbose", "-v", action="store_true")
    return p.parse_args(argv)


def load_config(kubeconfig: str | None) -> None:
    from kubernetes import client

    from tandem.operator.runtime.kube import load_credentials

    load_credentials(kubeconfig)
    cfg = client.Configuration.get_default_copy()
    cfg.connection_pool_maxsize = 32  # reconcile workers x side-by-side applies share one pool
    client.Configuration.set_default(cfg)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    load_config(args.kubeconfig)
    if args.check:
        from tandem.operator.runtime.check import check

        ok, lines = check(args.namespace, args.lease_name, args.lease_namespace)
        print("\n".join(lines), flush=True)
        return 0 if ok else 1
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig  # kopf logs in through the same file
    if args.prometheus_url:
        os.environ["TANDEM_PROMETHEUS_URL"] = args.prometheus_url  # read by the autoscaler at startup
    if args.metrics_port:
        os.environ["TANDEM_OPERATOR_METRICS_PORT"] = str(args.metrics_port)
    from tandem.operator.manifests.security_defaults import (
        ENV,
        OPERATOR_PEER_ENV,
        operator_peer,
        process_defaults,
    )
    from tandem.operator.model.cache import process_model_cache

    for name, read in ((ENV, process_defaults), (OPERATOR_PEER_ENV, operator_peer)):
        try:
            read()  # a bad chart value stops the operator here, not at the first reconcile
        except ValueError as e:
            print(f"tandem operator: {name}: {e}", file=sys.stderr)
            return 2
    try:
        process_model_cache()
    except ValueError as e:
        print(f"tandem operator: {e}", file=sys.stderr)
        return 2

    import kopf

    from tandem.operator import handlers  # noqa: F401  (registers the handlers)
    from tandem.operator.runtime import health
    from tandem.operator.runtime.leader import Leader

    if args.health_port is not None:
        health.serve(args.health_port, args.health_host)
    leader = None
    if args.leader_elect:
        leader = Leader(
            args.lease_name, args.lease_namespace, args.lease_seconds, args.renew_seconds, args.retry_seconds
        )
        leader.wait()
    health.HEARTBEAT.lead()
    settings = kopf.OperatorSettings()
    # Named namespaces: no watching of Namespaces or CRDs, which a namespaced install's Roles do not grant
    # (the CRDs are installed before the operator starts; the resources are discovered once at startup).
    settings.scanning.disabled = bool(args.namespace)
    try:
        kopf.run(
            standalone=True,  # the Lease, not kopf peering, decides who acts
            clusterwide=not args.namespace,
            namespaces=args.namespace,
            liveness_endpoint=args.liveness,
            settings=settings,
        )
    finally:
        if leader:
            leader.release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
