"""Warm workers change role on a running `tandem up` stack, over real gRPC sockets with mutual TLS: under a
steady stream of requests a prefill worker becomes a decode worker and the decode worker a prefill worker
(so KV now flows the other way between the two processes), then both go back, and not one request fails.
SetRole from an identity that is not the operator's (or the worker's own pod) is refused, and a worker
that follows a pod's role label file takes the role it names."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import grpc
import httpx
import pytest
import yaml

from tandem import flip_cli, names
from tandem.operator.local.flip import dial_worker
from tandem.operator.local.scale import LocalPools
from tandem.operator.local.stack import free_port_block, serving
from tandem.spec import parse_object
from tandem.v1 import common_pb2, decode_pb2_grpc, lifecycle_pb2, lifecycle_pb2_grpc
from tests.integration.stacks import load, spec
from tests.integration.test_drain_scaling import StreamingLoad

pytestmark = pytest.mark.slow
SERVICE = "flip"


def _kv_bytes_pushed(pools: LocalPools, name: str) -> float:
    """KV bytes a worker pushed as a prefill worker (its metrics port, the prefill pool's series)."""
    (p,) = [p for p in pools.stack.plans if p.name == name]
    text = httpx.get(f"http://{p.address.rsplit(':', 1)[0]}:{p.metrics_port}/metrics", timeout=5).text
    prefix = f'{names.KV_TRANSFER_BYTES_TOTAL}{{pool="prefill",service="{SERVICE}",'  # every transport
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(prefix))


def _flip(pools: LocalPools, to_role: str, name: str) -> None:
    (flipped,) = pools.flip_workers([name], to_role, reason="test")
    report = load(flipped)
    assert flipped.role == to_role and report.role == (
        common_pb2.WORKER_ROLE_DECODE if to_role == "decode" else common_pb2.WORKER_ROLE_PREFILL
    )


def _until(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


@pytest.mark.timeout(900)
def test_workers_flip_both_ways_under_load_and_no_request_fails(tiny_model_dir, tmp_path: Path):
    obj = spec(SERVICE, tiny_model_dir, prefill=2, decode=1, prefillChunkTokens=32)
    obj["spec"]["roleFlip"] = True
    svc = parse_object(obj)
    base = free_port_block(8)
    with serving(svc, tmp_path, port=base, worker_port=base + 2) as (stack, url):
        pools = LocalPools(stack, svc, Path.cwd(), tmp_path / "workers.json")
        tls_root = tmp_path / "tls"
        with StreamingLoad(url, clients=3) as stream:
            _until(lambda: stream.ok >= 3, 60, "traffic before the flips")
            _flip(pools, "decode", "prefill-1")  # now two decode workers
            assert {p.name for p in pools.members("decode")} == {"decode-0", "prefill-1"}
            _flip(pools, "prefill", "decode-0")  # the only decode worker is the flipped prefill one
            pushed = _kv_bytes_pushed(pools, "decode-0")
            ok = stream.ok
            # the router routes by the new roles: decode-0 prefills and pushes KV to prefill-1, the other way
            _until(
                lambda: _kv_bytes_pushed(pools, "decode-0") > pushed and stream.ok >= ok + 6,
                120,
                "requests served with decode-0 prefilling for prefill-1",
            )
            _flip(pools, "decode", "decode-0")  # and back
            _flip(pools, "prefill", "prefill-1")
            ok = stream.ok
            _until(lambda: stream.ok >= ok + 6, 120, "requests served after flipping back")
        # the router's own identity (or anything but the operator's, from another pod) may not flip a worker
        (p,) = [p for p in pools.members("decode")]
        with (
            dial_worker(p.address, "decode", SERVICE, tls_root, as_role="router") as chan,
            pytest.raises(grpc.RpcError) as err,
        ):
            lifecycle_pb2_grpc.LifecycleServiceStub(chan).SetRole(
                lifecycle_pb2.SetRoleRequest(role=common_pb2.WORKER_ROLE_PREFILL), timeout=10
            )
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED, err.value
        assert load(p).role == common_pb2.WORKER_ROLE_DECODE
        # `tandem flip -f SPEC --log-dir RUN`: a user flips one more prefill worker of the running stack
        spec_file = tmp_path / "flip.yaml"
        spec_file.write_text(yaml.safe_dump(obj))
        assert (
            flip_cli.main(
                ["--to", "decode", "-f", str(spec_file), "--log-dir", str(tmp_path), "--count", "1"]
            )
            == 0
        )
        listed = json.loads((tmp_path / "workers.json").read_text())
        assert len(listed["decode"]) == 2 and len(listed["prefill"]) == 1, listed
        assert (
            httpx.post(
                f"{url}/v1/completions",
                json={"model": "tiny", "prompt": "after the CLI", "max_tokens": 4},
                timeout=60,
            ).status_code
            == 200
        )
        pools.close()
    assert stream.failures == [], (
        f"{len(stream.failures)} failed of {stream.ok + len(stream.failures)}: {stream.failures[:5]}"
    )
    assert stream.ok >= 15


@pytest.mark.timeout(600)
def test_a_worker_whose_certificate_names_one_role_refuses_to_flip(tiny_model_dir, tmp_path: Path):
    svc = parse_object(spec("oneway", tiny_model_dir))  # roleFlip off: one role per certificate
    base = free_port_block(8)
    with serving(svc, tmp_path, port=base, worker_port=base + 2) as (stack, _):
        (p,) = [p for p in stack.plans if p.role == "prefill"]
        with (
            dial_worker(p.address, "prefill", "oneway", tmp_path / "tls") as chan,
            pytest.raises(grpc.RpcError) as err,
        ):
            lifecycle_pb2_grpc.LifecycleServiceStub(chan).SetRole(
                lifecycle_pb2.SetRoleRequest(role=common_pb2.WORKER_ROLE_DECODE), timeout=10
            )
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "certificate does not name" in (err.value.details() or "")
        assert load(p).role == common_pb2.WORKER_ROLE_PREFILL


@pytest.mark.timeout(300)
def test_a_pod_takes_the_role_its_label_file_names_at_start_and_whenever_it_changes(
    tiny_model_dir, tmp_path: Path
):
    """What a Kubernetes pod does with spec.roleFlip: the kubelet writes its labels to a downward-API file,
    and the worker (a real process, its own flippable certificate) takes the role the label names: at start
    (a pod flipped before it restarted) and when the operator moves the label."""
    from tandem.operator.certs import write_local

    certs = write_local(tmp_path / "tls", "pod", ("prefill", "decode", "router"), flippable=True)
    labels = tmp_path / "labels"
    labels.write_text(
        f'{names.LABEL_POOL}="prefill"\n{names.LABEL_ROLE}="decode"\n'
    )  # flipped before a restart
    port = free_port_block(2)
    argv = [
        sys.executable,
        "-m",
        "tandem",
        "worker",
        "--role",
        "prefill",
        "--model-dir",
        str(tiny_model_dir),
        "--service",
        "pod",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--num-kv-blocks",
        "64",
        "--threads",
        "1",
        "--tls-dir",
        str(certs / "prefill"),
        "--role-file",
        str(labels),
    ]
    log = tmp_path / "worker.log"
    proc = subprocess.Popen(argv, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    try:
        _until(
            lambda: "READY" in log.read_text(errors="replace") or proc.poll() is not None, 120, "worker READY"
        )
        assert proc.poll() is None, log.read_text()

        def role() -> int:
            with dial_worker(f"127.0.0.1:{port}", "decode", "pod", certs) as chan:  # the operator's identity
                return decode_pb2_grpc.DecodeServiceStub(chan).Load(common_pb2.LoadRequest(), timeout=5).role

        assert role() == common_pb2.WORKER_ROLE_DECODE  # its label's role, not its command line's
        labels.write_text(
            f'{names.LABEL_POOL}="prefill"\n{names.LABEL_ROLE}="prefill"\n'
        )  # the operator flips it back
        _until(lambda: role() == common_pb2.WORKER_ROLE_PREFILL, 30, "the worker follows its label")
        assert f"{names.LABEL_ROLE} label" in log.read_text()
    finally:
        proc.kill()
        proc.wait()


def _prompt_tokens(pools: LocalPools, name: str, pool: str) -> float:
    """Prompt tokens a worker prefilled while it served `pool` (its metrics port)."""
    (p,) = [p for p in pools.stack.plans if p.name == name]
    text = httpx.get(f"http://{p.address.rsplit(':', 1)[0]}:{p.metrics_port}/metrics", timeout=5).text
    prefix = f'{names.PREFILL_TOKENS_TOTAL}{{pool="{pool}",service="{COLOCATED_SERVICE}"}}'
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(prefix))


COLOCATED_SERVICE = "cflip"


@pytest.mark.timeout(900)
def test_a_decode_worker_becomes_colocated_and_back_under_load_and_no_request_fails(
    tiny_model_dir, tmp_path: Path
):
    """A warm decode worker takes the colocated role (SetRole; over mutual TLS, its certificate names every
    worker role): the router moves it to its colocated pool and runs whole requests there beside the split
    pools, then it goes back to decode; not one request fails."""
    obj = spec(COLOCATED_SERVICE, tiny_model_dir, prefill=1, decode=2, prefillChunkTokens=32)
    obj["spec"]["roleFlip"] = True
    svc = parse_object(obj)
    base = free_port_block(8)
    with serving(svc, tmp_path, port=base, worker_port=base + 2) as (stack, url):
        pools = LocalPools(stack, svc, Path.cwd(), tmp_path / "workers.json")
        with StreamingLoad(url, clients=3) as stream:
            _until(lambda: stream.ok >= 3, 60, "traffic before the flips")
            (flipped,) = pools.flip_workers(["decode-1"], "colocated", reason="test")
            assert flipped.role == "colocated" and load(flipped).role == common_pb2.WORKER_ROLE_COLOCATED
            assert {p.name for p in pools.members("colocated")} == {"decode-1"}
            assert json.loads((tmp_path / "workers.json").read_text())["colocated"] == [flipped.address]
            ok = stream.ok
            _until(
                lambda: _prompt_tokens(pools, "decode-1", "colocated") > 0 and stream.ok >= ok + 6,
                120,
                "whole requests served on the colocated worker",
            )
            (back,) = pools.flip_workers(["decode-1"], "decode", reason="test")
            assert load(back).role == common_pb2.WORKER_ROLE_DECODE and not pools.members("colocated")
            ok = stream.ok
            _until(lambda: stream.ok >= ok + 6, 120, "requests served after flipping back")
        pools.close()
    assert stream.failures == [], (
        f"{len(stream.failures)} failed of {stream.ok + len(stream.failures)}: {stream.failures[:5]}"
    )
