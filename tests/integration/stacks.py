"""Local stacks for end-to-end tests: real router and worker processes on loopback, from a spec."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import httpx

from tandem.operator.local.plan import ProcessPlan
from tandem.operator.local.scale import WorkerChannels
from tandem.operator.local.stack import free_port_block, serving
from tandem.spec import parse_object
from tandem.v1 import common_pb2, decode_pb2_grpc, prefill_pb2_grpc
from tests.prometheus import Target


def spec(
    name: str, model_dir: Path, mode: str = "disaggregated", prefill: int = 1, decode: int = 1, **engine
) -> dict:
    pools = {"decode": {"replicas": decode, "resources": {"gpus": 0}}}
    if mode != "colocated":  # colocated's one pool is spec.decode; a prefill setting is refused
        pools["prefill"] = {"replicas": prefill, "resources": {"gpus": 0}}
    return {
        "apiVersion": "serving.tandem.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": {
            "model": {
                "source": {"path": str(model_dir)},
                "servedName": "tiny",
                "dtype": "float32",
                "maxContextLength": 4096,
            },
            "mode": mode,
            **pools,
            "engine": {"blockSize": 16, "numKvBlocks": 512, "threads": 1, **engine},
        },
    }


def greedy_tokens(url: str, prompt: str, n: int = 24, timeout_s: float = 120) -> list[str]:
    """The `n` tokens (as the logprobs list names them) of a greedy completion of `prompt`, ignoring EOS."""
    r = httpx.post(
        f"{url}/v1/completions",
        json={
            "model": "tiny",
            "prompt": prompt,
            "max_tokens": n,
            "temperature": 0,
            "ignore_eos": True,
            "logprobs": 1,
        },
        timeout=timeout_s,
    )
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == n
    return r.json()["choices"][0]["logprobs"]["tokens"]


def metric(url: str, name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels`, scraped from `url`/metrics."""
    total = 0.0
    for line in httpx.get(f"{url}/metrics", timeout=5).text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


@contextmanager
def running_stack(obj: dict, log_dir: Path):
    base = free_port_block(24)
    with serving(parse_object(obj), log_dir, port=base, worker_port=base + 2) as running:
        yield running


_CHANNELS = WorkerChannels()  # kept across calls: one TLS handshake per worker, not per load report


def _stub(p: ProcessPlan):
    stub = prefill_pb2_grpc.PrefillServiceStub if p.role == "prefill" else decode_pb2_grpc.DecodeServiceStub
    return stub(_CHANNELS.get(p))


def load(p: ProcessPlan) -> common_pb2.LoadReport:
    """A worker's load report, asked with the stack's own identity."""
    return _stub(p).Load(common_pb2.LoadRequest(), timeout=5)


def worker_info(p: ProcessPlan) -> common_pb2.WorkerInfo:
    """What a worker says of itself at a handshake (its KV layout, its transports)."""
    return _stub(p).Handshake(common_pb2.HandshakeRequest(), timeout=5).worker


def metrics_targets(stack, service: str, namespace: str = "default") -> list[Target]:
    """Prometheus targets for a running local stack: the router's /metrics on its HTTP port and each
    worker's metrics port, labelled the way the chart's PodMonitor labels pods (namespace, pod, and the
    service and pool it relabels from the pod's labels, which `up` carries too)."""
    out = []
    for p in stack.plans:
        host = p.address.rsplit(":", 1)[0]
        address = p.address if p.role == "router" else f"{host}:{p.metrics_port}"
        out.append(
            Target(address, {"namespace": namespace, "pod": p.name, "service": service, "pool": p.role})
        )
    return out
