"""Operator benchmark on the test control plane: apply-to-children latency, RSS, steady-state API writes.

    python bench/operator.py [--objects 100] [--rss-objects 200]

Starts its own loopback cluster (tandem/testing/cluster.py; builds the binaries on first use). Bench objects
keep prefill and decode at 0 replicas (router 1) so the 2-core test machine measures the operator, not
kwok; a pool at 0 needs the autoscaler on (admission refuses it otherwise), so it is on with a tick of an
hour, which no run lasts. Prints one line per figure.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import threading
import time
from pathlib import Path

from kubernetes import client, config, watch

from bench._smoke import add_smoke, smoke_sizes
from tandem import names
from tandem.testing.cluster import ControlPlane, find_binaries
from tandem.testing.operator_process import Operator

GROUP, VERSION = "serving.tandem.dev", "v1alpha1"
CHILD_KINDS = ("deployments", "services", "poddisruptionbudgets", "tandempools")
CHILDREN_PER_OBJECT = 3 + 3 + 2 + 2  # deployments, services, PDBs, pools
WRITE_VERBS = ("POST", "PUT", "PATCH", "APPLY", "DELETE")
OPERATOR_RESOURCES = (
    "inferenceservices",
    "tandempools",
    "deployments",
    "services",
    "poddisruptionbudgets",
    "events",
)


def bench_object(name: str) -> dict:
    pool = {"replicas": 0, "minReplicas": 0, "maxReplicas": 4, "resources": {"gpus": 1}}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": {
            "model": {"source": {"path": "/models/m"}, "servedName": name},
            "prefill": pool,
            "decode": pool,
            "autoscaling": {"enabled": True, "intervalSeconds": 3600},
        },
    }


class ChildWatcher:
    """Records when each child of each bench object is first seen, through watches (no polling)."""

    def __init__(self, api: client.ApiClient, namespace: str):
        self.api, self.ns = api, namespace
        self.seen: dict[str, dict[str, float]] = {}
        self.lock = threading.Lock()
        self.stop = False

    def _list_fn(self, kind: str):
        core, apps, policy = (
            client.CoreV1Api(self.api),
            client.AppsV1Api(self.api),
            client.PolicyV1Api(self.api),
        )
        custom = client.CustomObjectsApi(self.api)
        return {
            "deployments": (apps.list_namespaced_deployment, {}),
            "services": (core.list_namespaced_service, {}),
            "poddisruptionbudgets": (policy.list_namespaced_pod_disruption_budget, {}),
            "tandempools": (
                custom.list_namespaced_custom_object,
                {"group": GROUP, "version": VERSION, "plural": "tandempools"},
            ),
        }[kind]

    def _run(self, kind: str) -> None:
        try:
            self._watch(kind)
        except Exception:  # the cluster going away at the end of the run
            if not self.stop:
                raise

    def _watch(self, kind: str) -> None:
        fn, extra = self._list_fn(kind)
        w = watch.Watch()
        for ev in w.stream(
            fn, namespace=self.ns, label_selector=names.LABEL_SERVICE, timeout_seconds=3600, **extra
        ):
            if self.stop:
                return
            obj = ev["object"]
            meta = obj["metadata"] if isinstance(obj, dict) else obj.metadata.to_dict()
            owner = meta["labels"][names.LABEL_SERVICE]
            with self.lock:
                self.seen.setdefault(owner, {}).setdefault(f"{kind}/{meta['name']}", time.monotonic())

    def start(self) -> None:
        for kind in CHILD_KINDS:
            threading.Thread(target=self._run, args=(kind,), daemon=True).start()

    def complete_at(self, owner: str) -> float | None:
        with self.lock:
            got = self.seen.get(owner, {})
            return max(got.values()) if len(got) >= CHILDREN_PER_OBJECT else None


def write_counts(cp: ControlPlane) -> int:
    """Writes to the resources the operator manages, from the API server's own request counter."""
    text = cp.kubectl("get", "--raw", "/metrics").stdout
    total = 0
    for line in text.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        verb = re.search(r'verb="([A-Z]+)"', line)
        res = re.search(r'resource="([a-z]+)"', line)
        if verb and res and verb.group(1) in WRITE_VERBS and res.group(1) in OPERATOR_RESOURCES:
            total += int(float(line.rsplit(" ", 1)[1]))
    return total


def ready_count(custom: client.CustomObjectsApi, ns: str) -> int:
    items = custom.list_namespaced_custom_object(GROUP, VERSION, ns, "inferenceservices")["items"]
    return sum(
        any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in (i.get("status") or {}).get("conditions") or []
        )
        for i in items
    )


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait(fn, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if fn():
            return
        time.sleep(0.5)
    raise TimeoutError(what)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--objects", type=int, default=100, help="objects for the latency figure")
    p.add_argument(
        "--rss-objects",
        type=int,
        default=200,
        help="objects alive for the RSS figure (0: only the latency figure)",
    )
    p.add_argument("--gap", type=float, default=0.1, help="seconds between applies")
    p.add_argument(
        "--resync", type=int, default=20, help="operator resync period for the steady-state figure"
    )
    add_smoke(p)
    args = smoke_sizes(p.parse_args(argv), objects=3, rss_objects=4, gap=0.0, resync=2)

    cp = ControlPlane(find_binaries(), nodes=2).start()
    op = None
    try:
        cp.install_crds_and_rbac()
        op = Operator(cp, extra_env={"TANDEM_RESYNC_SECONDS": str(args.resync)}).start()
        api = config.new_client_from_config(config_file=str(cp.kubeconfig("admin")))
        custom = client.CustomObjectsApi(api)
        ns = "bench"
        cp.kubectl("create", "namespace", ns)
        wait(lambda: "leads" in op.log(), 60, "operator leads")
        watcher = ChildWatcher(api, ns)
        watcher.start()
        time.sleep(1)

        cpu0 = cpu_seconds(op.proc.pid)
        cluster0 = {name: cpu_seconds(p.pid) for name, p in cp.procs.items()}
        applied: dict[str, float] = {}
        for i in range(args.objects):
            name = f"bench-{i:03d}"
            applied[name] = time.monotonic()
            custom.create_namespaced_custom_object(
                GROUP, VERSION, ns, "inferenceservices", bench_object(name)
            )
            time.sleep(args.gap)
        wait(lambda: all(watcher.complete_at(n) for n in applied), 300, "children of every object")
        lat = sorted(watcher.complete_at(n) - t for n, t in applied.items())
        p50 = statistics.median(lat)
        p99 = lat[min(len(lat) - 1, int(round(0.99 * len(lat))) - 1)]
        watcher.stop = True
        print(f"operator CPU while creating {len(applied)} objects: {cpu_seconds(op.proc.pid) - cpu0:.1f} s")
        cluster = {name: cpu_seconds(cp.procs[name].pid) - t for name, t in cluster0.items()}
        print(
            "control plane CPU meanwhile: "
            + ", ".join(f"{name} {t:.1f} s" for name, t in sorted(cluster.items(), key=lambda kv: -kv[1]))
        )
        print(
            f"apply->all {CHILDREN_PER_OBJECT} children created over {len(lat)} objects: "
            f"p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, max {lat[-1] * 1000:.0f} ms (target p99 < "
            "1000 ms)"
        )
        if args.rss_objects <= 0:
            return 0

        for i in range(args.objects, args.rss_objects):
            custom.create_namespaced_custom_object(
                GROUP, VERSION, ns, "inferenceservices", bench_object(f"bench-{i:03d}")
            )
        wait(lambda: ready_count(custom, ns) >= args.rss_objects, 600, "all objects Ready")
        time.sleep(args.resync + 2)  # at least one full resync with everything alive
        print(
            f"operator RSS with {args.rss_objects} InferenceServices: {rss_mb(op.proc.pid):.0f} MB "
            f"(target < 200 MB)"
        )

        before = write_counts(cp)
        cycles = 3
        time.sleep(args.resync * cycles + 2)
        writes = write_counts(cp) - before
        reconciles = args.rss_objects * cycles
        print(
            f"steady state: {writes} API writes over {cycles} resyncs of {args.rss_objects} objects "
            f"(~{reconciles} reconciles) = {writes / reconciles:.3f} writes per reconcile (target 0)"
        )
    finally:
        if op:
            op.stop()
        cp.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
