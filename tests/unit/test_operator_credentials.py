"""Reading credentials as kubectl does: a kubeconfig's current context (merged files, relative paths, token
files, credential plugins) or the pod's ServiceAccount, with a clear error for what cannot log in."""

from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path

import pytest
import yaml

from tandem.operator.runtime.credentials import LoginError, from_kubeconfig, in_cluster


def kubeconfig(path: Path, user: dict, current: str = "c", cluster: dict | None = None) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "current-context": current,
                "clusters": [{"name": "k", "cluster": cluster or {"server": "https://api:6443"}}],
                "users": [{"name": "u", "user": user}],
                "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u", "namespace": "team"}}],
            }
        )
    )
    return path


def test_a_token_and_a_ca_path_relative_to_the_kubeconfig(tmp_path):
    (tmp_path / "sub").mkdir()
    cfg = kubeconfig(
        tmp_path / "sub" / "config",
        {"token": "t0k"},
        cluster={"server": "https://api:6443", "certificate-authority": "ca.crt"},
    )
    info = from_kubeconfig([cfg])
    assert info.server == "https://api:6443" and info.default_namespace == "team"
    assert info.ca_path == str(tmp_path / "sub" / "ca.crt")
    assert info.as_http_headers() == {"Authorization": "Bearer t0k"}


def test_merged_files_the_first_to_name_an_entry_wins(tmp_path):
    first = kubeconfig(tmp_path / "a", {"token": "first"})
    second = kubeconfig(tmp_path / "b", {"token": "second"})
    assert from_kubeconfig([first, second]).token == "first"
    assert from_kubeconfig([second, first]).token == "second"
    # the first current-context met wins, even one that no file defines
    missing = kubeconfig(tmp_path / "c", {"token": "x"}, current="missing")
    with pytest.raises(LoginError, match="no current context"):
        from_kubeconfig([missing, first])


def test_a_token_file_and_client_certificate_data(tmp_path):
    (tmp_path / "tok").write_text("from-file\n")
    info = from_kubeconfig(
        [
            kubeconfig(
                tmp_path / "config",
                {"tokenFile": "tok", "client-certificate-data": "Q0VSVA==", "client-key-data": "S0VZ"},
            )
        ]
    )
    assert info.token == "from-file"
    assert (info.certificate_data, info.private_key_data) == ("Q0VSVA==", "S0VZ")


def plugin(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "plugin.py"
    script.write_text(f"#!{sys.executable}\nimport json, os, sys\n{body}\n")
    script.chmod(0o755)
    return script


def test_a_credential_plugin_runs_with_its_env_and_exec_info(tmp_path):
    plugin(
        tmp_path,
        "info = json.loads(os.environ['KUBERNETES_EXEC_INFO'])\n"
        "assert info['spec']['interactive'] is False, info\n"
        "print(json.dumps({'kind': 'ExecCredential', 'status': {'token': os.environ['TEAM'] + sys.argv[1],"
        " 'expirationTimestamp': '2030-01-02T03:04:05Z'}}))",
    )
    exec_ = {
        "apiVersion": "client.authentication.k8s.io/v1",
        "command": "./plugin.py",  # relative to the kubeconfig, as client-go runs it
        "args": ["-42"],
        "env": [{"name": "TEAM", "value": "blue"}],
    }
    info = from_kubeconfig([kubeconfig(tmp_path / "config", {"exec": exec_})])
    assert info.token == "blue-42"
    assert info.expiration == dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=dt.UTC)


def test_a_failing_plugin_is_a_login_error_with_its_words(tmp_path):
    script = plugin(tmp_path, "sys.stderr.write('please run sso login'); sys.exit(3)")
    with pytest.raises(LoginError, match="exited 3: please run sso login"):
        from_kubeconfig([kubeconfig(tmp_path / "config", {"exec": {"command": str(script)}})])
    script = plugin(tmp_path, "print('{}')")
    with pytest.raises(LoginError, match="neither a token nor a client certificate"):
        from_kubeconfig([kubeconfig(tmp_path / "config", {"exec": {"command": str(script)}})])


def test_an_auth_provider_without_a_token_says_what_to_use(tmp_path):
    cfg = kubeconfig(tmp_path / "config", {"auth-provider": {"name": "oidc", "config": {}}})
    with pytest.raises(LoginError, match="credential plugin"):
        from_kubeconfig([cfg])


def test_the_pods_service_account(tmp_path):
    (tmp_path / "token").write_text("sa-token\n")
    (tmp_path / "namespace").write_text("serving")
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    info = in_cluster(tmp_path, env)
    assert info is not None
    assert (info.server, info.token, info.default_namespace) == (
        "https://10.0.0.1:443",
        "sa-token",
        "serving",
    )
    assert info.ca_path == str(tmp_path / "ca.crt")
    assert info.expiration is not None  # the kubelet rotates the token: it is read again
    assert (
        in_cluster(tmp_path, {**env, "KUBERNETES_SERVICE_HOST": "fd00::1"}).server == "https://[fd00::1]:443"
    )
    assert in_cluster(tmp_path, {}) is None
    assert in_cluster(tmp_path / "absent", env) is None


def test_the_operator_process_never_loads_the_generated_client(tmp_path):
    """kopf imports the kubernetes package when it can; the operator keeps it out (about 50 MB of RSS)."""
    import subprocess

    code = (
        "import sys\n"
        "from tandem.operator.__main__ import main\n"
        f"rc = main(['--check', '--kubeconfig', {str(tmp_path / 'absent')!r}])\n"
        "print(json.dumps({'rc': rc, 'loaded': sys.modules.get('kubernetes') is not None}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", "import json\n" + code], capture_output=True, text=True, timeout=120
    )
    assert json.loads(out.stdout.splitlines()[-1]) == {"rc": 2, "loaded": False}, out.stderr
    assert "No such file" in out.stderr
