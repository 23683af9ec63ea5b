"""Security switches of the spec, rendered: API keys from a mounted Secret, and the same for `tandem up`."""

from __future__ import annotations

from pathlib import Path

import pytest

from tandem import names
from tandem.operator.local import plan as local_plan
from tandem.operator.manifests import pod_tls, render
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
    (router,) = [
        p for p in local_plan.plan(svc, tmp_path, workers_file=tmp_path / "w.json") if p.role == "router"
    ]
    assert _flag(router.argv, "--api-keys-file") == str(tmp_path / "keys.txt")
    with pytest.raises(ValueError, match="Secret"):
        local_plan.plan(InferenceService(name="s", spec=_spec(apiKeys={"secretName": "x"})), tmp_path)


def _worker(spec: InferenceServiceSpec, pool: str = names.POOL_DECODE) -> dict:
    return render.worker_deployment(spec, "llama", "ml", "u", pool, 1)["spec"]["template"]


def test_mutual_tls_is_on_by_default_and_each_pod_mounts_only_its_roles_certificate():
    spec = _spec()
    for pool, pod in (
        (names.POOL_PREFILL, _worker(spec, names.POOL_PREFILL)),
        (names.POOL_DECODE, _worker(spec, names.POOL_DECODE)),
        (names.POOL_ROUTER, _router(spec)),
    ):
        (container,) = pod["spec"]["containers"]
        assert _flag(container["args"], "--tls-dir") == pod_tls.TLS_MOUNT
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == "tls"]
        assert mount == {"name": "tls", "mountPath": pod_tls.TLS_MOUNT, "readOnly": True}
        (vol,) = [v for v in pod["spec"]["volumes"] if v["name"] == "tls"]
        assert vol["secret"]["secretName"] == pod_tls.tls_secret_name("llama")
        assert {i["key"]: i["path"] for i in vol["secret"]["items"]} == {
            f"{pool}.crt": "tls.crt",
            f"{pool}.key": "tls.key",
            "ca.crt": "ca.crt",
        }


def test_the_pre_stop_drain_asks_for_its_own_roles_certificate():
    (container,) = _worker(_spec(), names.POOL_DECODE)["spec"]["containers"]
    drain = container["lifecycle"]["preStop"]["exec"]["command"]
    assert _flag(drain, "--tls-dir") == pod_tls.TLS_MOUNT
    assert _flag(drain, "--tls-server-name") == "decode.llama.tandem.internal"


def test_cert_manager_secrets_are_mounted_per_role():
    spec = _spec(tls={"secretName": "llama-certs"})
    for pool, pod in (
        (names.POOL_PREFILL, _worker(spec, names.POOL_PREFILL)),
        (names.POOL_ROUTER, _router(spec)),
    ):
        (vol,) = [v for v in pod["spec"]["volumes"] if v["name"] == "tls"]
        assert vol["secret"] == {"secretName": f"llama-certs-{pool}", "defaultMode": 0o440}


@pytest.mark.parametrize("off", [{"mode": "off"}, False, "off"])
def test_tls_off_is_plaintext_and_mounts_nothing(off):
    spec = _spec(tls=off)
    assert not spec.security.tls.enabled
    for pod in (_worker(spec), _router(spec)):
        (container,) = pod["spec"]["containers"]
        assert "--tls-dir" not in container["args"]
        assert all(v["name"] != "tls" for v in pod["spec"].get("volumes", []))
    with pytest.raises(ValueError, match="mode off"):
        _spec(tls={"mode": "off", "secretName": "x"})


def test_the_kubelet_probes_a_plaintext_health_only_port_with_timeouts_tls_or_not():
    for spec in (_spec(), _spec(tls="off")):
        container = _worker(spec)["spec"]["containers"][0]
        assert _flag(container["args"], "--health-port") == str(names.HEALTH_PORT)
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert container[probe]["grpc"]["port"] == names.HEALTH_PORT
            assert 1 <= container[probe]["timeoutSeconds"] <= container[probe]["periodSeconds"]
        assert container["livenessProbe"]["grpc"]["service"] == names.WORKER_LIVENESS_SERVICE


def test_local_backend_gives_every_process_its_roles_folder(tmp_path):
    svc = InferenceService(name="s", spec=_spec(tls={"dir": "certs"}))
    root = local_plan.local_tls_root(svc, tmp_path, None)
    procs = local_plan.plan(svc, tmp_path, workers_file=tmp_path / "w.json", tls_root=root)
    assert {p.role for p in procs} == {"prefill", "decode", "router"}
    assert all(_flag(p.argv, "--tls-dir") == str(tmp_path / "certs" / p.role) for p in procs)
    default = InferenceService(name="s", spec=_spec())
    assert local_plan.local_tls_root(default, tmp_path, tmp_path / "run") == tmp_path / "run" / "tls"
    assert (
        local_plan.local_tls_root(InferenceService(name="s", spec=_spec(tls="off")), tmp_path, None) is None
    )
