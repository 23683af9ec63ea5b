"""`tandem flip`: tell a warm worker to take another role (SetRole: prefill, decode or colocated), or flip N
workers of a running `tandem up` stack from one pool to another.

A worker changes role in place: it drains the old role's work, then serves the new one with the engine
and weights it has; the router follows the role it reports. The stack's own identity (the operator's
certificate under its run directory) makes the call; a worker's certificate must name the new role
(spec.roleFlip).
"""

from __future__ import annotations

import argparse
import sys

import grpc

from tandem.operator.local.flip import ROLE_ENUMS, set_role
from tandem.worker.api.tls import TlsConfig, channel

OTHER = {"prefill": "decode", "decode": "prefill"}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="tandem flip", description=__doc__.splitlines()[0])
    p.add_argument("--to", required=True, choices=sorted(ROLE_ENUMS), help="the role to take")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--address", help="one worker's gRPC host:port")
    where.add_argument("-f", "--file", help="the InferenceService YAML a `tandem up` runs (with --log-dir)")
    p.add_argument("--log-dir", help="the run directory of that `tandem up` (its --log-dir)")
    p.add_argument(
        "--count", type=int, default=1, help="with -f: how many workers of the --from role to flip"
    )
    p.add_argument(
        "--from",
        dest="from_role",
        choices=sorted(ROLE_ENUMS),
        default=None,
        help="with -f: the pool to flip workers from (default: the other of prefill and decode)",
    )
    p.add_argument("--reason", default="tandem flip")
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=0.0,
        help="seconds the old role's work may take (0: the worker's)",
    )
    p.add_argument(
        "--tls-dir", default=None, help="with --address, mutual TLS: the operator's tls.crt, tls.key, ca.crt"
    )
    p.add_argument("--tls-server-name", default=None, help="name in the worker's certificate")
    args = p.parse_args(argv)
    if args.file:
        if not args.log_dir:
            p.error("-f needs --log-dir: the run directory of the `tandem up` to change")
        from_role = args.from_role or OTHER.get(args.to)
        if from_role is None or from_role == args.to:
            p.error(f"-f --to {args.to} needs --from: the pool to flip workers from")
        from tandem.operator.local.flip import flip_running_stack

        try:
            flipped = flip_running_stack(args.file, args.log_dir, from_role, args.to, args.count, args.reason)
        except (OSError, ValueError) as e:
            print(f"tandem flip: {e}", file=sys.stderr)
            return 2
        for address, reply in flipped:
            print(
                f"{address}: now {args.to} (drained in {reply.drain_s:.2f} s, switched in "
                f"{reply.switch_s:.3f} s)"
            )
        return 0 if len(flipped) == args.count else 1
    try:
        tls = TlsConfig.optional(args.tls_dir, args.tls_server_name)
        with channel(args.address, tls) as chan:
            reply = set_role(chan, args.to, args.reason, args.drain_timeout)
    except grpc.RpcError as e:
        print(f"tandem flip: {args.address}: {e.code().name} {e.details()}", file=sys.stderr)
        return 1
    print(
        f"{args.address}: now {args.to} (drained in {reply.drain_s:.2f} s, switched in {reply.switch_s:.3f} "
        "s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
