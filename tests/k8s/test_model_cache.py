"""A Hugging Face source on the real control plane: the worker pod's start, reported as a kubelet would (the
`fetch-model` init container running, then done with its outcome, the worker started, Ready), shows up as the
ModelCached condition with the fetch's progress and as the pool's cold start phase by phase in status; the
model's max_position_embeddings the fetch read, below the spec's maxContextLength, shows as Degraded.

The worker pod runs on a node kwok does not manage, so the test writes its status the way the kubelet would;
the scheduler, the Deployment controller and the operator are the real ones."""

from __future__ import annotations

import datetime as dt
import json

import pytest
import yaml

from tandem import names
from tests.k8s.conftest import get_json, wait_for

SERVICE = "hf"
NODE = "manual-node"
SPEC = {
    "apiVersion": "serving.tandem.dev/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": SERVICE},
    "spec": {
        "mode": "colocated",
        "model": {
            "servedName": "m",
            "source": {"huggingFace": {"repoId": "org/tiny"}},
            "maxContextLength": 1000000,
        },
        "decode": {"replicas": 1, "nodeSelector": {"kubernetes.io/hostname": NODE}},
    },
}


def _iso(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.fixture(scope="module")
def manual_node(control_plane):
    """A node no kwok manages: Ready, with GPUs, its pods' status written by the test."""
    capacity = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "8"}
    control_plane.kubectl(
        "apply",
        "-f",
        "-",
        input=yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": NODE,
                    "labels": {"kubernetes.io/hostname": NODE, "kubernetes.io/os": "linux"},
                },
            }
        ),
    )
    now = _iso(dt.datetime.now(dt.UTC))
    control_plane.kubectl(
        "patch",
        "node",
        NODE,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(
            {
                "status": {
                    "capacity": capacity,
                    "allocatable": capacity,
                    "conditions": [
                        {
                            "type": "Ready",
                            "status": "True",
                            "reason": "KubeletReady",
                            "message": "test",
                            "lastHeartbeatTime": now,
                            "lastTransitionTime": now,
                        }
                    ],
                }
            }
        ),
    )
    control_plane.kubectl("taint", "nodes", NODE, "node.kubernetes.io/not-ready:NoSchedule-", check=False)
    yield NODE
    control_plane.kubectl("delete", "node", NODE, "--wait=false", check=False)


def _condition(obj: dict | None, ctype: str) -> dict:
    return next(
        (c for c in ((obj or {}).get("status") or {}).get("conditions") or [] if c["type"] == ctype), {}
    )


def _worker_pod(cp, namespace: str) -> dict | None:
    pods = (
        get_json(
            cp,
            "pods",
            "-l",
            f"{names.LABEL_SERVICE}={SERVICE},{names.LABEL_POOL}=colocated",
            namespace=namespace,
        )
        or {}
    ).get("items") or []
    scheduled = [p for p in pods if p["spec"].get("nodeName") == NODE]
    return scheduled[0] if scheduled else None


def _kubelet_status(cp, namespace: str, pod: str, status: dict) -> None:
    cp.kubectl(
        "patch",
        "pod",
        pod,
        "-n",
        namespace,
        "--subresource=status",
        "--type=strategic",
        "-p",
        json.dumps({"status": status}),
    )


def test_model_cached_and_the_cold_start_phases_reach_status(control_plane, operator, namespace, manual_node):
    cp = control_plane
    cp.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(SPEC))
    pod = wait_for(lambda: _worker_pod(cp, namespace), 60, "the worker pod scheduled onto the test's node")
    name = pod["metadata"]["name"]
    created = dt.datetime.fromisoformat(pod["metadata"]["creationTimestamp"].replace("Z", "+00:00"))
    at = {
        k: _iso(created + dt.timedelta(seconds=s))
        for k, s in {"init": 3, "fetched": 20, "main": 21, "ready": 30}.items()
    }

    # the kubelet started the fetch: ModelCached says which pod fetches and for how long
    _kubelet_status(
        cp,
        namespace,
        name,
        {
            "phase": "Pending",
            "initContainerStatuses": [
                {
                    "name": "fetch-model",
                    "image": "x",
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": at["init"]}},
                }
            ],
        },
    )
    fetching = wait_for(
        lambda: (
            (o := get_json(cp, "tsvc", SERVICE, namespace=namespace))
            and ((o["status"].get("modelCache") or {}).get("colocated") or {}).get("fetching") == 1
            and o
        ),
        60,
        "status.modelCache: the colocated pod fetching",
    )
    cached = _condition(fetching, "ModelCached")
    assert (cached["status"], cached["reason"]) == ("False", "Fetching"), cached
    assert "1 fetching, the longest for" in cached["message"]

    # the fetch downloaded the model, the worker loaded it and turned Ready
    report = {
        "cache": "miss",
        "files": 5,
        "bytes": 3 << 20,
        "seconds": 17.0,
        "waited_seconds": 0.0,
        "commit": "c",
        "max_position_embeddings": 131072,
    }
    _kubelet_status(
        cp,
        namespace,
        name,
        {
            "phase": "Running",
            "conditions": [
                {"type": "Initialized", "status": "True", "lastTransitionTime": at["fetched"]},
                {"type": "ContainersReady", "status": "True", "lastTransitionTime": at["ready"]},
                {"type": "Ready", "status": "True", "lastTransitionTime": at["ready"]},
            ],
            "initContainerStatuses": [
                {
                    "name": "fetch-model",
                    "image": "x",
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "state": {
                        "terminated": {
                            "exitCode": 0,
                            "reason": "Completed",
                            "startedAt": at["init"],
                            "finishedAt": at["fetched"],
                            "message": json.dumps(report),
                        }
                    },
                }
            ],
            "containerStatuses": [
                {
                    "name": "worker",
                    "image": "x",
                    "imageID": "",
                    "ready": True,
                    "restartCount": 0,
                    "started": True,
                    "state": {"running": {"startedAt": at["main"]}},
                }
            ],
        },
    )
    done = wait_for(
        lambda: (
            (o := get_json(cp, "tsvc", SERVICE, namespace=namespace))
            and "colocated" in (o["status"].get("coldStart") or {})
            and o
        ),
        90,
        "status.coldStart of the colocated pool",
    )
    last = done["status"]["coldStart"]["colocated"]["last"]
    assert last["pod"] == name and last["cache"] == "miss"
    assert (last["fetchedSeconds"], last["loadedSeconds"], last["totalSeconds"]) == (17.0, 9.0, 30.0)
    assert (
        last["scheduledSeconds"] + last["pulledSeconds"] == 3.0
    )  # created -> scheduled -> the fetch started
    assert done["status"]["coldStart"]["colocated"]["medians"]["miss"]["count"] == 1
    pool = done["status"]["modelCache"]["colocated"]
    assert (pool["cached"], pool["misses"], pool["bytes"]) == (1, 1, 3 << 20)
    # the model's own limit, below the spec's: Degraded with both numbers, and the pool still counts as
    # serving
    assert pool["maxPositionEmbeddings"] == 131072
    degraded = wait_for(
        lambda: (
            (o := get_json(cp, "tsvc", SERVICE, namespace=namespace))
            and _condition(o, "Degraded").get("reason") == "ContextExceedsModel"
            and o
        ),
        60,
        "Degraded ContextExceedsModel",
    )
    assert _condition(degraded, "Degraded")["status"] == "True"
    assert (
        "maxContextLength 1000000 exceeds the model's max_position_embeddings 131072"
        in _condition(degraded, "Degraded")["message"]
    )
    # the router's pod fetches on a kwok node: ModelCached turns True once every pod has the model
    final = wait_for(
        lambda: (
            (o := get_json(cp, "tsvc", SERVICE, namespace=namespace))
            and _condition(o, "ModelCached").get("status") == "True"
            and o
        ),
        90,
        "ModelCached True",
    )
    assert _condition(final, "ModelCached")["reason"] == "Cached"
    assert _condition(final, "ModelCached")["message"].startswith("2/2 pods have the model")
