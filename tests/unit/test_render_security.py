"""Security switches of the spec, rendered: API keys from a mounted Secret, and the same for `tandem up`."""

from __future__ import annotations

from pathlib import Path

import pytest

from tandem import names
from tandem.operator import render
from tandem.operator.local import plan as local_plan
from tandem.spec import InferenceService, InferenceServiceSpec

ROOT = Path(__file__).resolve().parents[2]


def _spec(**security) -> InferenceServiceSpec:
    return InferenceServiceSpec.model_validate(
        {"model": {"source": {"path": "/m"}, "servedName": "m"}, "security": security}
    )


def _router(spec: InferenceServiceSpec) -> dict:
    return render.router_deployment(spec, "llama", "ml", "u")["spec"]["template"]


def _flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def test_no_api_keys_by_default():
    pod = _router(_spec())
    assert "--api-keys-file" not in pod["spec"]["containers"][0]["args"]
    assert all(v["name"] != "api-keys" for v in pod["spec"].get("volumes", []))


def test_api_keys_secret_is_mounted_and_named_to_the_router():
    pod = _router(_spec(apiKeys={"secretName": "llama-keys", "key": "keys.txt", "protectMetrics": True}))
    (container,) = pod["spec"]["containers"]
    path = _flag(container["args"], "--api-keys-file")
    assert path == f"{render.API_KEYS_MOUNT}/keys.txt" and "--protect-metrics" in container["args"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "api-keys"]
    assert mount["readOnly"] and path.startswith(mount["mountPath"] + "/")
    (vol,) = [v for v in pod["spec"]["volumes"] if v["name"] == "api-keys"]
    assert vol["secret"]["secretName"] == "llama-keys"
    # the probes the kubelet runs never need a key
    assert container["readinessProbe"]["httpGet"]["path"] == names.READINESS_PATH


def test_api_keys_need_a_source():
    with pytest.raises(ValueError, match="secretName"):
        _spec(apiKeys={"key": "k"})


def test_local_backend_reads_the_keys_file(tmp_path):
    svc = InferenceService(name="s", spec=_spec(apiKeys={"file": "keys.txt"}))
    (router,) = [p for p in local_plan.plan(svc, tmp_path, workers_file=tmp_path / "w.json") if p.role == "router"]
    assert _flag(router.argv, "--api-keys-file") == str(tmp_path / "keys.txt")
    with pytest.raises(ValueError, match="Secret"):
        local_plan.plan(InferenceService(name="s", spec=_spec(apiKeys={"secretName": "x"})), tmp_path)


def _worker(spec: InferenceServiceSpec, pool: str = names.POOL_DECODE) -> dict:
    return render.worker_deployment(spec, "llama", "ml", "u", pool, 1)["spec"]["template"]


def test_tls_secret_is_mounted_in_every_pod_and_named_to_every_process():
    spec = _spec(tls={"secretName": "llama-tls", "serverName": "llama-workers.ml.svc"})
    for pod in (_worker(spec, names.POOL_PREFILL), _worker(spec, names.POOL_DECODE), _router(spec)):
        (container,) = pod["spec"]["containers"]
        assert _flag(container["args"], "--tls-dir") == render.TLS_MOUNT
        assert _flag(container["args"], "--tls-server-name") == "llama-workers.ml.svc"
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == "tls"]
        assert mount == {"name": "tls", "mountPath": render.TLS_MOUNT, "readOnly": True}
        (vol,) = [v for v in pod["spec"]["volumes"] if v["name"] == "tls"]
        assert vol["secret"]["secretName"] == "llama-tls"


def test_the_kubelet_probes_a_plaintext_health_only_port_with_timeouts_tls_or_not():
    for spec in (_spec(), _spec(tls={"secretName": "t"})):
        container = _worker(spec)["spec"]["containers"][0]
        assert _flag(container["args"], "--health-port") == str(names.HEALTH_PORT)
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert container[probe]["grpc"]["port"] == names.HEALTH_PORT
            assert 1 <= container[probe]["timeoutSeconds"] <= container[probe]["periodSeconds"]
        assert container["livenessProbe"]["grpc"]["service"] == names.WORKER_LIVENESS_SERVICE


def test_local_backend_passes_the_tls_dir_to_every_process(tmp_path):
    svc = InferenceService(name="s", spec=_spec(tls={"dir": "certs"}))
    procs = local_plan.plan(svc, tmp_path, workers_file=tmp_path / "w.json")
    assert {p.role for p in procs} == {"prefill", "decode", "router"}
    assert all(_flag(p.argv, "--tls-dir") == str(tmp_path / "certs") for p in procs)
