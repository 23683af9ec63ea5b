"""`tandem drain`: tell a worker to drain and wait until it holds nothing (a pod's preStop hook runs it)."""

from __future__ import annotations

import argparse
import sys
import time

import grpc

from tandem import names
from tandem.v1 import lifecycle_pb2, lifecycle_pb2_grpc
from tandem.worker.api.tls import TlsConfig, channel


def drain(
    address: str,
    reason: str,
    wait: bool,
    poll_s: float = 0.5,
    timeout_s: float | None = None,
    tls: TlsConfig | None = None,
) -> int:
    """Start the drain; with `wait`, ask again until the worker holds nothing or has gone.
    Returns the work still held (0 when drained or gone)."""
    deadline = time.monotonic() + timeout_s if timeout_s else None
    with channel(address, tls) as chan:
        stub = lifecycle_pb2_grpc.LifecycleServiceStub(chan)
        while True:
            try:
                reply = stub.Drain(lifecycle_pb2.DrainRequest(reason=reason), timeout=5)
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.UNAVAILABLE:  # gone: its drain finished and it exited
                    return 0
                raise
            if not wait or reply.busy == 0:
                return reply.busy
            if deadline is not None and time.monotonic() > deadline:
                return reply.busy
            time.sleep(poll_s)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="tandem drain", description=__doc__)
    p.add_argument("--address", default=f"127.0.0.1:{names.GRPC_PORT}", help="the worker's gRPC host:port")
    p.add_argument("--reason", default="preStop")
    p.add_argument(
        "--wait", action="store_true", help="return only once the worker holds nothing (or exited)"
    )
    p.add_argument("--timeout", type=float, default=None, help="stop waiting after this many seconds")
    p.add_argument(
        "--tls-dir", default=None, help="mutual TLS: tls.crt, tls.key, ca.crt (default: plaintext)"
    )
    p.add_argument("--tls-server-name", default=None, help="name in the worker's certificate")
    args = p.parse_args(argv)
    try:
        tls = TlsConfig.optional(args.tls_dir, args.tls_server_name)
        held = drain(args.address, args.reason, args.wait, timeout_s=args.timeout, tls=tls)
    except grpc.RpcError as e:
        print(f"tandem drain: {args.address}: {e.code().name} {e.details()}", file=sys.stderr)
        return 1
    print(f"{args.address}: {'drained' if held == 0 else f'draining, {held} still held'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
