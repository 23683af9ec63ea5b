"""`tandem up`'s plan: which processes, on which ports, with arguments the real command parsers accept."""

from __future__ import annotations

from pathlib import Path

import pytest

from tandem.operator.local.plan import plan, workers_document
from tandem.spec import parse_object
from tandem.worker.router.main import build_parser, check_args
from tandem.worker.serve.main import parse_args as parse_worker_args


def _svc(mode: str = "disaggregated", source: dict | None = None, prefill: int = 2, decode: int = 1):
    return parse_object(
        {
            "apiVersion": "serving.tandem.dev/v1alpha1",
            "kind": "InferenceService",
            "metadata": {"name": "demo"},
            "spec": {
                "model": {
                    "source": source or {"path": "models/tiny"},
                    "servedName": "tiny",
                    "dtype": "float32",
                },
                "mode": mode,
                "decode": {"replicas": decode, "resources": {"gpus": 0}},
                **(
                    {}
                    if mode == "colocated"
                    else {  # colocated refuses the settings it ignores
                        "prefill": {"replicas": prefill, "resources": {"gpus": 0}},
                        "kvTransfer": {"transport": "grpc"},
                    }
                ),
            },
        }
    )


def test_disaggregated_plan_has_each_pool_and_a_router_that_knows_them():
    procs = plan(_svc(), Path("/srv"), port=9000, first_worker_port=9100, cpus=6)
    assert [p.name for p in procs] == ["prefill-0", "prefill-1", "decode-0", "router"]
    ports = [p.address for p in procs]
    assert len(set(ports)) == len(ports)
    workers = [parse_worker_args(p.argv[4:]) for p in procs[:-1]]
    assert [w.role for w in workers] == ["prefill", "prefill", "decode"]
    assert all(
        w.model_dir == "/srv/models/tiny" and w.threads == 2 and w.kv_transport == "grpc" for w in workers
    )  # 6 cores / 3
    router = build_parser().parse_args(procs[-1].argv[4:])
    assert check_args(router) is None
    assert router.prefill == [procs[0].address, procs[1].address] and router.decode == [procs[2].address]
    assert workers_document(procs)["prefill"] == router.prefill


def test_colocated_plan_and_workers_file():
    procs = plan(_svc("colocated", decode=2), Path("/srv"), workers_file=Path("/tmp/w.json"))
    assert [p.role for p in procs] == ["colocated", "colocated", "router"]
    router = build_parser().parse_args(procs[-1].argv[4:])
    assert router.mode == "colocated" and router.workers_file == "/tmp/w.json" and router.colocated == []


def test_sources_the_local_backend_cannot_serve_are_refused():
    with pytest.raises(ValueError, match="path or hostPath"):
        plan(_svc(source={"pvc": {"claimName": "models"}}), Path("/srv"))
