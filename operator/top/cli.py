"""`tandem top`: poll the chosen sources every --interval seconds and show one row per InferenceService,
live in a terminal, or printed once per poll when stdout is not one (headless, --iterations N)."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Protocol

from rich.console import Console
from rich.live import Live

from tandem.operator.top.view import History, ServiceState, merge_sources, table

LOCAL_ROUTER = "http://127.0.0.1:8000"


class Source(Protocol):
    def poll(self) -> list[ServiceState]: ...

    def close(self) -> None: ...


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="tandem top", description=__doc__.splitlines()[0])
    p.add_argument(
        "--router",
        action="append",
        default=[],
        help=f"a router's base URL to scrape /metrics from (repeatable); default {LOCAL_ROUTER} "
        "(a local `tandem up`) when no other source is given",
    )
    p.add_argument("--prometheus", help="Prometheus base URL (what the chart's PodMonitor feeds)")
    p.add_argument(
        "--kube",
        action="store_true",
        help="InferenceServices, replicas and scaling Events from the Kubernetes API",
    )
    p.add_argument("--kubeconfig", help="kubeconfig for --kube (default: in-cluster, then ~/.kube/config)")
    p.add_argument(
        "--file",
        "-f",
        action="append",
        default=[],
        help="an InferenceService spec a local `tandem up` runs: desired replicas and the SLO (repeatable)",
    )
    p.add_argument("--namespace", "-n", help="only this namespace")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between polls")
    p.add_argument("--iterations", type=int, default=0, help="stop after this many polls (0: until Ctrl-C)")
    p.add_argument(
        "--window", type=float, default=30.0, help="seconds of latency the --router quantiles cover"
    )
    return p.parse_args(argv)


def sources(args: argparse.Namespace) -> list[Source]:
    out: list[Source] = []
    if args.file:
        from tandem.operator.top.local import SpecSource

        out.append(SpecSource(args.file))
    if args.kube:
        from tandem.operator.top.kube import KubeSource

        out.append(KubeSource(args.kubeconfig, args.namespace))
    if args.prometheus:
        from tandem.operator.top.prom import PrometheusSource

        out.append(PrometheusSource(args.prometheus, args.namespace))
    routers = args.router or ([] if args.kube or args.prometheus else [LOCAL_ROUTER])
    if routers:
        from tandem.operator.top.scrape import RouterScrape

        out.append(RouterScrape(routers, args.window, args.namespace))
    return out


def poll_all(srcs: list[Source]) -> tuple[list[ServiceState], list[str]]:
    """Every source's states merged, and one line per source that failed this time."""
    polled, problems = [], []
    for s in srcs:
        try:
            polled.append(s.poll())
        except Exception as e:  # one source down must not blank the others
            problems.append(f"{type(s).__name__}: {e}")
    return merge_sources(*polled), problems


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    console = Console()
    srcs, history = sources(args), History()

    def frame():
        states, problems = poll_all(srcs)
        for st in states:
            history.add(st)
        title = "tandem top" + (f"  [red]{'; '.join(problems)}[/red]" if problems else "")
        return table(states, history, title)

    n = 0
    try:
        if console.is_terminal:
            with Live(frame(), console=console, auto_refresh=False) as live:
                n = 1
                while not args.iterations or n < args.iterations:
                    time.sleep(args.interval)
                    live.update(frame(), refresh=True)
                    n += 1
        else:
            while not args.iterations or n < args.iterations:
                if n:
                    time.sleep(args.interval)
                console.print(frame())
                n += 1
    except KeyboardInterrupt:
        pass
    finally:
        for s in srcs:
            s.close()
    return 0
